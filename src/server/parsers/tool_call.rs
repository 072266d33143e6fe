//! The body of one tool call: Hermes/Qwen JSON, Qwen3-Coder XML or GLM-4.5 key/value tags.

use super::ToolCall;
use serde_json::{Map, Value};
use std::collections::HashMap;

/// JSON-schema types of each tool's parameters: `tool → parameter → type`. XML tool calls
/// carry every value as text; the schema says whether `42` means a number or a string.
#[derive(Clone, Debug, Default)]
pub struct ParamTypes(HashMap<String, HashMap<String, String>>);

impl ParamTypes {
    /// Reads OpenAI-shaped tool schemas (`{"type": "function", "function": {"name",
    /// "parameters": {"properties": {...}}}}`); anything else is skipped.
    pub fn from_tools(tools: &[Value]) -> Self {
        let mut map = HashMap::new();
        for t in tools {
            let f = t.get("function").unwrap_or(t);
            let Some(name) = f.get("name").and_then(Value::as_str) else { continue };
            let mut params = HashMap::new();
            if let Some(props) = f.pointer("/parameters/properties").and_then(Value::as_object) {
                for (p, schema) in props {
                    let ty = match schema.get("type") {
                        Some(Value::String(s)) => s.clone(),
                        // `["integer", "null"]`: the first non-null type decides.
                        Some(Value::Array(a)) => a
                            .iter()
                            .filter_map(Value::as_str)
                            .find(|s| *s != "null")
                            .unwrap_or("string")
                            .to_string(),
                        _ if schema.get("properties").is_some() => "object".into(),
                        _ => continue,
                    };
                    params.insert(p.clone(), ty);
                }
            }
            map.insert(name.to_string(), params);
        }
        Self(map)
    }

    pub(super) fn get(&self, tool: &str, param: &str) -> Option<&str> {
        self.0.get(tool)?.get(param).map(String::as_str)
    }
}

/// Parses what stands between `<tool_call>` and `</tool_call>` (or a whole
/// `<function=…>…</function>` block). `None` when it is not a well-formed call, so the
/// caller can give the text back unchanged.
pub fn parse_tool_call_body(body: &str, types: &ParamTypes) -> Option<Vec<ToolCall>> {
    let body = body.trim();
    if body.starts_with("<function=") {
        parse_xml(body, types)
    } else if body.starts_with('{') || body.starts_with('[') {
        parse_json(body)
    } else {
        parse_glm(body, types)
    }
}

/// GLM-4.5: `NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>…` (values typed as XML's;
/// GLM-4.7 leaves out the newlines).
fn parse_glm(body: &str, types: &ParamTypes) -> Option<Vec<ToolCall>> {
    // GLM-4.5/4.6 put a newline after the name; GLM-4.7 writes the first `<arg_key>` right
    // after it.
    let (name, mut rest) = match [body.find('\n'), body.find("<arg_key>")].into_iter().flatten().min() {
        Some(i) => (body[..i].trim(), body[i..].trim()),
        None => (body, ""),
    };
    let valid_name = |n: &str| !n.is_empty() && !n.contains(char::is_whitespace) && !n.contains(['<', '>', '{', '"']);
    if !valid_name(name) {
        return None;
    }
    let mut args = Map::new();
    while !rest.is_empty() {
        let after = rest.strip_prefix("<arg_key>")?;
        let k_end = after.find("</arg_key>")?;
        let key = after[..k_end].trim();
        let after = after[k_end + "</arg_key>".len()..].trim_start().strip_prefix("<arg_value>")?;
        let v_end = after.find("</arg_value>")?;
        args.insert(key.to_string(), typed_value(&after[..v_end], types.get(name, key)));
        rest = after[v_end + "</arg_value>".len()..].trim_start();
    }
    Some(vec![ToolCall { name: name.to_string(), arguments: args }])
}

/// `{"name": …, "arguments": {…}}`, several of them in a row, or a JSON array of them.
fn parse_json(body: &str) -> Option<Vec<ToolCall>> {
    let mut calls = vec![];
    for v in serde_json::Deserializer::from_str(body).into_iter::<Value>() {
        match v.ok()? {
            Value::Array(items) => {
                for item in items {
                    calls.push(json_call(item)?);
                }
            }
            item => calls.push(json_call(item)?),
        }
    }
    (!calls.is_empty()).then_some(calls)
}

