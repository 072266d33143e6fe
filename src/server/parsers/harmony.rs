//! gpt-oss's harmony format. The output is a run of messages, each
//! `<|channel|>CHANNEL[ to=RECIPIENT][ <|constrain|>FORMAT]<|message|>CONTENT`, ended by `<|end|>`,
//! `<|call|>`, `<|return|>` or the end of the output; the next one opens with
//! `<|start|>assistant`, which may carry the ` to=RECIPIENT` itself (as the chat template writes
//! it). `analysis` is reasoning, `final` the answer, a message addressed `to=functions.NAME` a
//! tool call with JSON arguments, and `commentary` without a recipient text for the user.
//! These markers are special tokens: the engine keeps them in the text for this format.

use super::{held_suffix, push_merged, Parsed, ToolCall};

const START: &str = "<|start|>";
const CHANNEL: &str = "<|channel|>";
const MESSAGE: &str = "<|message|>";
const CONSTRAIN: &str = "<|constrain|>";
/// What ends a message's content (a new header ends one whose end marker is missing).
const ENDS: [&str; 5] = ["<|end|>", "<|call|>", "<|return|>", START, CHANNEL];

/// What a message's content is.
#[derive(Clone, Debug, PartialEq)]
enum Kind {
    Reasoning,
    Text,
    /// A call of this function; its content is held until the message ends.
    Call(String),
}

#[derive(Clone, Debug, PartialEq)]
enum State {
    /// Between messages, reading a header up to `<|message|>`.
    Header,
    Content(Kind),
}

/// Streaming reader of harmony output.
#[derive(Debug)]
pub(super) struct Harmony {
    state: State,
    buf: String,
    /// A call's arguments so far.
    body: String,
    /// Tool calls emitted.
    pub(super) calls: usize,
}

impl Harmony {
    pub(super) fn new() -> Self {
        Harmony { state: State::Header, buf: String::new(), body: String::new(), calls: 0 }
    }

    /// Feeds the next piece of output.
    pub(super) fn push(&mut self, chunk: &str, out: &mut Vec<Parsed>) {
        self.buf.push_str(chunk);
        while self.step(out) {}
    }

    /// Ends the output: a message still open ends here.
    pub(super) fn finish(&mut self, out: &mut Vec<Parsed>) {
        while self.step(out) {}
        let rest = std::mem::take(&mut self.buf);
        match std::mem::replace(&mut self.state, State::Header) {
            State::Content(kind) => {
                self.content(&kind, &rest, out);
                self.close(&kind, out);
            }
            // A header that never reached its content: nothing the model said.
            State::Header => {}
        }
        out.retain(|p| !matches!(p, Parsed::Text(t) | Parsed::Reasoning(t) if t.is_empty()));
    }

    fn step(&mut self, out: &mut Vec<Parsed>) -> bool {
        match self.state.clone() {
            State::Header => {
                if let Some(at) = self.buf.find(MESSAGE) {
                    let header: String = self.buf.drain(..at + MESSAGE.len()).collect();
                    self.state = State::Content(kind_of(&header[..at]));
                    return true;
                }
                // Output that opens with plain text rather than a header is the answer. A
                // header may start with the recipient of the `<|start|>assistant` the prompt
                // ended with (` to=functions.f<|channel|>…`).
                let trimmed = self.buf.trim_start();
                let header_like = |m: &str| trimmed.starts_with(m) || m.starts_with(trimmed);
                if !trimmed.is_empty() && !header_like("<|") && !header_like("to=") {
                    self.state = State::Content(Kind::Text);
                    return true;
                }
                false
            }
            State::Content(kind) => {
                let end = ENDS.iter().filter_map(|m| self.buf.find(m).map(|i| (i, *m))).min_by_key(|(i, _)| *i);
                match end {
                    Some((at, marker)) => {
                        let content: String = self.buf.drain(..at).collect();
                        // End markers are consumed; a header that ended the message stays.
                        if !matches!(marker, START | CHANNEL) {
                            self.buf.drain(..marker.len());
                        }
                        self.content(&kind, &content, out);
                        self.close(&kind, out);
                        self.state = State::Header;
                        true
                    }
                    None => {
                        // Keep back what could still become a marker.
                        let keep = held_suffix(&self.buf, &ENDS);
                        let ready: String = self.buf.drain(..self.buf.len() - keep).collect();
                        self.content(&kind, &ready, out);
                        false
                    }
                }
            }
        }
    }

    fn content(&mut self, kind: &Kind, text: &str, out: &mut Vec<Parsed>) {
        match kind {
            Kind::Reasoning => push_merged(out, Parsed::Reasoning(text.to_string())),
            Kind::Text => push_merged(out, Parsed::Text(text.to_string())),
            Kind::Call(_) => self.body.push_str(text),
        }
    }

    /// A message ended: a call's arguments are complete.
    fn close(&mut self, kind: &Kind, out: &mut Vec<Parsed>) {
        let Kind::Call(name) = kind else { return };
        let body = std::mem::take(&mut self.body);
        let args = match serde_json::from_str::<serde_json::Value>(body.trim()) {
            Ok(serde_json::Value::Object(m)) => Some(m),
            // A function without parameters may be called with nothing.
            _ if body.trim().is_empty() => Some(serde_json::Map::new()),
            _ => None,
        };
        match args {
            Some(arguments) => {
                self.calls += 1;
                out.push(Parsed::ToolCall(ToolCall { name: name.clone(), arguments }));
            }
            // Arguments that do not parse are given back as the text the model wrote.
            None => push_merged(out, Parsed::Text(body)),
        }
    }
}

/// The kind of a message from its header (`<|start|>assistant to=functions.f<|channel|>commentary
/// json`, `<|channel|>commentary to=functions.f <|constrain|>json`, `<|channel|>analysis`).
fn kind_of(header: &str) -> Kind {
    let header = header.replace(CONSTRAIN, " ");
    let recipient = header.split(|c: char| c.is_whitespace() || c == '<').find_map(|w| w.strip_prefix("to="));
    // A message to the assistant (a tool's result) or to everyone is not a call.
    if let Some(r) = recipient.filter(|r| !r.is_empty() && !matches!(*r, "assistant" | "user" | "all")) {
        return Kind::Call(r.strip_prefix("functions.").unwrap_or(r).to_string());
    }
    let channel = header.split(CHANNEL).nth(1).and_then(|c| c.split_whitespace().next()).unwrap_or("final");
    match channel {
        "analysis" => Kind::Reasoning,
        _ => Kind::Text,
    }
}
