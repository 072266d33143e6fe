//! `ft-actor shell`: a chat with the model in the terminal.
//!
//! The engine runs in-process, as for `generate`. Each turn renders the whole conversation
//! with the model's chat template (as `serve` does) and the engine's prefix reuse restores
//! the state of the turns before, so a turn prefills little more than its new message.
//! Reading input blocks the main thread; only the replies run on the runtime.

mod display;
mod input;
mod session;

use super::{runtime, ModelArgs};
use crate::chat::{ChatRequest, ChatTemplate};
use crate::engine::{EngineHandle, EngineRequest, FinishReason, GenEvent};
use crate::model::generation_config::GenerationConfig;
use crate::sampling::SamplingParams;
use crate::server::parsers::{OutputParser, Parsed, ParserOptions, ToolMarkup};
use crate::server::{opens_think, ModelFormat, ServerSettings};
use crate::tokenizer::Tokenizer;
use anyhow::{bail, Context, Result};
use clap::Args;
use display::{Display, Thinking};
use input::{Assembler, Command, Input, Lines, Read};
use session::{Conversation, Message, ReplyStats, Role, SessionStats};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::watch;

/// Arguments of `shell`.
#[derive(Args, Debug)]
pub struct ShellArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// System prompt (`/system` changes it).
    #[arg(long)]
    system: Option<String>,
    /// Most new tokens per reply (fewer when the context is nearly full).
    #[arg(long, default_value_t = 1024)]
    max_tokens: usize,
    #[command(flatten)]
    sampling: super::SamplingArgs,
    /// Ask the chat template to skip thinking (templates with an `enable_thinking` switch).
    #[arg(long)]
    no_think: bool,
    /// Show thinking as a one-line summary from the start (`/think` switches).
    #[arg(long)]
    collapse_thinking: bool,
    /// History file (default: $XDG_STATE_HOME/ft-actor/shell_history).
    #[arg(long)]
    history: Option<PathBuf>,
    /// Keep no history file.
    #[arg(long, conflicts_with = "history")]
    no_history: bool,
}

/// `shell`.
pub fn run(a: ShellArgs) -> Result<()> {
    let rt = runtime()?;
    let engine = rt.block_on(a.model.start())?;
    let result = Shell::new(&rt, engine.clone(), &a).and_then(|mut shell| shell.run(&a));
    rt.block_on(engine.shutdown());
    result
}

/// Ctrl-C stops the reply being generated; at other times it ends the shell as usual.
struct Interrupt {
    generating: AtomicBool,
    /// Counts the Ctrl-Cs taken during replies; a reply watches for the next one only, so a
    /// press that lands as a reply ends cannot stop the reply after it.
    stops: watch::Sender<u64>,
}

impl Interrupt {
    /// Listens for Ctrl-C for the rest of the process.
    fn listen(self: &Arc<Self>, rt: &tokio::runtime::Runtime) {
        let me = self.clone();
        rt.spawn(async move {
            while tokio::signal::ctrl_c().await.is_ok() {
                if me.generating.load(Ordering::SeqCst) {
                    me.stops.send_modify(|n| *n += 1);
                } else {
                    // Taking the signal replaced its default action, which was this.
                    std::process::exit(130);
                }
            }
        });
    }
}

/// Marks a reply in progress until dropped.
struct Generating<'a>(&'a Interrupt);

impl<'a> Generating<'a> {
    fn start(i: &'a Interrupt) -> Self {
        i.generating.store(true, Ordering::SeqCst);
        Generating(i)
    }
}

impl Drop for Generating<'_> {
    fn drop(&mut self) {
        self.0.generating.store(false, Ordering::SeqCst);
    }
}

/// What a command asks of the loop.
#[derive(PartialEq, Eq)]
enum Flow {
    Continue,
    Exit,
}

struct Shell<'r> {
    rt: &'r tokio::runtime::Runtime,
    engine: EngineHandle,
    tok: Arc<Tokenizer>,
    template: ChatTemplate,
    format: ModelFormat,
    sampling: SamplingParams,
    max_tokens: usize,
    enable_thinking: Option<bool>,
    /// Terminal escapes are allowed on stdout.
    ansi: bool,
    thinking: Thinking,
    conv: Conversation,
    last: Option<ReplyStats>,
    session: SessionStats,
    interrupt: Arc<Interrupt>,
    model_name: String,
}

