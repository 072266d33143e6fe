//! What a request forces the output to be, as a grammar for constrained decoding:
//! `response_format` (`json_object`, `json_schema`) and a forced tool call (`tool_choice`
//! `required` / `any` or a named tool), written the way the tool-call parser reads it back
//! (`<tool_call>{"name": …, "arguments": …}</tool_call>`, or the DeepSeek, Kimi and Mistral
//! markup), with the tool's JSON schema for the arguments.

use super::parsers::ToolMarkup;
use super::prompt::ModelFormat;
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

/// The grammar of a forced tool call over the template's `tools` (OpenAI function shape) in
/// the served model's markup `format`, or `None` when the choice leaves the model free.
pub fn tool_call(choice: Option<&Value>, tools: &[Value], format: &ModelFormat) -> Result<Option<GrammarSpec>, ApiError> {
    let Some(name) = forced(choice) else { return Ok(None) };
    if !format.tools {
        return Err(ApiError::invalid("tool_choice", "this model's chat template has no tool-call format, so a tool call cannot be forced"));
    }
    let offered: Vec<(&str, Value)> = tools
        .iter()
        .filter_map(|t| {
            let f = t.get("function")?;
            let n = f.get("name")?.as_str()?;
            if name.as_deref().is_some_and(|want| want != n) {
                return None;
            }
            Some((n, f.get("parameters").filter(|p| p.is_object()).cloned().unwrap_or_else(|| json!({"type": "object"}))))
        })
        .collect();
    if offered.is_empty() {
        return Err(ApiError::invalid("tool_choice", "no tool to call: the request offers none (or not the one named)"));
    }
    let rules = match format.markup {
        ToolMarkup::ToolCallTags => {
            return Ok(Some(GrammarSpec::Lark(format!("start: \"<tool_call>\\n\" call \"\\n</tool_call>\"\ncall: %json {}\n", tag_calls_schema(&offered)))));
        }
        ToolMarkup::MiniMax | ToolMarkup::Dsml => offered.iter().enumerate().map(|(i, (n, params))| xml_call(i, n, params, format.markup == ToolMarkup::Dsml, false)).collect(),
        m => json_calls(m, &offered, false).unwrap_or_default(),
    };
    Ok(Some(GrammarSpec::Lark(format!("start: {}\n{rules}", alternatives(offered.len())))))
}

/// A string as a grammar literal.
fn lit(s: &str) -> String {
    Value::String(s.to_string()).to_string()
}

/// `call0 | call1 | …`: one alternative per offered tool.
fn alternatives(n: usize) -> String {
    (0..n).map(|i| format!("call{i}")).collect::<Vec<_>>().join(" | ")
}

/// The JSON of one `<tool_call>` to any offered tool: its name and arguments of its schema.
fn tag_calls_schema(offered: &[(&str, Value)]) -> Value {
    let calls: Vec<Value> = offered
        .iter()
        .map(|(n, params)| json!({"type": "object", "properties": {"name": {"const": n}, "arguments": params}, "required": ["name", "arguments"], "additionalProperties": false}))
        .collect();
    crate::sampling::grammar::compact_json(if calls.len() == 1 { calls[0].clone() } else { json!({"anyOf": calls}) })
}