fn json_call(v: Value) -> Option<ToolCall> {
    let Value::Object(mut obj) = v else { return None };
    let name = match obj.remove("name")? {
        Value::String(s) if !s.trim().is_empty() => s.trim().to_string(),
        _ => return None,
    };
    let args = obj.remove("arguments").or_else(|| obj.remove("parameters"));
    let arguments = match args {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m,
        // Some models write the arguments as a JSON string, as the OpenAI wire format does.
        Some(Value::String(s)) if s.trim().is_empty() => Map::new(),
        Some(Value::String(s)) => match serde_json::from_str(&s).ok()? {
            Value::Object(m) => m,
            _ => return None,
        },
        Some(_) => return None,
    };
    Some(ToolCall { name, arguments })
}

/// One or more `<function=NAME><parameter=P>VALUE</parameter>…</function>` blocks.
fn parse_xml(body: &str, types: &ParamTypes) -> Option<Vec<ToolCall>> {
    let mut calls = vec![];
    let mut rest = body.trim();
    while !rest.is_empty() {
        let after = rest.strip_prefix("<function=")?;
        let gt = after.find('>')?;
        let name = after[..gt].trim();
        if name.is_empty() || name.contains('<') || name.contains('\n') {
            return None;
        }
        let inner_start = &after[gt + 1..];
        let end = inner_start.find("</function>")?;
        let inner = &inner_start[..end];
        calls.push(ToolCall { name: name.to_string(), arguments: parse_params(name, inner, types)? });
        rest = inner_start[end + "</function>".len()..].trim_start();
    }
    (!calls.is_empty()).then_some(calls)
}

fn parse_params(tool: &str, inner: &str, types: &ParamTypes) -> Option<Map<String, Value>> {
    let mut args = Map::new();
    let mut rest = inner.trim();
    while !rest.is_empty() {
        let after = rest.strip_prefix("<parameter=")?;
        let gt = after.find('>')?;
        let name = after[..gt].trim();
        if name.is_empty() || name.contains('<') || name.contains('\n') {
            return None;
        }
        let value_start = &after[gt + 1..];
        // A model may forget `</parameter>`; the next parameter then ends the value.
        let (end, next) = match (value_start.find("</parameter>"), value_start.find("<parameter=")) {
            (Some(c), Some(n)) if n < c => (n, n),
            (Some(c), _) => (c, c + "</parameter>".len()),
            (None, Some(n)) => (n, n),
            (None, None) => (value_start.len(), value_start.len()),
        };
        let raw = strip_one_newline(&value_start[..end]);
        args.insert(name.to_string(), typed_value(raw, types.get(tool, name)));
        rest = value_start[next..].trim_start();
    }
    Some(args)
}

/// The format puts the value on its own line(s): drop exactly that framing newline.
fn strip_one_newline(s: &str) -> &str {
    let s = s.strip_prefix("\r\n").or_else(|| s.strip_prefix('\n')).unwrap_or(s);
    s.strip_suffix("\r\n").or_else(|| s.strip_suffix('\n')).unwrap_or(s)
}

/// Types an XML parameter value by its schema; a value that does not fit stays a string.
pub(super) fn typed_value(raw: &str, ty: Option<&str>) -> Value {
    let text = || Value::String(raw.to_string());
    let t = raw.trim();
    match ty {
        Some("string") | None => text(),
        Some("integer") => t.parse::<i64>().map(Value::from).unwrap_or_else(|_| text()),
        Some("number") => match serde_json::from_str::<Value>(t) {
            Ok(v @ Value::Number(_)) => v,
            _ => text(),
        },
        Some("boolean") => match t.to_ascii_lowercase().as_str() {
            "true" => Value::Bool(true),
            "false" => Value::Bool(false),
            _ => text(),
        },
        Some("null") if t == "null" => Value::Null,
        Some(_) => serde_json::from_str(t).unwrap_or_else(|_| text()),
    }
}