impl<'r> Shell<'r> {
    fn new(rt: &'r tokio::runtime::Runtime, engine: EngineHandle, a: &ShellArgs) -> Result<Self> {
        let info = engine.info();
        let tok = engine.tokenizer().cloned().context("the shell needs the model's tokenizer (tokenizer.json)")?;
        let template = ChatTemplate::from_tokenizer(&tok).context("the shell needs the model's chat template")?;
        let format = ModelFormat::detect(&tok, Some(&template), &ServerSettings::default());
        let overrides = a.sampling.overrides();
        let sampling = overrides.apply(&GenerationConfig::from_dir(&info.model_dir)?.sampling());
        sampling.validate()?;
        let model_name = match &a.model.model {
            None => "the built-in demo model".to_string(),
            Some(_) => info.model_dir.file_name().map_or_else(|| info.model_dir.display().to_string(), |n| n.to_string_lossy().into_owned()),
        };
        let interrupt = Arc::new(Interrupt { generating: AtomicBool::new(false), stops: watch::channel(0).0 });
        interrupt.listen(rt);
        Ok(Self {
            rt,
            tok,
            template,
            format,
            sampling,
            max_tokens: a.max_tokens.max(1),
            enable_thinking: a.no_think.then_some(false),
            ansi: std::io::stdin().is_terminal() && std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none(),
            thinking: if a.collapse_thinking { Thinking::Summary } else { Thinking::Full },
            conv: Conversation { system: a.system.clone(), messages: vec![] },
            last: None,
            session: SessionStats::default(),
            interrupt,
            model_name,
            engine,
        })
    }

    /// Reads and answers until `/exit`, Ctrl-D or the end of the input.
    fn run(&mut self, a: &ShellArgs) -> Result<()> {
        let mut lines = if std::io::stdin().is_terminal() {
            let history = if a.no_history { None } else { a.history.clone().or_else(input::default_history_file) };
            eprintln!("ft-actor shell · {} · /help for commands, Ctrl-D to quit", self.model_name);
            if a.model.model.is_none() {
                eprintln!("(the demo model has random weights: it streams tokens, not language)");
            }
            Lines::editor(history).context("cannot start the line editor")?
        } else {
            Lines::stdin()
        };
        let mut asm = Assembler::default();
        let mut ended = false;
        while !ended {
            let prompt = if asm.pending() { "... " } else { ">>> " };
            let entry = match lines.read(prompt).context("cannot read the input")? {
                Read::Line(line) => asm.push(&line),
                Read::Interrupted => {
                    asm.cancel();
                    None
                }
                Read::Eof => {
                    ended = true;
                    asm.finish()
                }
            };
            let Some(entry) = entry else { continue };
            lines.remember(&entry.history);
            match entry.input {
                Input::Message(text) => self.turn(text),
                Input::Command(line) => match input::parse_command(&line) {
                    Ok(c) => {
                        if self.command(c) == Flow::Exit {
                            break;
                        }
                    }
                    Err(e) => eprintln!("{e}"),
                },
            }
        }
        Ok(())
    }

    fn command(&mut self, c: Command) -> Flow {
        match c {
            Command::Help => println!("{}", input::HELP),
            Command::Exit => return Flow::Exit,
            Command::Reset => {
                self.conv.messages.clear();
                println!("conversation cleared (the system prompt stays)");
            }
            Command::System(None) => match &self.conv.system {
                Some(s) => println!("system prompt: {s}"),
                None => println!("no system prompt (set one with /system TEXT)"),
            },
            Command::System(Some(s)) => {
                self.conv.system = Some(s);
                println!("system prompt set");
            }
            Command::Think => {
                self.thinking = match self.thinking {
                    Thinking::Full => Thinking::Summary,
                    Thinking::Summary => Thinking::Full,
                };
                println!("thinking: {}", if self.thinking == Thinking::Full { "shown in full" } else { "one-line summary" });
            }
            Command::Stats => {
                let stats = self.rt.block_on(self.engine.stats()).ok();
                let hit_rate = stats.filter(|s| s.cache_slots > 0 && s.total.hits + s.total.misses > 0).map(|s| s.total.hit_rate());
                println!("{}", session::stats_text(self.last.as_ref(), &self.session, hit_rate));
            }
            Command::Save(path) => {
                let json = session::saved_json(&self.model_name, &self.conv, self.last.as_ref(), &self.session);
                let written = serde_json::to_string_pretty(&json).map_err(std::io::Error::other).and_then(|s| std::fs::write(&path, s + "\n"));
                match written {
                    Ok(()) => println!("saved {} messages to {}", self.conv.messages.len(), path.display()),
                    Err(e) => eprintln!("error: cannot write {}: {e}", path.display()),
                }
            }
        }
        Flow::Continue
    }