/// For the markups whose arguments are JSON (DeepSeek, Kimi, Mistral, harmony), the rules
/// `call{i}`: the call to offered tool `i`, in the markup the parser reads back, starting after
/// the section marker when it is already `opened`; `None` for the others.
fn json_calls(markup: ToolMarkup, offered: &[(&str, Value)], opened: bool) -> Option<String> {
    let rules = offered.iter().enumerate().map(|(i, (n, params))| {
        // (what follows the section marker before the arguments, what ends the call)
        let (before, after) = match markup {
            ToolMarkup::DeepSeek => (lit(&format!("<｜tool▁call▁begin｜>{n}<｜tool▁sep｜>")), "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
            ToolMarkup::Kimi => (lit(&format!("<|tool_call_begin|>functions.{n}:0<|tool_call_argument_begin|>")), "<|tool_call_end|><|tool_calls_section_end|>"),
            ToolMarkup::Mistral => (lit(&format!("{n}[ARGS]")), ""),
            // gpt-oss's markers are special tokens, which the grammar names as such; the end
            // of the output (the grammar's end-of-sequence) ends the call.
            ToolMarkup::Harmony => (format!("<|channel|> {} <|constrain|> \"json\" <|message|>", lit(&format!("commentary to=functions.{n} "))), ""),
            _ => return None,
        };
        let marker = match markup.call_marker() {
            Some(m) if !opened => format!("{} ", lit(m)),
            _ => String::new(),
        };
        let tail = if after.is_empty() { String::new() } else { format!(" {}", lit(after)) };
        Some(format!("call{i}: {marker}{before} args{i}{tail}\nargs{i}: %json {}\n", crate::sampling::grammar::compact_json(params.clone())))
    });
    rules.collect()
}

/// With `tool_choice: auto` and tools marked `strict: true` (`raw`: the request's tools), a
/// lazy grammar: text is free until the model opens a call section, and each call it then
/// writes must name one of the tools and, for a strict one, match its schema; text after a call
/// is free again (in harmony, see [`harmony_strict`]). `None` when no tool is strict.
pub fn strict_calls(raw: &[Value], tools: &[Value], format: &ModelFormat) -> Option<GrammarSpec> {
    let strict: Vec<&str> = raw
        .iter()
        .filter_map(|t| t.get("function").unwrap_or(t).as_object())
        .filter(|f| f.get("strict").and_then(Value::as_bool) == Some(true))
        .filter_map(|f| f.get("name").and_then(Value::as_str))
        .collect();
    if strict.is_empty() || !format.tools {
        return None;
    }
    let offered: Vec<(&str, Value)> = tools
        .iter()
        .filter_map(|t| {
            let f = t.get("function")?;
            let n = f.get("name")?.as_str()?;
            let args = match strict.contains(&n) {
                true => f.get("parameters").filter(|p| p.is_object()).cloned().unwrap_or_else(|| json!({"type": "object"})),
                false => json!({"type": "object"}),
            };
            Some((n, args))
        })
        .collect();
    if format.markup == ToolMarkup::Harmony {
        return Some(harmony_strict(&offered));
    }
    let trigger = format.markup.call_marker()?;
    // What follows the marker for one call.
    let body = match format.markup {
        ToolMarkup::ToolCallTags => format!("body: \"\\n\" call \"\\n</tool_call>\"\ncall: %json {}\n", tag_calls_schema(&offered)),
        ToolMarkup::MiniMax | ToolMarkup::Dsml => {
            let rules: String = offered.iter().enumerate().map(|(i, (n, args))| xml_call(i, n, args, format.markup == ToolMarkup::Dsml, true)).collect();
            format!("body: {}\n{rules}", alternatives(offered.len()))
        }
        m => format!("body: {}\n{}", alternatives(offered.len()), json_calls(m, &offered, true)?),
    };
    // Free text stops at the first marker (a lazy lexeme); the text after the last call may not
    // contain one, so every call goes through the grammar.
    let (t, rx) = (lit(trigger), regex_literal(trigger));
    Some(GrammarSpec::Lark(format!("start: seg* TAIL\nseg: pre body\npre[suffix={t}]: /(?s:.*)/\n{body}TAIL: /(?s:.*)/ & ~/(?s:.*){rx}(?s:.*)/\n")))
}

/// Strict tools under `auto` in gpt-oss's harmony, whose message headers are special tokens
/// (no text marker to start a lazy grammar at): the whole output is held to the message
/// structure — any number of messages on any channel, free text in their bodies — except that
/// a header addressed `to=functions.` must be one of the calls, whose arguments match the
/// tool's schema (a strict one's; an object for the others) and end the output.
fn harmony_strict(offered: &[(&str, Value)]) -> GrammarSpec {
    let calls = json_calls(ToolMarkup::Harmony, offered, true).unwrap_or_default();
    GrammarSpec::Lark(format!(
        "start: msg* (last | {alts})
         msg: <|channel|> HDR <|message|> BODY <|end|> <|start|> ROLE
         last: <|channel|> HDR <|message|> BODY
         HDR: /[^<]*/ & ~/(?s:.*)to=functions(?s:.*)/
         ROLE: /[^<]*/ & ~/(?s:.*)to=functions(?s:.*)/
         BODY: /(?s:.*)/
         {calls}",
        alts = alternatives(offered.len())
    ))
}

/// `s` as a regex matching it literally.
fn regex_literal(s: &str) -> String {
    s.chars().map(|c| if "\\.+*?()|[]{}^$/".contains(c) { format!("\\{c}") } else { c.to_string() }).collect()
}

/// A string's JSON-schema `pattern` (unanchored, as JSON Schema reads it, unless it starts
/// with `^` / ends with `$`) as a lexeme matching the whole value.
fn pattern_regex(pattern: &str) -> String {
    let (start, core) = match pattern.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, pattern),
    };
    let end = core.ends_with('$') && !core.ends_with("\\$");
    let core = if end { &core[..core.len() - 1] } else { core };
    let any = "(?s:.*)";
    format!("/{}({}){}/", if start { "" } else { any }, core.replace('/', "\\/"), if end { "" } else { any })
}

