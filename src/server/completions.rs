//! OpenAI-compatible `/v1/completions` (raw prompts, no chat template).

use super::errors::OpenAiError;
use super::generation::{GenParams, LogprobEntry, Outcome, SamplingOverrides, Usage};
use super::openai::{choice_runs, choices_usage, fingerprint, finish_reason, usage_json, MAX_CHOICES};
use super::parsers::{Parsed, ParserOptions};
use super::prompt::{check_fields, parse_request};
use super::wire::{self, Stop};
use super::{new_id, read_json, sse, unix_now, ApiError, AppState};
use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

#[derive(Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: Option<bool>,
}

/// Fields of a legacy completion request.
const COMPLETION_FIELDS: &[&str] = &[
    "model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "n",
    "stream", "stream_options", "logprobs", "echo", "stop", "presence_penalty", "frequency_penalty", "best_of",
    "logit_bias", "user", "seed", "suffix", "ignore_eos", "skip_special_tokens",
];

#[derive(Deserialize)]
struct CompletionRequest {
    model: Option<String>,
    prompt: Value,
    max_tokens: Option<u32>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i64>,
    min_p: Option<f32>,
    repetition_penalty: Option<f32>,
    n: Option<u32>,
    best_of: Option<u32>,
    #[serde(default)]
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    logprobs: Option<u32>,
    echo: Option<bool>,
    stop: Option<Stop>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    logit_bias: Option<serde_json::Map<String, serde_json::Value>>,
    seed: Option<i64>,
    suffix: Option<String>,
    ignore_eos: Option<bool>,
}

/// OpenAI's documented default for `/v1/completions`.
const COMPLETION_DEFAULT_MAX_TOKENS: usize = 16;

/// `POST /v1/completions`.
pub async fn create(State(state): State<AppState>, body: Body) -> Result<Response, OpenAiError> {
    let body = read_json(&state, body).await?;
    check_fields(&state, &body, COMPLETION_FIELDS, false)?;
    let req: CompletionRequest = parse_request(body)?;
    state.check_model(req.model.as_deref())?;
    let n = req.n.unwrap_or(1);
    if n == 0 || n > MAX_CHOICES {
        return Err(ApiError::invalid("n", format!("n must be between 1 and {MAX_CHOICES}")).into());
    }
    if req.best_of.is_some_and(|b| b != n) {
        return Err(ApiError::invalid("best_of", "best_of must equal n: completions are not ranked").into());
    }
    if req.logprobs.is_some_and(|n| n as usize > crate::sampling::MAX_TOP_LOGPROBS) {
        return Err(ApiError::invalid("logprobs", format!("logprobs must be at most {}", crate::sampling::MAX_TOP_LOGPROBS)).into());
    }
    if req.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::invalid("suffix", "suffix (fill-in-the-middle) is not supported").into());
    }
    let (ids, prompt_text) = completion_prompt(&state, req.prompt).await?;
    let echo = if req.echo.unwrap_or(false) { prompt_text } else { String::new() };
    let params = GenParams {
        prompt: ids,
        max_tokens: Some(wire::max_tokens(req.max_tokens, "max_tokens")?.unwrap_or(COMPLETION_DEFAULT_MAX_TOKENS)),
        sampling: SamplingOverrides {
            temperature: req.temperature,
            top_p: req.top_p,
            top_k: wire::top_k(req.top_k)?,
            min_p: req.min_p,
            repetition_penalty: req.repetition_penalty,
            frequency_penalty: req.frequency_penalty,
            presence_penalty: req.presence_penalty,
            logit_bias: wire::logit_bias(req.logit_bias.as_ref(), state.engine.info().config.vocab_size)?,
            seed: wire::seed(req.seed),
        }
        .apply(&state.sampling),
        stop: Stop::into_vec(req.stop, "stop")?,
        ignore_eos: req.ignore_eos.unwrap_or(false),
        parser: ParserOptions { raw: true, ..Default::default() },
        logprobs: req.logprobs.map(|n| n as usize),
        grammar: None,
    };
    let mut runs = choice_runs(&state, &params, n).await?;
    let id = new_id("cmpl-");
    if req.stream.unwrap_or(false) {
        let usage = req.stream_options.and_then(|o| o.include_usage).unwrap_or(false);
        let enc = |index| CompletionStream::new(id.clone(), state.model_id.clone(), usage, echo.clone(), index, n == 1);
        if n == 1 {
            return Ok(sse::response(runs.remove(0), enc(0)));
        }
        let close = enc(0);
        let encs = (0..runs.len()).map(enc).collect();
        return Ok(sse::response_many(runs, encs, move |outcomes| close.close(usage.then(|| choices_usage(&outcomes)))));
    }
    let (mut choices, mut outcomes) = (vec![], vec![]);
    for (index, run) in runs.into_iter().enumerate() {
        let c = run.collect().await?;
        let text = format!("{echo}{}", c.text());
        let logprobs = if req.logprobs.is_some() { completion_logprobs(&c.logprobs, echo.len()) } else { Value::Null };
        choices.push(json!({"text": text, "index": index, "logprobs": logprobs, "finish_reason": finish_reason(&c.outcome)}));
        outcomes.push(c.outcome);
    }
    Ok(Json(json!({
        "id": id, "object": "text_completion", "created": unix_now(), "model": state.model_id,
        "system_fingerprint": fingerprint(),
        "choices": choices,
        "usage": usage_json(&choices_usage(&outcomes)),
    }))
    .into_response())
}

