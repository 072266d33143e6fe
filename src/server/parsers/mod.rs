//! Model output → API structure: reasoning (`<think>…</think>`) and tool calls, streamed.
//!
//! The model writes one flat text; clients want reasoning, visible text and tool calls
//! apart. [`OutputParser`] takes the text in whatever pieces the detokenizer produces and
//! yields [`Parsed`] events as soon as they are certain. It never lets partial markup leak
//! out as text: a suffix that could still become `<think>`, `</think>`, `<tool_call>` or
//! `<function=` is held back until the next piece decides it. A tool call that does not
//! parse is given back as the text the model wrote, so a malformed call degrades to text
//! rather than failing the request.
//!
//! Formats understood inside a tool call:
//! - Qwen / Hermes JSON: `<tool_call>\n{"name": "f", "arguments": {…}}\n</tool_call>`
//! - Qwen3-Coder XML: `<tool_call>\n<function=f>\n<parameter=p>\nvalue\n</parameter>\n</function>\n</tool_call>`
//!   (also without the `<tool_call>` wrapper when the chat template uses this format).
//! - GLM-4.5: `<tool_call>f\n<arg_key>p</arg_key>\n<arg_value>value</arg_value>\n</tool_call>`
//!
//! and the markup of families without `<tool_call>` tags ([`ToolMarkup`]: DeepSeek V3.1,
//! DeepSeek V3.2/V4 DSML, Kimi K2, MiniMax-M2, Mistral), whose whole section of calls is held
//! and parsed the same way.

mod families;
mod harmony;
mod tool_call;
#[cfg(test)]
mod tests;

pub use families::ToolMarkup;
pub use tool_call::{parse_tool_call_body, ParamTypes};

const THINK_OPEN: &str = "<think>";
const THINK_CLOSE: &str = "</think>";
const TOOL_OPEN: &str = "<tool_call>";
const TOOL_CLOSE: &str = "</tool_call>";
const FUNCTION_OPEN: &str = "<function=";
const FUNCTION_CLOSE: &str = "</function>";

/// One tool call the model made.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    /// Function name.
    pub name: String,
    /// Arguments as a JSON object.
    pub arguments: serde_json::Map<String, serde_json::Value>,
}

impl ToolCall {
    /// The arguments as a compact JSON string (the OpenAI wire form).
    pub fn arguments_json(&self) -> String {
        serde_json::Value::Object(self.arguments.clone()).to_string()
    }
}

/// A piece of structured output.
#[derive(Clone, Debug, PartialEq)]
pub enum Parsed {
    /// Reasoning text (inside `<think>…</think>`).
    Reasoning(String),
    /// Visible text.
    Text(String),
    /// A complete tool call.
    ToolCall(ToolCall),
}

/// What to look for in the output of one request.
#[derive(Clone, Debug, Default)]
pub struct ParserOptions {
    /// Recognise a `<think>` block at the start of the output.
    pub reasoning: bool,
    /// The prompt already opened `<think>`: output starts inside the reasoning.
    pub start_in_reasoning: bool,
    /// Recognise tool calls (the request offered tools).
    pub tools: bool,
    /// Also accept a bare `<function=…>` (Qwen3-Coder templates) as a tool call.
    pub bare_function: bool,
    /// The markup around the calls.
    pub markup: ToolMarkup,
    /// Parameter types from the tool schemas, used to type XML parameter values.
    pub param_types: ParamTypes,
    /// Pass text through untouched (raw completions): no markup, no whitespace trimming.
    pub raw: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Nothing but whitespace seen; a `<think>` may still open.
    Start,
    Reasoning,
    Text,
    /// Inside a tool call opened by `open` (one of the open markers).
    ToolCall { open: &'static str },
}

/// Streaming splitter of model output into reasoning, text and tool calls.
#[derive(Debug)]
pub struct OutputParser {
    opts: ParserOptions,
    mode: Mode,
    /// Text received but not yet decided.
    buf: String,
    /// Whitespace held back in text mode: dropped before a tool call, emitted otherwise.
    text_ws: String,
    /// Whitespace held back at the end of reasoning: dropped before `</think>`.
    reasoning_ws: String,
    /// Any visible text emitted yet (leading whitespace of the answer is dropped).
    text_started: bool,
    /// Any reasoning emitted yet (leading whitespace of the reasoning is dropped).
    reasoning_started: bool,
    /// Number of tool calls emitted.
    calls: usize,
    /// The harmony reader, which takes the whole output of a gpt-oss model.
    harmony: Option<harmony::Harmony>,
}

impl OutputParser {
    /// A parser for one generation.
    pub fn new(opts: ParserOptions) -> Self {
        let mode = if opts.raw {
            Mode::Text
        } else if opts.reasoning && opts.start_in_reasoning {
            Mode::Reasoning
        } else if opts.reasoning {
            Mode::Start
        } else {
            Mode::Text
        };
        let mut parser = Self {
            opts,
            mode,
            buf: String::new(),
            text_ws: String::new(),
            reasoning_ws: String::new(),
            text_started: false,
            reasoning_started: false,
            calls: 0,
            harmony: None,
        };
        if parser.opts.markup == ToolMarkup::Harmony && !parser.opts.raw {
            parser.harmony = Some(harmony::Harmony::new());
        }
        parser.text_started = parser.opts.raw;
        parser
    }