/// A string parameter's raw text: one of its `enum`/`const` values, else text without `<`
/// within its `minLength`/`maxLength` (its `pattern` is added by [`xml_call`]).
fn string_value(schema: &Value) -> String {
    let listed: Vec<String> = match (schema.get("enum").and_then(Value::as_array), schema.get("const").and_then(Value::as_str)) {
        (Some(e), _) => e.iter().filter_map(Value::as_str).map(lit).collect(),
        (None, Some(c)) => vec![lit(c)],
        _ => vec![],
    };
    if !listed.is_empty() {
        return format!("({})", listed.join(" | "));
    }
    let min = schema.get("minLength").and_then(Value::as_u64).unwrap_or(0);
    match schema.get("maxLength").and_then(Value::as_u64) {
        Some(max) => format!("/[^<]{{{min},{}}}/", max.max(min)),
        None if min > 0 => format!("/[^<]{{{min},}}/"),
        None => "/[^<]*/".to_string(),
    }
}

/// The rules of call `i` to `name` in MiniMax's or DeepSeek's DSML markup, whose parameters are
/// XML elements: one per schema property, in the schema's order (the required ones always, the
/// others optionally); a string value is text without `<` (the parser reads it raw), any other
/// JSON of its schema.
fn xml_call(i: usize, name: &str, params: &Value, dsml: bool, after_trigger: bool) -> String {
    let empty = serde_json::Map::new();
    let props = params.get("properties").and_then(Value::as_object).unwrap_or(&empty);
    let required: Vec<&str> = params.get("required").and_then(Value::as_array).map(|r| r.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
    let mut rules = String::new();
    let mut seq = vec![];
    for (k, (key, schema)) in props.iter().enumerate() {
        let string = schema.get("type").and_then(Value::as_str) == Some("string");
        let pattern = schema.get("pattern").and_then(Value::as_str).filter(|_| schema.get("enum").is_none() && schema.get("const").is_none());
        let value = if let (true, Some(p)) = (string, pattern) {
            // A terminal: the value's length and `<`-free text, intersected with the pattern.
            rules.push_str(&format!("S{i}_{k}: {} & {}\n", string_value(schema), pattern_regex(p)));
            format!("S{i}_{k}")
        } else if string {
            string_value(schema)
        } else {
            rules.push_str(&format!("v{i}_{k}: %json {}\n", crate::sampling::grammar::compact_json(schema.clone())));
            format!("v{i}_{k}")
        };
        let (open, close) = if dsml {
            (format!("<｜DSML｜parameter name=\"{key}\" string=\"{string}\">"), "</｜DSML｜parameter>\n")
        } else {
            (format!("<parameter name=\"{key}\">"), "</parameter>\n")
        };
        rules.push_str(&format!("p{i}_{k}: {} {value} {}\n", lit(&open), lit(close)));
        seq.push(format!("p{i}_{k}{}", if required.contains(&key.as_str()) { "" } else { "?" }));
    }
    let params = seq.join(" ");
    // After a lazy grammar's trigger the section's opening marker is already written.
    let opened = |s: String| match after_trigger {
        true => {
            let marker = if dsml { ToolMarkup::Dsml } else { ToolMarkup::MiniMax }.call_marker().unwrap_or_default();
            s.strip_prefix(marker).map(str::to_string).unwrap_or(s)
        }
        false => s,
    };
    if dsml {
        // DeepSeek V3.2 names the block `function_calls`, V4 `tool_calls`.
        let invoke = format!("{} {params} {}", lit(&format!("<｜DSML｜invoke name=\"{name}\">\n")), lit("</｜DSML｜invoke>\n"));
        let block = |b: &str| format!("{} inv{i} {}", lit(&opened(format!("<｜DSML｜{b}>\n"))), lit(&format!("</｜DSML｜{b}>")));
        format!("call{i}: {} | {}\ninv{i}: {invoke}\n{rules}", block("tool_calls"), block("function_calls"))
    } else {
        let open = lit(&opened(format!("<minimax:tool_call>\n<invoke name=\"{name}\">\n")));
        format!("call{i}: {open} {params} {}\n{rules}", lit("</invoke>\n</minimax:tool_call>"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tags() -> ModelFormat {
        ModelFormat { tools: true, ..ModelFormat::default() }
    }

    fn tools() -> Vec<Value> {
        ["a", "b"].iter().map(|n| json!({"type": "function", "function": {"name": n, "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}})).collect()
    }

    #[test]
    fn forced_calls_and_formats() {
        assert_eq!(tool_call(Some(&json!("auto")), &tools(), &tags()).unwrap(), None);
        assert_eq!(tool_call(None, &tools(), &tags()).unwrap(), None);
        let Some(GrammarSpec::Lark(g)) = tool_call(Some(&json!("required")), &tools(), &tags()).unwrap() else { panic!() };
        assert!(g.contains("anyOf") && g.contains("\"const\":\"a\"") && g.contains("\"const\":\"b\""), "{g}");
        let named = json!({"type": "function", "function": {"name": "b"}});
        let Some(GrammarSpec::Lark(g)) = tool_call(Some(&named), &tools(), &tags()).unwrap() else { panic!() };
        assert!(!g.contains("anyOf") && g.contains("\"const\":\"b\""), "{g}");
        assert!(tool_call(Some(&json!({"type": "tool", "name": "zzz"})), &tools(), &tags()).is_err());
        assert!(tool_call(Some(&json!("any")), &tools(), &ModelFormat::default()).is_err());
        assert_eq!(response_format(Some(&json!({"type": "text"}))).unwrap(), None);
        assert_eq!(response_format(Some(&json!({"type": "json_object"}))).unwrap(), Some(GrammarSpec::JsonSchema(json!({"type": "object"}))));
        let s = json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer"}, "strict": true}});
        assert_eq!(response_format(Some(&s)).unwrap(), Some(GrammarSpec::JsonSchema(json!({"type": "integer"}))));
        assert!(response_format(Some(&json!({"type": "json_schema"}))).is_err());
        assert!(response_format(Some(&json!({"type": "yaml"}))).is_err());
    }

    /// Strict tools under `tool_choice: auto`: free text, then a call that must match the strict
    /// tool's schema, free text again; a second call is held to the schema too; a request
    /// without strict tools gets no grammar.
    #[test]
    fn strict_tools_under_auto_constrain_only_the_calls() {
        use crate::sampling::grammar::GrammarEnv;
        let mut bytes: Vec<Vec<u8>> = (0u8..=255).map(|b| vec![b]).collect();
        bytes.push([&[0xFF][..], b"<eos>"].concat());
        let env = GrammarEnv::new(bytes, 257, 256).unwrap();
        let mut raw = tools();
        assert_eq!(strict_calls(&raw, &tools(), &tags()), None, "no strict tool: no grammar");
        raw[0]["function"]["strict"] = json!(true);
        let spec = strict_calls(&raw, &tools(), &tags()).unwrap();
        let mut c = env.compile(&spec).unwrap();
        drive(&mut c, "<think>hm</think>\nLet me <b>check</b>.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": ");
        let m = c.mask().unwrap();
        assert!(m.is_allowed(b'7' as u32) && !m.is_allowed(b'"' as u32), "the strict tool's integer");
        drive(&mut c, "7}}\n</tool_call>\nDone.\n<tool_call>\n{\"name\": \"");
        let m = c.mask().unwrap();
        assert!(m.is_allowed(b'a' as u32) && m.is_allowed(b'b' as u32) && !m.is_allowed(b'z' as u32), "a second call names a tool too");
        drive(&mut c, "b\", \"arguments\": {\"anything\": [1]}}\n</tool_call>");
        assert!(c.mask().unwrap().is_allowed(256), "the output may end after a call");
        let mut c = env.compile(&spec).unwrap();
        drive(&mut c, "Just text, no call.");
        assert!(c.mask().unwrap().is_allowed(256), "text alone is fine");
        // The JSON-argument families hold their calls the same way.
        for (markup, open) in [
            (ToolMarkup::DeepSeek, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>a<｜tool▁sep｜>{\"x\": "),
            (ToolMarkup::Kimi, "<|tool_calls_section_begin|><|tool_call_begin|>functions.a:0<|tool_call_argument_begin|>{\"x\": "),
            (ToolMarkup::Mistral, "[TOOL_CALLS]a[ARGS]{\"x\": "),
            (ToolMarkup::MiniMax, "<minimax:tool_call>\n<invoke name=\"a\">\n<parameter name=\"x\">"),
            (ToolMarkup::Dsml, "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"a\">\n<｜DSML｜parameter name=\"x\" string=\"false\">"),
        ] {
            let spec = strict_calls(&raw, &tools(), &ModelFormat { markup, tools: true, ..ModelFormat::default() }).unwrap();
            let mut c = env.compile(&spec).unwrap();
            drive(&mut c, &format!("Sure. {open}"));
            let m = c.mask().unwrap();
            assert!(m.is_allowed(b'7' as u32) && !m.is_allowed(b'"' as u32), "{markup:?}: the strict tool's integer");
        }
    }

    /// Feeds `text` byte by byte into `c` (a vocabulary of single bytes), each byte allowed.
    fn drive(c: &mut crate::sampling::grammar::Constraint, text: &str) {
        for (at, b) in text.bytes().enumerate() {
            assert!(c.mask().unwrap().is_allowed(b as u32), "byte {at} of {text:?} must be allowed");
            c.consume(b as u32).unwrap();
        }
    }

    /// Forced calls in the XML-parameter markups (DSML, MiniMax): the matcher admits the call
    /// with typed values, not a misspelt parameter, and the text parses back into the call.
    #[test]
    fn forced_xml_parameter_calls() {
        use crate::sampling::grammar::GrammarEnv;
        use crate::server::parsers::{OutputParser, ParamTypes, Parsed, ParserOptions};
        let mut bytes: Vec<Vec<u8>> = (0u8..=255).map(|b| vec![b]).collect();
        bytes.push([&[0xFF][..], b"<eos>"].concat());
        let env = GrammarEnv::new(bytes, 257, 256).unwrap();
        let tools = vec![json!({"type": "function", "function": {"name": "search", "parameters": {"type": "object",
            "properties": {"q": {"type": "string"}, "limit": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}},
                "unit": {"type": "string", "enum": ["km", "mi"]}}, "required": ["q"]}}})];
        let named = json!({"type": "function", "function": {"name": "search"}});
        let cases = [
            (ToolMarkup::Dsml, "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"search\">\n<｜DSML｜parameter name=\"q\" string=\"true\">42 apples</｜DSML｜parameter>\n<｜DSML｜parameter name=\"limit\" string=\"false\">5</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>"),
            (ToolMarkup::MiniMax, "<minimax:tool_call>\n<invoke name=\"search\">\n<parameter name=\"q\">42 apples</parameter>\n<parameter name=\"tags\">[\"a\"]</parameter>\n</invoke>\n</minimax:tool_call>"),
        ];
        for (markup, text) in cases {
            let format = ModelFormat { tools: true, markup, ..ModelFormat::default() };
            let spec = tool_call(Some(&named), &tools, &format).unwrap().unwrap();
            let mut c = env.compile(&spec).unwrap();
            drive(&mut c, text);
            assert!(c.mask().unwrap().is_allowed(256), "{markup:?}: the call is complete");
            let mut c = env.compile(&spec).unwrap();
            let wrong = text.replacen("\"q\"", "\"x\"", 1);
            let at = wrong.find("\"x\"").unwrap() + 1;
            drive(&mut c, &wrong[..at]);
            assert!(!c.mask().unwrap().is_allowed(b'x' as u32), "{markup:?}: only the schema's parameters");
            // An enum's value is one of its members.
            let up_to_unit = match markup {
                ToolMarkup::Dsml => "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"search\">\n<｜DSML｜parameter name=\"q\" string=\"true\">a</｜DSML｜parameter>\n<｜DSML｜parameter name=\"unit\" string=\"true\">",
                _ => "<minimax:tool_call>\n<invoke name=\"search\">\n<parameter name=\"q\">a</parameter>\n<parameter name=\"unit\">",
            };
            let mut c = env.compile(&spec).unwrap();
            drive(&mut c, up_to_unit);
            let m = c.mask().unwrap();
            assert!(m.is_allowed(b'k' as u32) && m.is_allowed(b'm' as u32) && !m.is_allowed(b'x' as u32), "{markup:?}: enum values only");
            let opts = ParserOptions { markup, tools: true, param_types: ParamTypes::from_tools(&tools), ..ParserOptions::default() };
            let mut p = OutputParser::new(opts);
            let mut out = vec![];
            p.push(text, &mut out);
            p.finish(&mut out);
            let Some(Parsed::ToolCall(call)) = out.first() else { panic!("{markup:?}: {out:?}") };
            assert_eq!((call.name.as_str(), &call.arguments["q"]), ("search", &json!("42 apples")), "{markup:?}");
        }
    }

    /// A string parameter's `pattern` holds in the XML markups: anchored and unanchored, with
    /// the length limits kept.
    #[test]
    fn xml_string_parameters_follow_their_pattern() {
        use crate::sampling::grammar::GrammarEnv;
        assert_eq!(pattern_regex("^[A-Z]{3}$"), "/([A-Z]{3})/");
        assert_eq!(pattern_regex("a/b"), "/(?s:.*)(a\\/b)(?s:.*)/");
        let mut bytes: Vec<Vec<u8>> = (0u8..=255).map(|b| vec![b]).collect();
        bytes.push([&[0xFF][..], b"<eos>"].concat());
        let env = GrammarEnv::new(bytes, 257, 256).unwrap();
        let tools = vec![json!({"type": "function", "function": {"name": "f", "parameters": {"type": "object",
            "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-\\d{2}$"}, "note": {"type": "string", "pattern": "ok", "maxLength": 6}},
            "required": ["code", "note"]}}})];
        let named = json!({"type": "function", "function": {"name": "f"}});
        for markup in [ToolMarkup::MiniMax, ToolMarkup::Dsml] {
            let format = ModelFormat { tools: true, markup, ..ModelFormat::default() };
            let spec = tool_call(Some(&named), &tools, &format).unwrap().unwrap();
            let (open, close, open2) = match markup {
                ToolMarkup::Dsml => (
                    "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"code\" string=\"true\">",
                    "</｜DSML｜parameter>\n",
                    "<｜DSML｜parameter name=\"note\" string=\"true\">",
                ),
                _ => ("<minimax:tool_call>\n<invoke name=\"f\">\n<parameter name=\"code\">", "</parameter>\n", "<parameter name=\"note\">"),
            };
            let mut c = env.compile(&spec).unwrap();
            drive(&mut c, open);
            let m = c.mask().unwrap();
            assert!(m.is_allowed(b'Q' as u32) && !m.is_allowed(b'q' as u32) && !m.is_allowed(b'<' as u32), "{markup:?}: anchored pattern");
            drive(&mut c, "ABC-1");
            assert!(!c.mask().unwrap().is_allowed(b'<' as u32), "{markup:?}: the pattern is not complete yet");
            drive(&mut c, "2");
            drive(&mut c, close);
            drive(&mut c, open2);
            // Unanchored: any text that contains `ok`, within maxLength 6.
            drive(&mut c, "xxxx");
            let m = c.mask().unwrap();
            assert!(m.is_allowed(b'o' as u32) && !m.is_allowed(b'z' as u32) && !m.is_allowed(b'<' as u32), "{markup:?}: room only for `ok`");
            drive(&mut c, "ok");
            assert!(c.mask().unwrap().is_allowed(b'<' as u32), "{markup:?}: done");
        }
    }

    /// Strict tools under `auto` in harmony: messages on any channel stay free, a header
    /// addressed to a function must be one of the tools, and a strict tool's arguments follow
    /// its schema.
    #[test]
    fn strict_tools_under_auto_in_harmony() {
        use crate::sampling::grammar::GrammarEnv;
        let specials = ["<|channel|>", "<|constrain|>", "<|message|>", "<|end|>", "<|start|>", "<|return|>"];
        let mut bytes: Vec<Vec<u8>> = (0u8..=255).map(|b| vec![b]).collect();
        bytes.extend(specials.iter().map(|s| [&[0xFF][..], s.as_bytes()].concat()));
        let id = |s: &str| 256 + specials.iter().position(|x| *x == s).unwrap() as u32;
        let env = GrammarEnv::new(bytes, 262, id("<|return|>")).unwrap();
        let format = ModelFormat { tools: true, markup: ToolMarkup::Harmony, ..ModelFormat::default() };
        let mut raw = tools();
        raw[0]["function"]["strict"] = json!(true);
        let spec = strict_calls(&raw, &tools(), &format).expect("a grammar for harmony");
        let step = |c: &mut crate::sampling::grammar::Constraint, part: &str| {
            if let Some(tok) = specials.iter().position(|s| *s == part) {
                assert!(c.mask().unwrap().is_allowed(256 + tok as u32), "{part} must be allowed");
                c.consume(256 + tok as u32).unwrap();
            } else {
                drive(c, part);
            }
        };
        // Thinking, then a call to the strict tool.
        let mut c = env.compile(&spec).unwrap();
        for part in ["<|channel|>", "analysis", "<|message|>", "Need x. to=functions is fine in a body.", "<|end|>", "<|start|>", "assistant", "<|channel|>", "commentary to=functions."] {
            step(&mut c, part);
        }
        let m = c.mask().unwrap();
        assert!(m.is_allowed(b'a' as u32) && m.is_allowed(b'b' as u32) && !m.is_allowed(b'z' as u32), "only the offered tools");
        for part in ["a ", "<|constrain|>", "json", "<|message|>", "{\"x\": "] {
            step(&mut c, part);
        }
        let m = c.mask().unwrap();
        assert!(m.is_allowed(b'7' as u32) && !m.is_allowed(b'"' as u32), "the strict tool's integer");
        step(&mut c, "7}");
        assert!(c.mask().unwrap().is_allowed(id("<|return|>")), "the call ends the output");
        // A plain answer on the final channel is free and may end.
        let mut c = env.compile(&spec).unwrap();
        for part in ["<|channel|>", "final", "<|message|>", "Hello <b>there</b>."] {
            step(&mut c, part);
        }
        assert!(c.mask().unwrap().is_allowed(id("<|return|>")));
    }

    /// A forced call in gpt-oss's harmony markup names its special tokens: over a vocabulary
    /// of single bytes plus those tokens, the matcher admits exactly the call's tokens, and
    /// what it admits parses back into the call.
    #[test]
    fn forced_harmony_call_uses_the_special_tokens() {
        use crate::sampling::grammar::GrammarEnv;
        use crate::server::parsers::{OutputParser, Parsed, ParserOptions};
        let specials = ["<|channel|>", "<|constrain|>", "<|message|>", "<|return|>"];
        let mut bytes: Vec<Vec<u8>> = (0u8..=255).map(|b| vec![b]).collect();
        bytes.extend(specials.iter().map(|s| [&[0xFF][..], s.as_bytes()].concat()));
        let id = |s: &str| 256 + specials.iter().position(|x| *x == s).unwrap() as u32;
        let env = GrammarEnv::new(bytes, 260, id("<|return|>")).unwrap();
        let format = ModelFormat { tools: true, markup: ToolMarkup::Harmony, ..ModelFormat::default() };
        let named = json!({"type": "function", "function": {"name": "b"}});
        let spec = tool_call(Some(&named), &tools(), &format).unwrap().unwrap();
        let mut c = env.compile(&spec).unwrap();
        // Drive the matcher along the call the model is forced to write.
        let mut text = String::new();
        let mut feed = |c: &mut crate::sampling::grammar::Constraint, tok: u32, shown: &str| {
            let m = c.mask().unwrap();
            assert!(m.is_allowed(tok), "{shown:?} must be allowed after {text:?}");
            c.consume(tok).unwrap();
            text.push_str(shown);
        };
        assert!(!c.mask().unwrap().is_allowed(b'c' as u32), "the call starts with <|channel|>");
        feed(&mut c, id("<|channel|>"), "<|channel|>");
        for b in "commentary to=functions.b ".bytes() {
            feed(&mut c, b as u32, &(b as char).to_string());
        }
        feed(&mut c, id("<|constrain|>"), "<|constrain|>");
        for b in "json".bytes() {
            feed(&mut c, b as u32, &(b as char).to_string());
        }
        feed(&mut c, id("<|message|>"), "<|message|>");
        for b in "{\"x\": 3}".bytes() {
            feed(&mut c, b as u32, &(b as char).to_string());
        }
        assert!(c.mask().unwrap().is_allowed(id("<|return|>")), "the call is complete: the output may end");
        let mut p = OutputParser::new(ParserOptions { markup: ToolMarkup::Harmony, tools: true, ..ParserOptions::default() });
        let mut out = vec![];
        p.push(&text, &mut out);
        p.finish(&mut out);
        let Some(Parsed::ToolCall(call)) = out.first() else { panic!("{out:?}") };
        assert_eq!((call.name.as_str(), call.arguments_json()), ("b", "{\"x\":3}".to_string()));
    }
}
