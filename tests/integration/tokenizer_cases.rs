//! Tokenizer, detokenizer and chat-template checks against transformers' reference outputs in
//! tests/fixtures/tokenizer/cases.json, plus error reporting.

use std::path::{Path, PathBuf};

use ft_actor::chat::{ChatError, ChatRequest, ChatTemplate};
use ft_actor::tokenizer::{StreamDecoder, Tokenizer, TokenizerError};
use serde_json::Value;

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer")
}

fn tokenizer() -> Tokenizer {
    Tokenizer::from_dir(&fixture_dir()).expect("fixture tokenizer loads")
}

fn cases() -> Value {
    let text =
        std::fs::read_to_string(fixture_dir().join("cases.json")).expect("cases.json readable");
    serde_json::from_str(&text).expect("cases.json parses")
}

fn ids_of(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("ids array")
        .iter()
        .map(|x| u32::try_from(x.as_u64().expect("id is an integer")).expect("id fits u32"))
        .collect()
}

/// A scratch folder under the target dir, holding a copy of the fixture's tokenizer.json.
fn scratch_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("tokenizer_cases_{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    std::fs::copy(
        fixture_dir().join("tokenizer.json"),
        dir.join("tokenizer.json"),
    )
    .expect("copy tokenizer.json");
    dir
}

#[test]
fn encode_cases_match_transformers() {
    let tok = tokenizer();
    let cases = cases();
    let encode = cases["encode"].as_array().expect("encode cases");
    assert!(!encode.is_empty());
    for case in encode {
        let text = case["text"].as_str().expect("text");
        let want_ids = ids_of(&case["ids"]);
        let ids = tok.encode(text, false).expect("encode");
        assert_eq!(ids, want_ids, "ids for {text:?}");
        let want_tokens: Vec<&str> = case["tokens"]
            .as_array()
            .expect("tokens")
            .iter()
            .map(|t| t.as_str().expect("token"))
            .collect();
        assert_eq!(tok.ids_to_tokens(&ids), want_tokens, "tokens for {text:?}");
        for (i, t) in ids.iter().zip(&want_tokens) {
            assert_eq!(tok.id_to_token(*i).as_deref(), Some(*t));
            assert_eq!(tok.token_to_id(t), Some(*i));
        }
        assert_eq!(
            tok.decode(&ids, false).expect("decode"),
            case["decoded_keep_special"].as_str().expect("keep")
        );
        assert_eq!(
            tok.decode(&ids, true).expect("decode"),
            case["decoded_skip_special"].as_str().expect("skip")
        );
        // No BOS/EOS is configured to be added for this tokenizer.
        assert_eq!(tok.encode(text, true).expect("encode"), want_ids);
    }
}

#[test]
fn serde_json_keeps_key_order() {
    // Chat templates tojson tool schemas; transformers keeps the client's key order, which
    // needs serde_json's `preserve_order` feature.
    let v: Value = serde_json::from_str(r#"{"b": 1, "a": 2}"#).expect("parse");
    let keys: Vec<&String> = v.as_object().expect("object").keys().collect();
    assert_eq!(
        keys,
        ["b", "a"],
        "enable serde_json's `preserve_order` feature in Cargo.toml"
    );
}

#[test]
fn chat_template_cases_match_transformers() {
    let tok = tokenizer();
    let template = ChatTemplate::from_tokenizer(&tok).expect("template compiles");
    let cases = cases();
    let chat = cases["chat_template"].as_array().expect("chat cases");
    assert!(!chat.is_empty());
    for case in chat {
        let name = case["name"].as_str().expect("name");
        let req = ChatRequest {
            messages: case["messages"].as_array().expect("messages").clone(),
            tools: case.get("tools").and_then(Value::as_array).cloned(),
            add_generation_prompt: case["add_generation_prompt"].as_bool().unwrap_or(false),
            enable_thinking: case.get("enable_thinking").and_then(Value::as_bool),
            ..Default::default()
        };
        let rendered = template
            .render(&req)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            rendered,
            case["rendered"].as_str().expect("rendered"),
            "render of {name}"
        );
        assert_eq!(
            tok.encode(&rendered, false).expect("encode"),
            ids_of(&case["ids"]),
            "ids of {name}"
        );
    }
}