    /// Tool calls emitted so far.
    pub fn tool_calls(&self) -> usize {
        self.calls
    }

    /// Feeds the next piece of output; decided events are appended to `out`.
    pub fn push(&mut self, chunk: &str, out: &mut Vec<Parsed>) {
        if let Some(h) = &mut self.harmony {
            h.push(chunk, out);
            self.calls = h.calls;
            return;
        }
        self.buf.push_str(chunk);
        while self.step(out) {}
    }

    /// Ends the output: whatever is held back is decided now.
    pub fn finish(&mut self, out: &mut Vec<Parsed>) {
        if let Some(h) = &mut self.harmony {
            h.finish(out);
            self.calls = h.calls;
            return;
        }
        while self.step(out) {}
        let rest = std::mem::take(&mut self.buf);
        match self.mode {
            Mode::Start | Mode::Text => {
                self.emit_text(&rest, out);
                if self.calls == 0 && self.text_started {
                    let ws = std::mem::take(&mut self.text_ws);
                    push_merged(out, Parsed::Text(ws));
                }
            }
            Mode::Reasoning => {
                let trimmed = rest.trim_end();
                if !trimmed.is_empty() {
                    let pending = std::mem::take(&mut self.reasoning_ws);
                    self.emit_reasoning(&(pending + trimmed), out);
                }
            }
            Mode::ToolCall { open } => {
                // The output ended inside a call (length limit, or a stop string ate the
                // close tag): keep it if the body is already complete, else it is text.
                match parse_call(open, &rest, &self.opts.param_types) {
                    Some(calls) => self.emit_calls(calls, out),
                    None => {
                        let raw = format!("{open}{rest}");
                        self.emit_text(&raw, out);
                        let ws = std::mem::take(&mut self.text_ws);
                        push_merged(out, Parsed::Text(ws));
                    }
                }
            }
        }
        self.mode = Mode::Text;
        out.retain(|p| !matches!(p, Parsed::Text(t) | Parsed::Reasoning(t) if t.is_empty()));
    }

    /// Processes `buf` as far as it can; true when it made progress and may go on.
    fn step(&mut self, out: &mut Vec<Parsed>) -> bool {
        match self.mode {
            Mode::Start => {
                let trimmed = self.buf.trim_start();
                if trimmed.is_empty() {
                    return false;
                }
                if let Some(rest) = trimmed.strip_prefix(THINK_OPEN) {
                    self.buf = rest.to_string();
                    self.mode = Mode::Reasoning;
                    return true;
                }
                if THINK_OPEN.starts_with(trimmed) {
                    return false; // could still become `<think>`
                }
                self.mode = Mode::Text;
                true
            }
            Mode::Reasoning => {
                if let Some(i) = self.buf.find(THINK_CLOSE) {
                    let before = self.buf[..i].trim_end().to_string();
                    self.buf.drain(..i + THINK_CLOSE.len());
                    let pending = std::mem::take(&mut self.reasoning_ws);
                    if !before.is_empty() {
                        self.emit_reasoning(&(pending + &before), out);
                    }
                    self.mode = Mode::Text;
                    return true;
                }
                let keep = held_suffix(&self.buf, &[THINK_CLOSE]);
                let ready: String = self.buf.drain(..self.buf.len() - keep).collect();
                // Trailing whitespace may be the newline before `</think>`: hold it.
                let body = ready.trim_end();
                let ws = &ready[body.len()..];
                if !body.is_empty() {
                    let pending = std::mem::take(&mut self.reasoning_ws);
                    self.emit_reasoning(&(pending + body), out);
                }
                self.reasoning_ws.push_str(ws);
                false
            }
            Mode::Text => {
                let markers = self.open_markers();
                if markers.is_empty() {
                    let all = std::mem::take(&mut self.buf);
                    self.emit_text(&all, out);
                    return false;
                }
                let found = markers
                    .iter()
                    .filter_map(|m| self.buf.find(m).map(|i| (i, *m)))
                    .min_by_key(|(i, _)| *i);
                if let Some((i, open)) = found {
                    let before = self.buf[..i].to_string();
                    self.buf.drain(..i + open.len());
                    self.emit_text(&before, out);
                    self.mode = Mode::ToolCall { open };
                    return true;
                }
                let keep = held_suffix(&self.buf, &markers);
                let ready: String = self.buf.drain(..self.buf.len() - keep).collect();
                self.emit_text(&ready, out);
                false
            }
            Mode::ToolCall { open } => {
                let close = close_marker(open);
                // A section that only the end of the output closes is decided in `finish`.
                let Some(i) = self.buf.find(close).filter(|_| !close.is_empty()) else {
                    return false;
                };
                let body = self.buf[..i].to_string();
                self.buf.drain(..i + close.len());
                self.mode = Mode::Text;
                match parse_call(open, &body, &self.opts.param_types) {
                    Some(calls) => self.emit_calls(calls, out),
                    None => {
                        let raw = format!("{open}{body}{close}");
                        self.emit_text(&raw, out);
                    }
                }
                true
            }
        }
    }

