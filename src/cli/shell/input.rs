//! What the user types: lines assembled into messages and commands, and where lines come
//! from (a line editor on a terminal, plain lines from a pipe).

use std::io::BufRead;
use std::path::{Path, PathBuf};

/// Opens and closes a block that is sent as one message, whatever its lines hold.
const FENCE: &str = "\"\"\"";

/// One complete thing the user entered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Input {
    /// Text for the model.
    Message(String),
    /// A `/command` line (with its arguments), not yet parsed.
    Command(String),
}

/// A complete input and the form it is kept in the history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// What was entered.
    pub input: Input,
    /// One history entry that, recalled and entered again, gives the same input.
    pub history: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Idle,
    /// The last line ended with `\`.
    Continued,
    /// Inside a `"""` block.
    Block,
}

/// Joins lines into inputs: a line ending in `\` continues on the next, and the lines
/// between two `"""` lines are one message.
#[derive(Debug)]
pub struct Assembler {
    mode: Mode,
    lines: Vec<String>,
}

impl Default for Assembler {
    fn default() -> Self {
        Self { mode: Mode::Idle, lines: vec![] }
    }
}

impl Assembler {
    /// True while an input is incomplete (the prompt says so).
    pub fn pending(&self) -> bool {
        self.mode != Mode::Idle
    }

    /// Drops an incomplete input (Ctrl-C at the prompt).
    pub fn cancel(&mut self) {
        self.mode = Mode::Idle;
        self.lines.clear();
    }

    /// Takes the next line; returns an input once one is complete. Blank inputs are dropped.
    pub fn push(&mut self, line: &str) -> Option<Entry> {
        let line = line.strip_suffix('\r').unwrap_or(line);
        match self.mode {
            Mode::Block => {
                let Some(before) = line.trim_end().strip_suffix(FENCE) else {
                    self.lines.push(line.to_string());
                    return None;
                };
                if !before.trim().is_empty() {
                    self.lines.push(before.to_string());
                }
                self.finish_block()
            }
            Mode::Idle if line.trim_start().starts_with(FENCE) => {
                let rest = &line.trim_start()[FENCE.len()..];
                // A recalled history entry holds the whole block on one line.
                if let Some(inner) = rest.trim_end().strip_suffix(FENCE) {
                    let inner = inner.strip_prefix('\n').unwrap_or(inner);
                    self.lines.push(inner.strip_suffix('\n').unwrap_or(inner).to_string());
                    return self.finish_block();
                }
                self.mode = Mode::Block;
                if !rest.trim().is_empty() {
                    self.lines.push(rest.to_string());
                }
                None
            }
            Mode::Idle | Mode::Continued => match line.trim_end().strip_suffix('\\') {
                Some(head) => {
                    self.lines.push(head.to_string());
                    self.mode = Mode::Continued;
                    None
                }
                None => {
                    self.lines.push(line.to_string());
                    self.finish_text()
                }
            },
        }
    }

    /// The end of the input: an incomplete input is taken as it stands.
    pub fn finish(&mut self) -> Option<Entry> {
        match self.mode {
            Mode::Idle => None,
            Mode::Continued => self.finish_text(),
            Mode::Block => self.finish_block(),
        }
    }

    fn finish_text(&mut self) -> Option<Entry> {
        let text = self.lines.join("\n");
        self.cancel();
        let text = text.trim();
        if text.is_empty() {
            return None;
        }
        let input = if text.starts_with('/') { Input::Command(text.to_string()) } else { Input::Message(text.to_string()) };
        Some(Entry { input, history: text.to_string() })
    }

    fn finish_block(&mut self) -> Option<Entry> {
        let text = self.lines.join("\n");
        self.cancel();
        if text.trim().is_empty() {
            return None;
        }
        let history = format!("{FENCE}\n{text}\n{FENCE}");
        Some(Entry { input: Input::Message(text), history })
    }
}

/// A shell command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// List the commands.
    Help,
    /// Leave the shell.
    Exit,
    /// Forget the conversation (the system prompt stays).
    Reset,
    /// Show the system prompt, or set it.
    System(Option<String>),
    /// Figures of the last reply and of the session.
    Stats,
    /// Write the conversation and the figures as JSON.
    Save(PathBuf),
    /// Switch thinking between shown in full and a one-line summary.
    Think,
}

/// Why a command line is not a command.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CommandError {
    /// No such command.
    #[error("unknown command `/{0}` (type /help for the commands)")]
    Unknown(String),
    /// The command's arguments are wrong.
    #[error("usage: {0}")]
    Usage(&'static str),
}