/// The prompt of a completion: a string or token ids (also as one-element lists).
async fn completion_prompt(state: &AppState, prompt: Value) -> Result<(Vec<u32>, String), ApiError> {
    let bad = || ApiError::invalid("prompt", "expected a string, a list of token ids, or a list with one of either");
    let one = match prompt {
        Value::Array(mut v) if v.len() == 1 && (v[0].is_string() || v[0].is_array()) => v.remove(0),
        Value::Array(v) if v.len() > 1 && v.iter().all(Value::is_string) => {
            return Err(ApiError::invalid("prompt", "only one prompt per request is supported"))
        }
        p => p,
    };
    match one {
        Value::String(s) => {
            let tok = state.tokenizer.clone();
            let text = s.clone();
            let ids = tokio::task::spawn_blocking(move || tok.encode(&text, true))
                .await
                .map_err(|e| ApiError::internal(format!("tokenizer task failed: {e}")))?
                .map_err(|e| ApiError::internal(format!("cannot tokenize the prompt: {e}")))?;
            Ok((ids, s))
        }
        Value::Array(v) => {
            let vocab = state.engine.info().config.vocab_size;
            let ids = v
                .iter()
                .map(|x| x.as_u64().and_then(|n| u32::try_from(n).ok()).filter(|&n| (n as usize) < vocab))
                .collect::<Option<Vec<u32>>>()
                .ok_or_else(|| ApiError::invalid("prompt", format!("token ids must be integers below the vocabulary size {vocab}")))?;
            let tok = state.tokenizer.clone();
            let ids2 = ids.clone();
            let text = tokio::task::spawn_blocking(move || tok.decode(&ids2, false).unwrap_or_default())
                .await
                .unwrap_or_default();
            Ok((ids, text))
        }
        _ => Err(bad()),
    }
}

/// Completion chunks.
struct CompletionStream {
    id: String,
    model: String,
    created: u64,
    usage: bool,
    echo: String,
    /// Log-probabilities for the next chunk.
    logprobs: Vec<LogprobEntry>,
    /// Text offset of the next token.
    offset: usize,
    /// The choice this encoder writes.
    index: usize,
    /// Whether its end closes the stream (not when it is one of several choices).
    closes: bool,
}

/// The legacy completions `logprobs`: parallel lists, the text offsets counted from `offset`.
fn completion_logprobs(entries: &[LogprobEntry], mut offset: usize) -> Value {
    let mut offsets = vec![];
    for e in entries {
        offsets.push(offset);
        offset += e.token.len();
    }
    json!({
        "tokens": entries.iter().map(|e| e.token.as_str()).collect::<Vec<_>>(),
        "token_logprobs": entries.iter().map(|e| e.logprob).collect::<Vec<_>>(),
        "top_logprobs": entries.iter().map(|e| e.top.iter().map(|(t, l)| (t.clone(), json!(l))).collect::<serde_json::Map<_, _>>()).collect::<Vec<_>>(),
        "text_offset": offsets,
    })
}

impl CompletionStream {
    fn new(id: String, model: String, usage: bool, echo: String, index: usize, closes: bool) -> Self {
        let offset = echo.len();
        Self { id, model, created: unix_now(), usage, echo, logprobs: vec![], offset, index, closes }
    }

    /// The events that end the stream: the usage chunk (when asked for) and `[DONE]`.
    fn close(&self, usage: Option<Usage>) -> String {
        let mut s = String::new();
        if let Some(u) = usage {
            let v = json!({
                "id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
                "choices": [], "usage": usage_json(&u),
            });
            s.push_str(&sse::data(&v));
        }
        s.push_str("data: [DONE]\n\n");
        s
    }

    fn chunk(&mut self, text: &str, finish: Option<&str>) -> String {
        let logprobs = if self.logprobs.is_empty() {
            Value::Null
        } else {
            let entries = std::mem::take(&mut self.logprobs);
            let v = completion_logprobs(&entries, self.offset);
            self.offset += entries.iter().map(|e| e.token.len()).sum::<usize>();
            v
        };
        let mut v = json!({
            "id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
            "system_fingerprint": fingerprint(),
            "choices": [{"text": text, "index": self.index, "logprobs": logprobs, "finish_reason": finish}],
        });
        if self.usage {
            v["usage"] = Value::Null;
        }
        sse::data(&v)
    }
}

impl sse::Encoder for CompletionStream {
    fn logprobs(&mut self, entries: Vec<LogprobEntry>) {
        self.logprobs.extend(entries);
    }

    fn start(&mut self) -> String {
        let echo = std::mem::take(&mut self.echo);
        if echo.is_empty() { String::new() } else { self.chunk(&echo, None) }
    }

    fn output(&mut self, items: Vec<Parsed>) -> String {
        let text: String = items.into_iter().filter_map(|p| if let Parsed::Text(t) = p { Some(t) } else { None }).collect();
        if text.is_empty() { String::new() } else { self.chunk(&text, None) }
    }

    fn done(&mut self, o: Outcome) -> String {
        let mut s = self.chunk("", Some(finish_reason(&o)));
        if self.closes {
            s.push_str(&self.close(self.usage.then_some(o.usage)));
        }
        s
    }

    fn failed(&mut self, e: ApiError) -> String {
        sse::data(&e.body(super::Flavor::OpenAi))
    }
}