#[test]
fn enable_thinking_absent_differs_from_false() {
    let tok = tokenizer();
    let template = ChatTemplate::from_tokenizer(&tok).expect("template compiles");
    let mut req = ChatRequest {
        messages: vec![serde_json::json!({"role": "user", "content": "Hi"})],
        add_generation_prompt: true,
        ..Default::default()
    };
    let absent = template.render(&req).expect("render");
    req.enable_thinking = Some(true);
    assert_eq!(template.render(&req).expect("render"), absent);
    req.enable_thinking = Some(false);
    let disabled = template.render(&req).expect("render");
    assert_eq!(disabled, format!("{absent}<think>\n\n</think>\n\n"));
}

#[test]
fn chat_template_jinja_takes_precedence() {
    let dir = scratch_dir("precedence");
    std::fs::write(
        dir.join("tokenizer_config.json"),
        r#"{"chat_template": "from config", "eos_token": "<|im_end|>"}"#,
    )
    .expect("write");
    assert_eq!(
        Tokenizer::from_dir(&dir).expect("load").chat_template(),
        Some("from config")
    );
    std::fs::write(dir.join("chat_template.jinja"), "from jinja").expect("write");
    assert_eq!(
        Tokenizer::from_dir(&dir).expect("load").chat_template(),
        Some("from jinja")
    );

    let dir = scratch_dir("template_list");
    let cfg = r#"{"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}],
                  "bos_token": {"content": "<|endoftext|>", "__type": "AddedToken"}}"#;
    std::fs::write(dir.join("tokenizer_config.json"), cfg).expect("write");
    let tok = Tokenizer::from_dir(&dir).expect("load");
    assert_eq!(tok.chat_template(), Some("D"));
    assert_eq!(tok.chat_template_named("tool_use"), Some("T"));
    assert_eq!(tok.bos_token(), Some("<|endoftext|>"));
    assert_eq!(tok.bos_token_id(), tok.token_to_id("<|endoftext|>"));
}

#[test]
fn add_bos_token_is_honoured() {
    let dir = scratch_dir("add_bos");
    std::fs::write(
        dir.join("tokenizer_config.json"),
        r#"{"bos_token": "<|endoftext|>", "add_bos_token": true}"#,
    )
    .expect("write");
    let tok = Tokenizer::from_dir(&dir).expect("load");
    let bos = tok.bos_token_id().expect("bos id");
    let plain = tok.encode("Hello world", false).expect("encode");
    let with = tok.encode("Hello world", true).expect("encode");
    assert_eq!(with[0], bos);
    assert_eq!(&with[1..], plain.as_slice());
}