/// What `/help` prints.
pub const HELP: &str = "\
commands:
  /system [TEXT]  show the system prompt, or set it to TEXT
  /reset          forget the conversation (the system prompt stays)
  /think          show thinking in full, or as a one-line summary
  /stats          speed and token counts of the last reply and of the session
  /save FILE      write the conversation and the figures to FILE as JSON
  /help           this list
  /exit           leave (as does Ctrl-D)
input:
  a line ending in \\ continues on the next line
  lines between two lines of \"\"\" are sent as one message
  Ctrl-C stops a reply; at the prompt it clears the line";

/// Parses a line starting with `/`.
pub fn parse_command(text: &str) -> Result<Command, CommandError> {
    let body = text.trim().strip_prefix('/').unwrap_or(text.trim());
    let (name, rest) = match body.find(char::is_whitespace) {
        Some(i) => (&body[..i], body[i..].trim()),
        None => (body, ""),
    };
    let bare = |c: Command, usage: &'static str| if rest.is_empty() { Ok(c) } else { Err(CommandError::Usage(usage)) };
    match name {
        "help" | "?" => bare(Command::Help, "/help"),
        "exit" | "quit" => bare(Command::Exit, "/exit"),
        "reset" | "clear" => bare(Command::Reset, "/reset"),
        "stats" => bare(Command::Stats, "/stats"),
        "think" => bare(Command::Think, "/think"),
        "system" => Ok(Command::System((!rest.is_empty()).then(|| rest.to_string()))),
        "save" if rest.is_empty() => Err(CommandError::Usage("/save FILE")),
        "save" => Ok(Command::Save(PathBuf::from(rest))),
        other => Err(CommandError::Unknown(other.to_string())),
    }
}

/// One read from the user.
#[derive(Debug)]
pub enum Read {
    /// A line (without its newline).
    Line(String),
    /// Ctrl-C at the prompt.
    Interrupted,
    /// Ctrl-D or the end of the input.
    Eof,
}

/// Where lines come from.
pub enum Lines {
    /// A line editor with history, on a terminal.
    Editor {
        /// The editor.
        editor: Box<rustyline::DefaultEditor>,
        /// The history file (`None`: history is kept for this session only).
        history: Option<PathBuf>,
    },
    /// Plain lines, from a pipe or a file: no prompt is shown.
    Plain(Box<dyn BufRead>),
}

impl Lines {
    /// A line editor whose history lives in `history` (created on first save).
    pub fn editor(history: Option<PathBuf>) -> Result<Lines, rustyline::error::ReadlineError> {
        let config = rustyline::Config::builder().auto_add_history(false).max_history_size(2000)?.build();
        let mut editor = rustyline::DefaultEditor::with_config(config)?;
        if let Some(path) = &history {
            // A missing file is the first run; an unreadable one only costs the recall.
            if path.exists() {
                if let Err(e) = editor.load_history(path) {
                    tracing::warn!("cannot read the shell history {}: {e}", path.display());
                }
            }
        }
        Ok(Lines::Editor { editor: Box::new(editor), history })
    }

    /// Lines of standard input, read as they arrive.
    pub fn stdin() -> Lines {
        Lines::Plain(Box::new(std::io::BufReader::new(std::io::stdin())))
    }

    /// Reads one line, showing `prompt` on a terminal.
    pub fn read(&mut self, prompt: &str) -> std::io::Result<Read> {
        use rustyline::error::ReadlineError;
        match self {
            Lines::Editor { editor, .. } => match editor.readline(prompt) {
                Ok(line) => Ok(Read::Line(line)),
                Err(ReadlineError::Interrupted) => Ok(Read::Interrupted),
                Err(ReadlineError::Eof) => Ok(Read::Eof),
                Err(ReadlineError::Io(e)) => Err(e),
                Err(e) => Err(std::io::Error::other(e.to_string())),
            },
            Lines::Plain(reader) => {
                let mut line = String::new();
                if reader.read_line(&mut line)? == 0 {
                    return Ok(Read::Eof);
                }
                let line = line.strip_suffix('\n').unwrap_or(&line);
                Ok(Read::Line(line.to_string()))
            }
        }
    }

    /// Records an entry in the history (and its file, so a crash loses nothing).
    pub fn remember(&mut self, entry: &str) {
        let Lines::Editor { editor, history } = self else { return };
        if editor.add_history_entry(entry).is_err() {
            return;
        }
        if let Some(path) = history {
            if let Err(e) = save_history(editor, path) {
                tracing::warn!("cannot write the shell history {}: {e}", path.display());
                *history = None;
            }
        }
    }
}