    /// One user message and the model's reply; a failure costs the turn, not the shell.
    fn turn(&mut self, text: String) {
        self.conv.messages.push(Message { role: Role::User, content: text, reasoning: None });
        let turns = self.conv.messages.len();
        match self.rt.block_on(self.reply()) {
            Ok(Some((message, stats))) => {
                self.conv.messages.push(message);
                self.session.add(&stats);
                self.last = Some(stats);
            }
            Ok(None) => self.conv.messages.truncate(turns - 1),
            Err(e) => {
                self.conv.messages.truncate(turns - 1);
                eprintln!("error: {e:#}");
            }
        }
    }

    /// Generates the reply to the conversation, streaming it; `None` when it was stopped
    /// before it said anything.
    async fn reply(&self) -> Result<Option<(Message, ReplyStats)>> {
        let request = ChatRequest {
            messages: self.conv.template_messages(),
            add_generation_prompt: true,
            enable_thinking: self.enable_thinking,
            ..Default::default()
        };
        let rendered = self.template.render(&request)?;
        let prompt = self.tok.encode(&rendered, false).context("cannot tokenize the conversation")?;
        let context = self.engine.info().context;
        if prompt.len() >= context {
            bail!("the conversation has {} tokens and the context holds {context}: /reset to start over", prompt.len());
        }
        let prompt_len = prompt.len();
        let harmony = self.format.markup == ToolMarkup::Harmony;
        let mut parser = OutputParser::new(ParserOptions {
            reasoning: self.format.reasoning,
            start_in_reasoning: self.format.reasoning && opens_think(&rendered),
            markup: self.format.markup,
            ..Default::default()
        });
        let req = EngineRequest {
            sampling: self.sampling.clone(),
            keep_special_tokens: harmony,
            ..EngineRequest::greedy(prompt, self.max_tokens.min(context - prompt_len))
        };
        tracing::debug!(prompt_tokens = prompt_len, "shell turn");
        let mut stops = self.interrupt.stops.subscribe();
        let _generating = Generating::start(&self.interrupt);
        let started = Instant::now();
        let mut first_token = None;
        let mut stream = self.engine.generate(req).await?;
        let mut display = Display::new(std::io::stdout(), self.ansi, self.thinking);
        let (mut text, mut reasoning, mut generated) = (String::new(), String::new(), 0usize);
        let mut pieces = vec![];
        let completion = loop {
            let ev = tokio::select! {
                ev = stream.next() => ev,
                _ = stops.changed() => {
                    stream.cancel();
                    break None;
                }
            };
            match ev {
                Some(GenEvent::Token { text: t, .. }) => {
                    first_token.get_or_insert_with(Instant::now);
                    generated += 1;
                    parser.push(&t, &mut pieces);
                }
                Some(GenEvent::Done(c)) => break Some(c),
                Some(GenEvent::Error(e)) => {
                    display.finish(false)?;
                    bail!("generation failed: {e}");
                }
                None => bail!("the engine ended the reply without a result"),
            }
            show(&mut display, pieces.drain(..), &mut text, &mut reasoning)?;
            display.token()?;
        };
        // A stopped reply keeps what the parser still held back.
        parser.finish(&mut pieces);
        show(&mut display, pieces.drain(..), &mut text, &mut reasoning)?;
        display.finish(completion.is_none())?;
        let mut stats = match &completion {
            Some(c) => {
                let finish = if c.finish == FinishReason::Length { "length" } else { "stop" };
                ReplyStats::new(c.prompt_tokens, c.cached_tokens, c.completion_tokens, c.time_to_first_token, c.total_time, finish)
            }
            None => {
                let ttft = first_token.map_or(started.elapsed(), |t| t - started);
                ReplyStats::new(prompt_len, 0, generated, ttft, started.elapsed(), "interrupted")
            }
        };
        stats.thinking_tokens = display.thinking_tokens();
        if completion.is_none() && text.is_empty() && reasoning.is_empty() {
            return Ok(None);
        }
        let reasoning = (!reasoning.is_empty()).then_some(reasoning);
        Ok(Some((Message { role: Role::Assistant, content: text.trim_end().to_string(), reasoning }, stats)))
    }
}

/// Shows parsed pieces and keeps their text for the conversation.
fn show<W: std::io::Write>(d: &mut Display<W>, pieces: impl Iterator<Item = Parsed>, text: &mut String, reasoning: &mut String) -> std::io::Result<()> {
    for p in pieces {
        match p {
            Parsed::Reasoning(r) => {
                d.reasoning(&r)?;
                reasoning.push_str(&r);
            }
            Parsed::Text(t) => {
                d.text(&t)?;
                text.push_str(&t);
            }
            // No tools are offered, so a call is only text the model wrote in call markup.
            Parsed::ToolCall(c) => {
                let t = format!("{}({})", c.name, c.arguments_json());
                d.text(&t)?;
                text.push_str(&t);
            }
        }
    }
    Ok(())
}
