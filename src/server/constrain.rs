//! What a request forces the output to be, as a grammar for constrained decoding:
//! `response_format` (`json_object`, `json_schema`) and a forced tool call (`tool_choice`
//! `required` / `any` or a named tool), written the way the tool-call parser reads it back
//! (`<tool_call>{"name": …, "arguments": …}</tool_call>`), with the tool's JSON schema for
//! the arguments.

use super::ApiError;
use crate::sampling::grammar::GrammarSpec;
use serde_json::{json, Value};

/// The grammar for `response_format`, if it asks for JSON.
pub fn response_format(v: Option<&Value>) -> Result<Option<GrammarSpec>, ApiError> {
    let Some(v) = v.filter(|v| !v.is_null()) else { return Ok(None) };
    match v.get("type").and_then(Value::as_str) {
        None | Some("text") => Ok(None),
        Some("json_object") => Ok(Some(GrammarSpec::JsonSchema(json!({"type": "object"})))),
        Some("json_schema") => {
            let schema = v
                .pointer("/json_schema/schema")
                .or_else(|| v.get("schema"))
                .ok_or_else(|| ApiError::invalid("response_format.json_schema.schema", "Field required"))?;
            Ok(Some(GrammarSpec::JsonSchema(schema.clone())))
        }
        Some(t) => Err(ApiError::invalid("response_format.type", format!("unknown response_format `{t}` (text, json_object or json_schema)"))),
    }
}

/// The name a tool choice forces, `Some(None)` for any tool, `None` when no call is forced.
fn forced(choice: Option<&Value>) -> Option<Option<String>> {
    match choice? {
        Value::String(s) if s == "required" || s == "any" => Some(None),
        v @ Value::Object(_) => match v.get("type").and_then(Value::as_str) {
            Some("required" | "any") => Some(None),
            Some("function" | "tool") => {
                Some(v.pointer("/function/name").or_else(|| v.get("name")).and_then(Value::as_str).map(str::to_string))
            }
            _ => None,
        },
        _ => None,
    }
}

/// The grammar of a forced tool call over the template's `tools` (OpenAI function shape),
/// or `None` when the choice leaves the model free.
pub fn tool_call(choice: Option<&Value>, tools: &[Value], tool_format: bool) -> Result<Option<GrammarSpec>, ApiError> {
    let Some(name) = forced(choice) else { return Ok(None) };
    if !tool_format {
        return Err(ApiError::invalid("tool_choice", "this model's chat template has no tool-call format, so a tool call cannot be forced"));
    }
    let calls: Vec<Value> = tools
        .iter()
        .filter_map(|t| {
            let f = t.get("function")?;
            let n = f.get("name")?.as_str()?;
            if name.as_deref().is_some_and(|want| want != n) {
                return None;
            }
            let params = f.get("parameters").filter(|p| p.is_object()).cloned().unwrap_or_else(|| json!({"type": "object"}));
            Some(json!({
                "type": "object",
                "properties": {"name": {"const": n}, "arguments": params},
                "required": ["name", "arguments"],
                "additionalProperties": false,
            }))
        })
        .collect();
    if calls.is_empty() {
        return Err(ApiError::invalid("tool_choice", "no tool to call: the request offers none (or not the one named)"));
    }
    let schema = crate::sampling::grammar::compact_json(if calls.len() == 1 { calls[0].clone() } else { json!({"anyOf": calls}) });
    Ok(Some(GrammarSpec::Lark(format!("start: \"<tool_call>\\n\" call \"\\n</tool_call>\"\ncall: %json {schema}\n"))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools() -> Vec<Value> {
        ["a", "b"].iter().map(|n| json!({"type": "function", "function": {"name": n, "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}})).collect()
    }

    #[test]
    fn forced_calls_and_formats() {
        assert_eq!(tool_call(Some(&json!("auto")), &tools(), true).unwrap(), None);
        assert_eq!(tool_call(None, &tools(), true).unwrap(), None);
        let Some(GrammarSpec::Lark(g)) = tool_call(Some(&json!("required")), &tools(), true).unwrap() else { panic!() };
        assert!(g.contains("anyOf") && g.contains("\"const\":\"a\"") && g.contains("\"const\":\"b\""), "{g}");
        let named = json!({"type": "function", "function": {"name": "b"}});
        let Some(GrammarSpec::Lark(g)) = tool_call(Some(&named), &tools(), true).unwrap() else { panic!() };
        assert!(!g.contains("anyOf") && g.contains("\"const\":\"b\""), "{g}");
        assert!(tool_call(Some(&json!({"type": "tool", "name": "zzz"})), &tools(), true).is_err());
        assert!(tool_call(Some(&json!("any")), &tools(), false).is_err());
        assert_eq!(response_format(Some(&json!({"type": "text"}))).unwrap(), None);
        assert_eq!(response_format(Some(&json!({"type": "json_object"}))).unwrap(), Some(GrammarSpec::JsonSchema(json!({"type": "object"}))));
        let s = json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer"}, "strict": true}});
        assert_eq!(response_format(Some(&s)).unwrap(), Some(GrammarSpec::JsonSchema(json!({"type": "integer"}))));
        assert!(response_format(Some(&json!({"type": "json_schema"}))).is_err());
        assert!(response_format(Some(&json!({"type": "yaml"}))).is_err());
    }
}
