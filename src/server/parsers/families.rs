//! Tool-call markup of the families that do not use `<tool_call>` tags: DeepSeek V3.1,
//! DeepSeek V3.2/V4 (DSML), Kimi K2, MiniMax-M2 and Mistral, as their published chat templates
//! write an assistant's calls.

use super::tool_call::{typed_value, ParamTypes};
use super::ToolCall;
use serde_json::{Map, Value};

/// DeepSeek V3.1/V3.2: the calls' section.
pub(super) const DEEPSEEK_OPEN: &str = "<｜tool▁calls▁begin｜>";
/// End of DeepSeek's section.
pub(super) const DEEPSEEK_CLOSE: &str = "<｜tool▁calls▁end｜>";
/// Kimi K2: the calls' section.
pub(super) const KIMI_OPEN: &str = "<|tool_calls_section_begin|>";
/// End of Kimi's section.
pub(super) const KIMI_CLOSE: &str = "<|tool_calls_section_end|>";
/// MiniMax-M2: the calls' block.
pub(super) const MINIMAX_OPEN: &str = "<minimax:tool_call>";
/// End of MiniMax's block.
pub(super) const MINIMAX_CLOSE: &str = "</minimax:tool_call>";
/// DeepSeek V3.2's DSML block.
pub(super) const DSML_FUNCTIONS_OPEN: &str = "<｜DSML｜function_calls>";
/// End of DeepSeek V3.2's block.
pub(super) const DSML_FUNCTIONS_CLOSE: &str = "</｜DSML｜function_calls>";
/// DeepSeek V4's DSML block.
pub(super) const DSML_TOOLS_OPEN: &str = "<｜DSML｜tool_calls>";
/// End of DeepSeek V4's block.
pub(super) const DSML_TOOLS_CLOSE: &str = "</｜DSML｜tool_calls>";
/// Mistral: each call starts with it, and nothing but the end of the output closes the last.
pub(super) const MISTRAL_OPEN: &str = "[TOOL_CALLS]";

/// Which markup wraps a model's tool calls.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ToolMarkup {
    /// `<tool_call>…</tool_call>` (Hermes/Qwen JSON, Qwen3-Coder XML, GLM key/value tags).
    #[default]
    ToolCallTags,
    /// `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{JSON}<｜tool▁call▁end｜>` inside DeepSeek's section.
    DeepSeek,
    /// `<|tool_call_begin|>functions.NAME:I<|tool_call_argument_begin|>{JSON}<|tool_call_end|>`
    /// inside Kimi's section.
    Kimi,
    /// `<invoke name="NAME"><parameter name="P">VALUE</parameter></invoke>` inside MiniMax's block.
    MiniMax,
    /// DeepSeek V3.2/V4: `<｜DSML｜invoke name="NAME">` with `<｜DSML｜parameter name="P"
    /// string="true|false">` values (JSON unless `string="true"`) inside a DSML block.
    Dsml,
    /// Mistral/Devstral: `[TOOL_CALLS]NAME[ARGS]{JSON}` (or `[TOOL_CALLS][{"name", "arguments"}]`)
    /// to the end of the output.
    Mistral,
    /// gpt-oss harmony: channels (`analysis`, `final`, `commentary`) of messages; a message
    /// `to=functions.NAME` is a call with JSON arguments. Covers reasoning too.
    Harmony,
}

impl ToolMarkup {
    /// The markup a chat template writes for an assistant's calls, from its source.
    pub fn from_template(src: &str) -> Option<Self> {
        // DSML templates build their tags from a `｜DSML｜` variable.
        [("<|channel|>", Self::Harmony), ("｜DSML｜", Self::Dsml), (DEEPSEEK_OPEN, Self::DeepSeek), (KIMI_OPEN, Self::Kimi), (MINIMAX_OPEN, Self::MiniMax), (MISTRAL_OPEN, Self::Mistral)]
            .into_iter()
            .find(|(open, _)| src.contains(open))
            .map(|(_, m)| m)
    }

    /// The section markers (open, close) of a family with its own markup; an empty close is
    /// the end of the output.
    pub(super) fn sections(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Self::ToolCallTags | Self::Harmony => &[],
            Self::DeepSeek => &[(DEEPSEEK_OPEN, DEEPSEEK_CLOSE)],
            Self::Kimi => &[(KIMI_OPEN, KIMI_CLOSE)],
            Self::MiniMax => &[(MINIMAX_OPEN, MINIMAX_CLOSE)],
            Self::Dsml => &[(DSML_FUNCTIONS_OPEN, DSML_FUNCTIONS_CLOSE), (DSML_TOOLS_OPEN, DSML_TOOLS_CLOSE)],
            Self::Mistral => &[(MISTRAL_OPEN, "")],
        }
    }

    /// What a call (or its section) opens with, where free text may stop for a lazy grammar;
    /// DSML's two block names share `<｜DSML｜`. `None` for harmony, whose calls sit in message
    /// headers.
    pub fn call_marker(self) -> Option<&'static str> {
        Some(match self {
            Self::ToolCallTags => "<tool_call>",
            Self::DeepSeek => DEEPSEEK_OPEN,
            Self::Kimi => KIMI_OPEN,
            Self::MiniMax => MINIMAX_OPEN,
            Self::Dsml => "<｜DSML｜",
            Self::Mistral => MISTRAL_OPEN,
            Self::Harmony => return None,
        })
    }

    /// Every family's section markers.
    pub(super) fn all_sections() -> impl Iterator<Item = (&'static str, &'static str)> {
        [Self::DeepSeek, Self::Kimi, Self::MiniMax, Self::Dsml, Self::Mistral].into_iter().flat_map(|m| m.sections().iter().copied())
    }
}