#[test]
fn missing_tokenizer_json_names_the_path() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("tokenizer_cases_does_not_exist");
    let err = Tokenizer::from_dir(&dir).expect_err("must fail");
    assert!(matches!(err, TokenizerError::Io { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains(&dir.join("tokenizer.json").display().to_string()),
        "{msg}"
    );
}

#[test]
fn malformed_tokenizer_config_reports_position() {
    let dir = scratch_dir("malformed");
    std::fs::write(
        dir.join("tokenizer_config.json"),
        "{\n  \"eos_token\": \"<|im_end|>\",\n  oops\n}",
    )
    .expect("write");
    let err = Tokenizer::from_dir(&dir).expect_err("must fail");
    match &err {
        TokenizerError::Json { path, line, .. } => {
            assert!(path.ends_with("tokenizer_config.json"));
            assert_eq!(*line, 3);
        }
        other => panic!("unexpected error {other:?}"),
    }
    assert!(err.to_string().contains("tokenizer_config.json"), "{err}");

    std::fs::write(dir.join("tokenizer_config.json"), r#"{"chat_template": 5}"#).expect("write");
    let err = Tokenizer::from_dir(&dir).expect_err("must fail");
    assert!(
        matches!(&err, TokenizerError::Config { field, .. } if field == "chat_template"),
        "{err:?}"
    );

    std::fs::write(dir.join("tokenizer_config.json"), "{}").expect("write");
    std::fs::write(
        dir.join("tokenizer.json"),
        "{\"version\": \"1.0\", \"model\": 3}",
    )
    .expect("write");
    let err = Tokenizer::from_dir(&dir).expect_err("must fail");
    assert!(
        matches!(&err, TokenizerError::Json { path, .. } if path.ends_with("tokenizer.json")),
        "{err:?}"
    );
}

#[test]
fn raise_exception_becomes_chat_error() {
    let src = "{% for m in messages %}{% if m.role == 'bad' %}{{ raise_exception('Bad role: ' + m.role) }}{% endif %}{% endfor %}";
    let t = ChatTemplate::new(src, None, None).expect("compiles");
    let req = ChatRequest {
        messages: vec![serde_json::json!({"role": "bad"})],
        ..Default::default()
    };
    match t.render(&req) {
        Err(ChatError::Raised(msg)) => assert_eq!(msg, "Bad role: bad"),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn template_errors_carry_line_numbers() {
    match ChatTemplate::new("line one\n{% if x %}\n{{ x }\n{% endif %}", None, None) {
        Err(ChatError::Syntax { message, line }) => {
            assert_eq!(line, Some(3), "{message}");
            assert!(message.contains("chat_template"), "{message}");
        }
        other => panic!("unexpected {other:?}"),
    }
    let t = ChatTemplate::new("a\n{{ messages[0].content + 1 }}", None, None).expect("compiles");
    let req = ChatRequest {
        messages: vec![serde_json::json!({"content": "x"})],
        ..Default::default()
    };
    match t.render(&req) {
        Err(ChatError::Render { line, .. }) => assert_eq!(line, Some(2)),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn tojson_keeps_order_and_unicode() {
    let t = ChatTemplate::new(
        "{{ tools[0] | tojson }}|{{ tools[0] | tojson(indent=2) }}",
        None,
        None,
    )
    .expect("compiles");
    let tool: Value = serde_json::from_str(r#"{"name": "café", "z": [1, 2.0], "a": {"k": null}}"#)
        .expect("parse");
    let req = ChatRequest {
        tools: Some(vec![tool]),
        ..Default::default()
    };
    let out = t.render(&req).expect("render");
    assert_eq!(
        out,
        "{\"name\": \"café\", \"z\": [1, 2.0], \"a\": {\"k\": null}}|{\n  \"name\": \"café\",\n  \"z\": [\n    1,\n    2.0\n  ],\n  \"a\": {\n    \"k\": null\n  }\n}"
    );
}

#[test]
fn continue_final_message_cuts_after_content() {
    let tok = tokenizer();
    let t = ChatTemplate::from_tokenizer(&tok).expect("compiles");
    let req = ChatRequest {
        messages: vec![
            serde_json::json!({"role": "user", "content": "Hi"}),
            serde_json::json!({"role": "assistant", "content": "Hello, I"}),
        ],
        continue_final_message: true,
        ..Default::default()
    };
    assert_eq!(
        t.render(&req).expect("render"),
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello, I"
    );
}

/// Streams `ids[..k]` for every k and checks the chunks against the full decode of `ids[..k]`.
fn check_stream(tok: &Tokenizer, ids: &[u32], skip_special: bool) {
    for k in 0..=ids.len() {
        check_stream_once(tok, &ids[..k], skip_special);
    }
}

/// Streams `ids` one id at a time: every chunk must extend a prefix of the full decode and
/// hold no partial character, and chunks plus the final flush must equal the full decode.
fn check_stream_once(tok: &Tokenizer, ids: &[u32], skip_special: bool) {
    let full = tok.decode(ids, skip_special).expect("decode");
    let mut dec = StreamDecoder::new(skip_special);
    let mut streamed = String::new();
    for &id in ids {
        if let Some(chunk) = dec.step(tok, id).expect("step") {
            assert!(!chunk.is_empty());
            streamed.push_str(&chunk);
        }
        assert!(
            full.starts_with(&streamed),
            "stream {streamed:?} is not a prefix of {full:?}"
        );
    }
    if !full.contains('\u{FFFD}') {
        assert!(
            !streamed.contains('\u{FFFD}'),
            "partial character emitted: {streamed:?}"
        );
    }
    streamed.extend(dec.flush(tok).expect("flush"));
    assert_eq!(streamed, full, "ids {ids:?}");
}

#[test]
fn stream_decoder_multibyte_text() {
    let tok = tokenizer();
    let text = "héllo 世界 🦀 Ünïcödé café 日本語 🙂!";
    let ids = tok.encode(text, false).expect("encode");
    // The fixture's byte-level BPE has no merges for most of these characters, so some
    // tokens hold only part of a character; the test would prove nothing otherwise.
    let partial = ids.iter().any(|&id| {
        let piece = tok.decode(&[id], false).expect("decode");
        piece.contains('\u{FFFD}')
    });
    assert!(partial, "expected tokens that split a character");
    check_stream(&tok, &ids, false);
    assert_eq!(tok.decode(&ids, false).expect("decode"), text);
}

#[test]
fn stream_decoder_special_tokens_and_lone_bytes() {
    let tok = tokenizer();
    let text = "<|im_start|>user\nHi 🦀!<|im_end|>\n<|im_start|>assistant\n<think>\nok\n</think>\n\n世界<|im_end|>";
    let ids = tok.encode(text, false).expect("encode");
    check_stream(&tok, &ids, false);
    check_stream(&tok, &ids, true);

    // A character cut off at the end of generation only appears (as U+FFFD) on flush.
    let crab = tok.encode("🦀", false).expect("encode");
    assert!(crab.len() > 1);
    let cut = &crab[..crab.len() - 1];
    let mut dec = tok.stream_decoder(false);
    for &id in cut {
        assert_eq!(dec.step(&tok, id).expect("step"), None);
    }
    assert_eq!(dec.flush(&tok).expect("flush").as_deref(), Some("\u{FFFD}"));
    // An impossible sequence (continuation bytes with no lead byte) followed by text.
    let mut ids = cut[1..].to_vec();
    ids.extend(tok.encode("ok", false).expect("encode"));
    check_stream(&tok, &ids, false);
}

/// A Llama/Mistral-style tokenizer (metaspace, byte fallback, BOS from the post-processor),
/// the other tokenizer family the engine meets, built in memory.
fn write_metaspace_tokenizer(dir: &Path) {
    let mut vocab = serde_json::Map::new();
    for (i, t) in ["<unk>", "<s>", "</s>"].iter().enumerate() {
        vocab.insert(t.to_string(), i.into());
    }
    for b in 0..=255u32 {
        vocab.insert(format!("<0x{b:02X}>"), (3 + b).into());
    }
    let pieces = [
        "▁", "H", "e", "l", "o", "w", "r", "d", "▁H", "el", "ell", "ello", "▁w", "▁wo", "▁wor",
        "▁worl", "▁world",
    ];
    for (i, p) in pieces.iter().enumerate() {
        vocab.insert(p.to_string(), (259 + i).into());
    }
    let merges = [
        "▁ H",
        "e l",
        "el l",
        "ell o",
        "▁ w",
        "▁w o",
        "▁wo r",
        "▁wor l",
        "▁worl d",
    ];
    let added: Vec<Value> = ["<unk>", "<s>", "</s>"]
        .iter()
        .enumerate()
        .map(|(i, t)| {
            serde_json::json!({"id": i, "content": t, "single_word": false, "lstrip": false, "rstrip": false,
                               "normalized": false, "special": true})
        })
        .collect();
    let tok = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
        "pre_tokenizer": null,
        "post_processor": {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": "<s>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
                  "vocab": vocab, "merges": merges}
    });
    std::fs::write(dir.join("tokenizer.json"), tok.to_string()).expect("write tokenizer.json");
}

#[test]
fn metaspace_byte_fallback_family() {
    let dir = scratch_dir("metaspace");
    write_metaspace_tokenizer(&dir);
    std::fs::write(
        dir.join("tokenizer_config.json"),
        r#"{"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": true}"#,
    )
    .expect("write");
    let tok = Tokenizer::from_dir(&dir).expect("load");
    let text = "Hello world 世界 🦀";
    let ids = tok.encode(text, true).expect("encode");
    assert_eq!(ids[0], tok.bos_token_id().expect("bos"));
    assert_eq!(
        ids.iter()
            .filter(|&&i| Some(i) == tok.bos_token_id())
            .count(),
        1,
        "BOS added twice: {ids:?}"
    );
    assert_eq!(tok.decode(&ids, true).expect("decode"), text);
    // Byte fallback turns a whole run of byte tokens into U+FFFD when any of it is invalid,
    // so a decode cut mid-character rewrites earlier characters; only whole texts are compared.
    check_stream_once(&tok, &ids, true);
    check_stream_once(&tok, &ids, false);
    let names: Vec<&str> = tok
        .boundary_tokens()
        .iter()
        .map(|b| b.content.as_str())
        .collect();
    assert!(
        names.contains(&"</s>") && !names.contains(&"<|im_end|>"),
        "{names:?}"
    );

    // add_bos_token=false drops the post-processor's BOS, as transformers rebuilds it.
    std::fs::write(
        dir.join("tokenizer_config.json"),
        r#"{"bos_token": "<s>", "add_bos_token": false}"#,
    )
    .expect("write");
    let tok = Tokenizer::from_dir(&dir).expect("load");
    assert_eq!(
        tok.encode(text, true).expect("encode"),
        tok.encode(text, false).expect("encode")
    );
}
