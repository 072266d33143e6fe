//! One generation as the APIs see it: engine tokens → parsed output → a finish.
//!
//! [`Run`] owns the engine's [`GenerationStream`]; dropping a `Run` (a client that went
//! away drops its response body) cancels the generation in the engine.

use super::parsers::{OutputParser, Parsed, ParserOptions, ToolCall};
use super::{errors::prompt_too_long, ApiError, AppState};
use crate::engine::{Completion, EngineRequest, GenEvent, GenerationStream};
use crate::engine::FinishReason;
use crate::sampling::SamplingParams;
use std::collections::VecDeque;
use std::time::Duration;

/// What a request asks the engine for, after validation.
#[derive(Clone, Debug)]
pub struct GenParams {
    /// Prompt ids.
    pub prompt: Vec<u32>,
    /// The client's limit on new tokens (`None`: the server default or the context).
    pub max_tokens: Option<usize>,
    /// Sampling.
    pub sampling: SamplingParams,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Do not stop at end-of-sequence ids.
    pub ignore_eos: bool,
    /// Output parsing.
    pub parser: ParserOptions,
    /// Report each token's log-probability and this many alternatives'.
    pub logprobs: Option<usize>,
    /// What the output must match, and the request field that asked for it.
    pub grammar: Option<(crate::sampling::grammar::GrammarSpec, &'static str)>,
}

/// One generated token's log-probability as the APIs report it.
#[derive(Clone, Debug, PartialEq)]
pub struct LogprobEntry {
    /// The token's text.
    pub token: String,
    /// `log p(token)`.
    pub logprob: f32,
    /// The most likely tokens at that step, best first.
    pub top: Vec<(String, f32)>,
}

impl LogprobEntry {
    /// OpenAI chat's shape: `{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}`.
    pub fn chat_json(&self) -> serde_json::Value {
        let one = |t: &str, l: f32| serde_json::json!({"token": t, "logprob": l, "bytes": t.as_bytes()});
        let mut v = one(&self.token, self.logprob);
        v["top_logprobs"] = self.top.iter().map(|(t, l)| one(t, *l)).collect();
        v
    }
}

/// Why a generation ended, in API-neutral terms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Finish {
    /// The model ended its turn.
    Stop,
    /// The token limit (or the context) was reached.
    Length,
    /// A stop string matched (which one, when it can be told).
    StopSequence(Option<String>),
}

/// Token counts of a finished generation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt: usize,
    /// Of which reused from earlier requests.
    pub cached: usize,
    /// Generated tokens.
    pub completion: usize,
}

/// The end of a generation.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// Why it ended.
    pub finish: Finish,
    /// Token counts.
    pub usage: Usage,
    /// Tool calls made.
    pub tool_calls: usize,
}

/// One step of a run.
#[derive(Debug)]
pub enum Step {
    /// New output.
    Output(Vec<Parsed>),
    /// Nothing new for a while (a stream sends a keep-alive).
    Idle,
    /// The generation ended.
    Done(Outcome),
    /// The generation failed after it started.
    Failed(ApiError),
}

/// A generation in progress.
pub struct Run {
    stream: GenerationStream,
    parser: OutputParser,
    state: AppState,
    stop: Vec<String>,
    /// Raw text emitted by the engine (to tell which stop string matched).
    raw_len: usize,
    ids: Vec<u32>,
    queue: VecDeque<Step>,
    ended: bool,
    idle: Option<Duration>,
    /// Log-probabilities of tokens not yet taken by the response.
    logprobs: Vec<LogprobEntry>,
}

/// Everything a non-streaming response needs.
pub struct Collected {
    /// Output in order, adjacent pieces of one kind merged.
    pub items: Vec<Parsed>,
    /// The finish.
    pub outcome: Outcome,
    /// Every generated token's log-probability, if asked for.
    pub logprobs: Vec<LogprobEntry>,
}

impl Collected {
    /// All reasoning text.
    pub fn reasoning(&self) -> String {
        self.items.iter().filter_map(|p| if let Parsed::Reasoning(t) = p { Some(t.as_str()) } else { None }).collect()
    }
    /// All visible text.
    pub fn text(&self) -> String {
        self.items.iter().filter_map(|p| if let Parsed::Text(t) = p { Some(t.as_str()) } else { None }).collect()
    }
    /// The tool calls.
    pub fn calls(&self) -> Vec<&ToolCall> {
        self.items.iter().filter_map(|p| if let Parsed::ToolCall(c) = p { Some(c) } else { None }).collect()
    }
}

impl Run {
    /// Validates the limits and submits the request to the engine.
    pub async fn start(state: &AppState, p: GenParams) -> Result<Run, ApiError> {
        let context = state.engine.info().context;
        if p.prompt.is_empty() {
            return Err(ApiError::invalid("prompt", "the prompt is empty"));
        }
        if p.prompt.len() >= context {
            return Err(prompt_too_long(p.prompt.len(), context));
        }
        p.sampling.validate().map_err(|e| ApiError::invalid(sampling_param(&e), e.to_string()))?;
        let constraint = match p.grammar {
            None => None,
            Some((spec, param)) => Some(state.engine.compile_grammar(spec).await.map_err(|e| match e {
                crate::engine::EngineError::InvalidRequest(m) => ApiError::invalid(param, m),
                e => ApiError::from(e),
            })?),
        };
        let room = context - p.prompt.len();
        // The operator's limit clamps whatever a client asks (agents ask for tens of thousands).
        let limit = state.settings.max_tokens_limit.unwrap_or(room);
        let max_tokens = p.max_tokens.or(state.settings.default_max_tokens).unwrap_or(room).min(room).min(limit);
        let req = EngineRequest {
            prompt: p.prompt,
            max_tokens,
            sampling: p.sampling,
            stop: p.stop.clone(),
            stop_ids: vec![],
            ignore_eos: p.ignore_eos,
            return_logits: false,
            logprobs: p.logprobs,
            constraint,
            keep_special_tokens: p.parser.markup == crate::server::parsers::ToolMarkup::Harmony && !p.parser.raw,
        };
        let stream = state.engine.generate(req).await?;
        let idle = (state.settings.keepalive_secs > 0).then(|| Duration::from_secs(state.settings.keepalive_secs));
        Ok(Run {
            stream,
            parser: OutputParser::new(p.parser),
            state: state.clone(),
            stop: p.stop,
            raw_len: 0,
            ids: vec![],
            queue: VecDeque::new(),
            ended: false,
            idle,
            logprobs: vec![],
        })
    }