/// The calls in the section body opened by `open` (one of the families' open markers);
/// `None` when `open` is not one of them or the body is not well formed.
pub(super) fn parse_section(open: &str, body: &str, types: &ParamTypes) -> Option<Vec<ToolCall>> {
    let calls = match open {
        DEEPSEEK_OPEN => repeated(body, "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", deepseek_call)?,
        KIMI_OPEN => repeated(body, "<|tool_call_begin|>", "<|tool_call_end|>", kimi_call)?,
        MINIMAX_OPEN => repeated(body, "<invoke name=\"", "</invoke>", |inner| minimax_call(inner, types))?,
        DSML_FUNCTIONS_OPEN | DSML_TOOLS_OPEN => repeated(body, "<｜DSML｜invoke name=\"", "</｜DSML｜invoke>", |inner| dsml_call(inner, types))?,
        MISTRAL_OPEN => mistral_calls(body)?,
        _ => return None,
    };
    (!calls.is_empty()).then_some(calls)
}

/// Every `open … close` item of `body` (whitespace between them only), each parsed by `item`.
fn repeated(body: &str, open: &str, close: &str, item: impl Fn(&str) -> Option<ToolCall>) -> Option<Vec<ToolCall>> {
    let mut calls = vec![];
    let mut rest = body.trim();
    while !rest.is_empty() {
        let after = rest.strip_prefix(open)?;
        let end = after.find(close)?;
        calls.push(item(&after[..end])?);
        rest = after[end + close.len()..].trim_start();
    }
    Some(calls)
}

/// A plausible function name: no whitespace or markup.
fn name_ok(n: &str) -> bool {
    !n.is_empty() && !n.contains(char::is_whitespace) && !n.contains(['<', '>', '{', '"', '｜', '|'])
}

/// JSON arguments: an object (or nothing at all).
fn json_args(s: &str) -> Option<Map<String, Value>> {
    let s = s.trim();
    if s.is_empty() {
        return Some(Map::new());
    }
    match serde_json::from_str(s).ok()? {
        Value::Object(m) => Some(m),
        _ => None,
    }
}

/// `NAME<｜tool▁sep｜>{JSON}`.
fn deepseek_call(inner: &str) -> Option<ToolCall> {
    let (name, args) = inner.split_once("<｜tool▁sep｜>")?;
    let name = name.trim();
    name_ok(name).then_some(())?;
    Some(ToolCall { name: name.to_string(), arguments: json_args(args)? })
}

/// `functions.NAME:INDEX<|tool_call_argument_begin|>{JSON}` (the id's prefix and index are
/// optional).
fn kimi_call(inner: &str) -> Option<ToolCall> {
    let (id, args) = inner.split_once("<|tool_call_argument_begin|>")?;
    let id = id.trim();
    let id = id.strip_prefix("functions.").unwrap_or(id);
    let name = match id.rsplit_once(':') {
        Some((n, i)) if i.chars().all(|c| c.is_ascii_digit()) => n,
        _ => id,
    };
    name_ok(name).then_some(())?;
    Some(ToolCall { name: name.to_string(), arguments: json_args(args)? })
}

/// `NAME">` then `<parameter name="P">VALUE</parameter>`…: values are text, typed by the
/// tool's schema (the template writes non-strings as JSON).
fn minimax_call(inner: &str, types: &ParamTypes) -> Option<ToolCall> {
    invoke(inner, "<parameter name=\"", "</parameter>", |name, key, _, raw| typed_value(raw, types.get(name, key)))
}

/// `NAME">` then `<｜DSML｜parameter name="P" string="true|false">VALUE</｜DSML｜parameter>`…:
/// a `string="true"` value is the text itself, any other is JSON (typed by the schema when it
/// does not parse).
fn dsml_call(inner: &str, types: &ParamTypes) -> Option<ToolCall> {
    invoke(inner, "<｜DSML｜parameter name=\"", "</｜DSML｜parameter>", |name, key, attrs, raw| {
        if attrs.contains("string=\"true\"") {
            Value::String(raw.to_string())
        } else {
            serde_json::from_str(raw.trim()).unwrap_or_else(|_| typed_value(raw, types.get(name, key)))
        }
    })
}

/// An `<invoke name="` item's inside: `NAME">` then parameters `open KEY"ATTRS>RAW close`,
/// each value made by `value(name, key, attrs, raw)`.
fn invoke(inner: &str, open: &str, close: &str, value: impl Fn(&str, &str, &str, &str) -> Value) -> Option<ToolCall> {
    let (name, rest) = inner.split_once("\">")?;
    name_ok(name).then_some(())?;
    let mut args = Map::new();
    let mut rest = rest.trim();
    while !rest.is_empty() {
        let (key, after) = rest.strip_prefix(open)?.split_once('"')?;
        let (attrs, after) = after.split_once('>')?;
        let end = after.find(close)?;
        args.insert(key.to_string(), value(name, key, attrs, &after[..end]));
        rest = after[end + close.len()..].trim_start();
    }
    Some(ToolCall { name: name.to_string(), arguments: args })
}

/// What follows the first `[TOOL_CALLS]`: `NAME[ARGS]{JSON}` items separated by further
/// `[TOOL_CALLS]`, or (older Mistral models) one JSON list of `{"name", "arguments"}`.
fn mistral_calls(body: &str) -> Option<Vec<ToolCall>> {
    let body = body.trim();
    if body.starts_with('[') {
        return super::tool_call::parse_tool_call_body(body, &ParamTypes::default());
    }
    body.split(MISTRAL_OPEN)
        .map(|item| {
            let (name, args) = item.split_once("[ARGS]")?;
            let name = name.trim();
            name_ok(name).then_some(())?;
            Some(ToolCall { name: name.to_string(), arguments: json_args(args)? })
        })
        .collect()
}