    fn open_markers(&self) -> Vec<&'static str> {
        if !self.opts.tools || self.opts.raw {
            return vec![];
        }
        let sections = self.opts.markup.sections();
        match (sections.is_empty(), self.opts.bare_function) {
            (false, _) => sections.iter().map(|(open, _)| *open).collect(),
            (true, false) => vec![TOOL_OPEN],
            (true, true) => vec![TOOL_OPEN, FUNCTION_OPEN],
        }
    }

    fn emit_reasoning(&mut self, s: &str, out: &mut Vec<Parsed>) {
        let s = if self.reasoning_started { s } else { s.trim_start() };
        if s.is_empty() {
            return;
        }
        self.reasoning_started = true;
        push_merged(out, Parsed::Reasoning(s.to_string()));
    }

    /// Emits visible text; whitespace runs wait for the next non-whitespace so that the
    /// newlines around tool calls do not become content.
    fn emit_text(&mut self, s: &str, out: &mut Vec<Parsed>) {
        let body = s.trim_end();
        let tail = &s[body.len()..];
        if !body.is_empty() {
            let mut piece = std::mem::take(&mut self.text_ws);
            piece.push_str(body);
            let piece = if self.text_started { piece } else { piece.trim_start().to_string() };
            if !piece.is_empty() {
                self.text_started = true;
                push_merged(out, Parsed::Text(piece));
            }
        }
        if self.text_started {
            self.text_ws.push_str(tail);
        }
    }

    fn emit_calls(&mut self, calls: Vec<ToolCall>, out: &mut Vec<Parsed>) {
        self.text_ws.clear();
        for c in calls {
            self.calls += 1;
            out.push(Parsed::ToolCall(c));
        }
    }
}

/// The marker that ends what `open` began.
fn close_marker(open: &'static str) -> &'static str {
    match open {
        TOOL_OPEN => TOOL_CLOSE,
        FUNCTION_OPEN => FUNCTION_CLOSE,
        _ => ToolMarkup::all_sections().find(|(o, _)| *o == open).map_or(TOOL_CLOSE, |(_, c)| c),
    }
}

/// Parses a call opened by `open` with body `body` (between the markers).
fn parse_call(open: &str, body: &str, types: &ParamTypes) -> Option<Vec<ToolCall>> {
    match open {
        FUNCTION_OPEN => parse_tool_call_body(&format!("{FUNCTION_OPEN}{body}{FUNCTION_CLOSE}"), types),
        TOOL_OPEN => parse_tool_call_body(body, types),
        _ => families::parse_section(open, body, types),
    }
}

/// Appends `p`, merging it into the previous event of the same kind (fewer, larger deltas).
fn push_merged(out: &mut Vec<Parsed>, p: Parsed) {
    match (out.last_mut(), p) {
        (Some(Parsed::Text(a)), Parsed::Text(b)) | (Some(Parsed::Reasoning(a)), Parsed::Reasoning(b)) => {
            a.push_str(&b)
        }
        (_, Parsed::Text(b)) if b.is_empty() => {}
        (_, p) => out.push(p),
    }
}

/// Length of the longest suffix of `s` that is a proper prefix of one of `markers`.
fn held_suffix(s: &str, markers: &[&str]) -> usize {
    let mut best = 0;
    for m in markers {
        let max = m.len().saturating_sub(1).min(s.len());
        for n in (best + 1..=max).rev() {
            if s.is_char_boundary(s.len() - n) && m.starts_with(&s[s.len() - n..]) {
                best = n;
                break;
            }
        }
    }
    best
}