    /// The next step; `None` after `Done` or `Failed`.
    pub async fn next(&mut self) -> Option<Step> {
        loop {
            if let Some(s) = self.queue.pop_front() {
                return Some(s);
            }
            if self.ended {
                return None;
            }
            let ev = match self.idle {
                Some(d) => match tokio::time::timeout(d, self.stream.next()).await {
                    Ok(ev) => ev,
                    Err(_) => return Some(Step::Idle),
                },
                None => self.stream.next().await,
            };
            let mut out = vec![];
            match ev {
                Some(GenEvent::Token { id, text, logprobs, .. }) => {
                    if let Some(lp) = logprobs {
                        let tok = &self.state.tokenizer;
                        let text_of = |id: u32| tok.decode(&[id], false).unwrap_or_default();
                        let top = lp.top.iter().map(|&(i, l)| (text_of(i), l)).collect();
                        self.logprobs.push(LogprobEntry { token: text_of(id), logprob: lp.logprob, top });
                    }
                    self.ids.push(id);
                    self.raw_len += text.len();
                    self.parser.push(&text, &mut out);
                    if !out.is_empty() {
                        return Some(Step::Output(out));
                    }
                }
                Some(GenEvent::Done(c)) => {
                    self.ended = true;
                    self.parser.finish(&mut out);
                    if !out.is_empty() {
                        self.queue.push_back(Step::Output(out));
                    }
                    let outcome = self.outcome(c).await;
                    self.state.metrics.record_generation(&outcome.usage);
                    self.queue.push_back(Step::Done(outcome));
                }
                Some(GenEvent::Error(e)) => {
                    self.ended = true;
                    return Some(Step::Failed(ApiError::from(e)));
                }
                None => {
                    self.ended = true;
                    return Some(Step::Failed(ApiError::internal("the engine ended the generation without a result")));
                }
            }
        }
    }

    /// Log-probabilities of the tokens since the last call (for a stream's next chunk).
    pub fn take_logprobs(&mut self) -> Vec<LogprobEntry> {
        std::mem::take(&mut self.logprobs)
    }

    /// Runs to the end and gathers the output.
    pub async fn collect(mut self) -> Result<Collected, ApiError> {
        let mut items: Vec<Parsed> = vec![];
        while let Some(step) = self.next().await {
            match step {
                Step::Output(out) => {
                    for p in out {
                        match (items.last_mut(), p) {
                            (Some(Parsed::Text(a)), Parsed::Text(b)) | (Some(Parsed::Reasoning(a)), Parsed::Reasoning(b)) => a.push_str(&b),
                            (_, p) => items.push(p),
                        }
                    }
                }
                Step::Idle => {}
                Step::Done(outcome) => return Ok(Collected { items, outcome, logprobs: self.take_logprobs() }),
                Step::Failed(e) => return Err(e),
            }
        }
        Err(ApiError::internal("the generation ended without a result"))
    }

    async fn outcome(&mut self, c: Completion) -> Outcome {
        let finish = match c.finish {
            FinishReason::Eos => Finish::Stop,
            FinishReason::Length => Finish::Length,
            FinishReason::StopString => Finish::StopSequence(self.matched_stop().await),
        };
        Outcome {
            finish,
            usage: Usage { prompt: c.prompt_tokens, cached: c.cached_tokens, completion: c.completion_tokens },
            tool_calls: self.parser.tool_calls(),
        }
    }

    /// Which stop string ended the output: the engine withholds it, so it is what the
    /// decoded tokens hold right after the emitted text.
    async fn matched_stop(&mut self) -> Option<String> {
        if self.stop.len() == 1 {
            return self.stop.first().cloned();
        }
        let (tok, ids, stops, from) = (self.state.tokenizer.clone(), std::mem::take(&mut self.ids), self.stop.clone(), self.raw_len);
        tokio::task::spawn_blocking(move || {
            let full = tok.decode(&ids, true).ok()?;
            let rest = full.get(from..)?;
            let mut hits: Vec<(usize, &String)> = stops.iter().filter_map(|s| rest.find(s.as_str()).map(|i| (i, s))).collect();
            hits.sort_by_key(|(i, s)| (*i, usize::MAX - s.len()));
            hits.first().map(|(_, s)| (*s).clone())
        })
        .await
        .ok()
        .flatten()
    }
}

fn sampling_param(e: &crate::sampling::SamplingError) -> &'static str {
    use crate::sampling::SamplingError::*;
    match e {
        Temperature(_) => "temperature",
        TopP(_) => "top_p",
        MinP(_) => "min_p",
        RepetitionPenalty(_) => "repetition_penalty",
        Penalty(name, _) => name,
        LogitBias(..) => "logit_bias",
    }
}

pub use crate::sampling::SamplingOverrides;