fn save_history(editor: &mut rustyline::DefaultEditor, path: &Path) -> Result<(), rustyline::error::ReadlineError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    editor.append_history(path)
}

/// The history file: `$XDG_STATE_HOME/ft-actor/shell_history`, else under `~/.local/state`.
pub fn default_history_file() -> Option<PathBuf> {
    let state = std::env::var_os("XDG_STATE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local").join("state")))?;
    Some(state.join("ft-actor").join("shell_history"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(lines: &[&str]) -> Vec<Entry> {
        let mut a = Assembler::default();
        let mut out: Vec<Entry> = lines.iter().filter_map(|l| a.push(l)).collect();
        out.extend(a.finish());
        out
    }

    fn inputs(lines: &[&str]) -> Vec<Input> {
        feed(lines).into_iter().map(|e| e.input).collect()
    }

    fn msg(s: &str) -> Input {
        Input::Message(s.to_string())
    }

    #[test]
    fn single_lines_are_messages_or_commands() {
        assert_eq!(inputs(&["  hello  ", "", "   ", "/stats", "a / b"]), [msg("hello"), Input::Command("/stats".into()), msg("a / b")]);
    }

    #[test]
    fn backslash_continues_the_line() {
        let mut a = Assembler::default();
        assert_eq!(a.push("first \\"), None);
        assert!(a.pending());
        assert_eq!(a.push("second\\  "), None);
        let e = a.push("third\r").unwrap();
        assert_eq!(e.input, msg("first \nsecond\nthird"));
        assert!(!a.pending());
        // A continued command keeps its newlines (a multi-line system prompt).
        assert_eq!(inputs(&["/system be \\", "brief"]), [Input::Command("/system be \nbrief".into())]);
    }

    #[test]
    fn fenced_block_is_one_message() {
        let e = feed(&["\"\"\"", "/not a command", "", "  indented \\", "\"\"\"", "after"]);
        assert_eq!(e[0].input, msg("/not a command\n\n  indented \\"));
        assert_eq!(e[1].input, msg("after"));
        assert_eq!(inputs(&["\"\"\"first", "last\"\"\""]), [msg("first\nlast")]);
        assert_eq!(inputs(&["\"\"\"one line\"\"\""]), [msg("one line")]);
        assert_eq!(inputs(&["\"\"\"", "  ", "\"\"\""]), []);
    }

    #[test]
    fn history_entries_give_back_the_same_input() {
        for lines in [&["\"\"\"", "/x", "y", "\"\"\""][..], &["a \\", "b"], &["/system s"]] {
            let e = feed(lines).remove(0);
            let mut a = Assembler::default();
            let again = a.push(&e.history).or_else(|| a.finish()).unwrap();
            assert_eq!(again.input, e.input, "{lines:?}");
        }
    }

    #[test]
    fn incomplete_input_at_the_end_or_cancelled() {
        assert_eq!(inputs(&["\"\"\"", "unclosed"]), [msg("unclosed")]);
        assert_eq!(inputs(&["dangling \\"]), [msg("dangling")]);
        let mut a = Assembler::default();
        a.push("\"\"\"");
        a.push("dropped");
        a.cancel();
        assert_eq!(a.push("kept"), Some(Entry { input: msg("kept"), history: "kept".into() }));
    }

    #[test]
    fn commands_parse() {
        assert_eq!(parse_command("/help"), Ok(Command::Help));
        assert_eq!(parse_command("/quit"), Ok(Command::Exit));
        assert_eq!(parse_command("/reset"), Ok(Command::Reset));
        assert_eq!(parse_command("/stats"), Ok(Command::Stats));
        assert_eq!(parse_command("/think"), Ok(Command::Think));
        assert_eq!(parse_command("/system"), Ok(Command::System(None)));
        assert_eq!(parse_command("/system  Be brief.\nReally. "), Ok(Command::System(Some("Be brief.\nReally.".into()))));
        assert_eq!(parse_command("/save out dir/chat.json"), Ok(Command::Save("out dir/chat.json".into())));
        assert_eq!(parse_command("/save"), Err(CommandError::Usage("/save FILE")));
        assert_eq!(parse_command("/stats now"), Err(CommandError::Usage("/stats")));
        assert_eq!(parse_command("/frobnicate x"), Err(CommandError::Unknown("frobnicate".into())));
        assert!(CommandError::Unknown("x".into()).to_string().contains("/help"));
    }
}
