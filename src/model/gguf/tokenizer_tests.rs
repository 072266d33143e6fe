//! Round trips the fixture's HF tokenizer through GGUF-style metadata, written the way
//! llama.cpp's convert_hf_to_gguf.py writes it, and checks errors and pre-tokenizer families.

use std::path::{Path, PathBuf};

use serde_json::Value as Json;
use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};

use super::*;
use crate::tokenizer::Tokenizer;

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer")
}

fn read_json(path: &Path) -> Json {
    let text = std::fs::read_to_string(path).expect("fixture readable");
    serde_json::from_str(&text).expect("fixture parses")
}

fn strings(items: &[&str]) -> MetaValue {
    MetaValue::Array(items.iter().map(|s| MetaValue::String(s.to_string())).collect())
}

/// The `tokenizer.*` metadata convert_hf_to_gguf.py writes for a HF folder with a byte-level
/// BPE tokenizer: one token per id (holes become UNUSED `[PAD{id}]`), added tokens typed
/// CONTROL when special and USER_DEFINED otherwise, merges as "a b", ids of the named tokens.
fn hf_to_gguf_metadata(dir: &Path, pre: &str) -> Metadata {
    let tj = read_json(&dir.join("tokenizer.json"));
    let cfg = read_json(&dir.join("tokenizer_config.json"));
    let mut by_id: std::collections::BTreeMap<u64, (String, i32)> = Default::default();
    for (text, id) in tj["model"]["vocab"].as_object().expect("vocab") {
        by_id.insert(id.as_u64().expect("id"), (text.clone(), 1));
    }
    for t in tj["added_tokens"].as_array().expect("added_tokens") {
        let content = t["content"].as_str().expect("content").to_string();
        let special = t["special"].as_bool() == Some(true)
            || (content.starts_with("<|") && content.ends_with("|>"));
        by_id.insert(t["id"].as_u64().expect("id"), (content, if special { 3 } else { 4 }));
    }
    let n = by_id.keys().max().map_or(0, |m| m + 1);
    let (mut tokens, mut types) = (Vec::new(), Vec::new());
    for i in 0..n {
        let (text, kind) = by_id.get(&i).cloned().unwrap_or((format!("[PAD{i}]"), 5));
        tokens.push(MetaValue::String(text));
        types.push(MetaValue::I32(kind));
    }
    let merges: Vec<MetaValue> = tj["model"]["merges"]
        .as_array()
        .expect("merges")
        .iter()
        .map(|m| match m {
            Json::String(s) => MetaValue::String(s.clone()),
            pair => MetaValue::String(format!("{} {}", pair[0].as_str().expect("l"), pair[1].as_str().expect("r"))),
        })
        .collect();
    let id_of = |field: &str| -> Option<MetaValue> {
        let content = cfg.get(field)?.as_str()?;
        by_id
            .iter()
            .find(|(_, (t, _))| t == content)
            .map(|(id, _)| MetaValue::U32(*id as u32))
    };
    let mut meta = Metadata::new();
    meta.insert(KEY_MODEL.into(), MetaValue::String("gpt2".into()));
    meta.insert(KEY_PRE.into(), MetaValue::String(pre.into()));
    meta.insert(KEY_TOKENS.into(), MetaValue::Array(tokens));
    meta.insert(KEY_TYPES.into(), MetaValue::Array(types));
    meta.insert(KEY_MERGES.into(), MetaValue::Array(merges));
    for (field, key) in [("bos_token", KEY_BOS), ("eos_token", KEY_EOS), ("pad_token", KEY_PAD), ("unk_token", KEY_UNK)] {
        if let Some(v) = id_of(field) {
            meta.insert(key.into(), v);
        }
    }
    for (field, key) in [("add_bos_token", KEY_ADD_BOS), ("add_eos_token", KEY_ADD_EOS)] {
        if let Some(b) = cfg.get(field).and_then(Json::as_bool) {
            meta.insert(key.into(), MetaValue::Bool(b));
        }
    }
    let template = match cfg.get("chat_template").and_then(Json::as_str) {
        Some(t) => t.to_string(),
        None => std::fs::read_to_string(dir.join("chat_template.jinja")).expect("template"),
    };
    meta.insert(KEY_TEMPLATE.into(), MetaValue::String(template));
    meta
}

fn gguf_path() -> PathBuf {
    PathBuf::from("/models/fixture.gguf")
}

fn fixture_meta() -> Metadata {
    hf_to_gguf_metadata(&fixture_dir(), "qwen2")
}

fn ids_of(v: &Json) -> Vec<u32> {
    v.as_array()
        .expect("ids")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

#[test]
fn fixture_round_trip_encodes_and_decodes_like_tokenizer_json() {
    let hf = Tokenizer::from_dir(&fixture_dir()).expect("fixture loads");
    let tok = Tokenizer::from_gguf(&fixture_meta(), &gguf_path()).expect("rebuilt tokenizer loads");
    let cases = read_json(&fixture_dir().join("cases.json"));
    let encode = cases["encode"].as_array().expect("encode cases");
    assert!(!encode.is_empty());
    for case in encode {
        let text = case["text"].as_str().expect("text");
        let ids = tok.encode(text, false).expect("encode");
        assert_eq!(ids, ids_of(&case["ids"]), "ids for {text:?}");
        assert_eq!(ids, hf.encode(text, false).expect("encode"), "ids for {text:?}");
        assert_eq!(tok.encode(text, true).expect("encode"), hf.encode(text, true).expect("encode"));
        assert_eq!(tok.ids_to_tokens(&ids), hf.ids_to_tokens(&ids));
        assert_eq!(tok.decode(&ids, false).expect("decode"), case["decoded_keep_special"].as_str().expect("keep"));
        assert_eq!(tok.decode(&ids, true).expect("decode"), case["decoded_skip_special"].as_str().expect("skip"));
    }
    for case in cases["chat_template"].as_array().expect("chat cases") {
        let rendered = case["rendered"].as_str().expect("rendered");
        assert_eq!(tok.encode(rendered, false).expect("encode"), ids_of(&case["ids"]));
    }
    assert_eq!(tok.vocab_size(), hf.vocab_size());
    assert_eq!(tok.special_ids(), hf.special_ids());
    for id in 0..hf.vocab_size() as u32 {
        assert_eq!(tok.skipped_by_decode(id), hf.skipped_by_decode(id), "id {id}");
    }
    assert_eq!(tok.bos_token(), hf.bos_token());
    assert_eq!(tok.bos_token_id(), hf.bos_token_id());
    assert_eq!(tok.eos_token(), hf.eos_token());
    assert_eq!(tok.eos_token_id(), hf.eos_token_id());
    assert_eq!(tok.pad_token_id(), hf.pad_token_id());
    assert_eq!(tok.unk_token(), hf.unk_token());
    assert_eq!(tok.chat_template(), hf.chat_template());
    assert!(tok.chat_template().is_some());
    assert_eq!(tok.boundary_ids(), hf.boundary_ids());
}

#[test]
fn fixture_tokenizer_json_parts_are_reproduced() {
    let files = tokenizer_files(&fixture_meta(), &gguf_path()).expect("files");
    let want = read_json(&fixture_dir().join("tokenizer.json"));
    let got = &files.tokenizer_json;
    assert_eq!(got["added_tokens"], want["added_tokens"]);
    assert_eq!(got["normalizer"], want["normalizer"]);
    assert_eq!(got["pre_tokenizer"], want["pre_tokenizer"]);
    assert_eq!(got["decoder"], want["decoder"]);
    assert_eq!(got["post_processor"], Json::Null);
    assert_eq!(got["model"]["vocab"], want["model"]["vocab"]);
    assert_eq!(got["model"]["merges"], want["model"]["merges"]);
    assert_eq!(got["model"]["ignore_merges"], Json::Bool(false));
    let cfg = &files.tokenizer_config;
    assert_eq!(cfg["eos_token"], "<|im_end|>");
    assert_eq!(cfg["pad_token"], "<|endoftext|>");
    assert_eq!(cfg["bos_token"], Json::Null);
    assert_eq!(cfg["add_bos_token"], Json::Bool(false));
}

#[test]
fn pad_placeholders_are_dropped() {
    let mut meta = fixture_meta();
    let n = meta[KEY_TOKENS].as_array().expect("tokens").len();
    if let Some(MetaValue::Array(tokens)) = meta.get_mut(KEY_TOKENS) {
        tokens.extend((n..n + 4).map(|i| MetaValue::String(format!("[PAD{i}]"))));
    }
    if let Some(MetaValue::Array(types)) = meta.get_mut(KEY_TYPES) {
        types.extend((0..4).map(|_| MetaValue::I32(5)));
    }
    let tok = Tokenizer::from_gguf(&meta, &gguf_path()).expect("loads");
    assert_eq!(tok.vocab_size(), n);
    assert_eq!(tok.token_to_id(&format!("[PAD{n}]")), None);
    assert_eq!(tok.decode(&[n as u32], false).expect("decode"), "");
}

#[test]
fn named_chat_templates_and_add_bos() {
    let mut meta = fixture_meta();
    meta.insert(KEY_TEMPLATE_NAMES.into(), strings(&["tool_use"]));
    meta.insert(format!("{KEY_TEMPLATE}.tool_use"), MetaValue::String("T{{ x }}".into()));
    meta.insert(format!("{KEY_TEMPLATE}.rag"), MetaValue::String("R".into()));
    meta.insert(KEY_BOS.into(), MetaValue::U32(1011));
    meta.insert(KEY_ADD_BOS.into(), MetaValue::Bool(true));
    let tok = Tokenizer::from_gguf(&meta, &gguf_path()).expect("loads");
    assert!(tok.chat_template().is_some_and(|t| t.contains("<|im_start|>")));
    assert_eq!(tok.chat_template_named("tool_use"), Some("T{{ x }}"));
    assert_eq!(tok.chat_template_named("rag"), Some("R"));
    assert_eq!(tok.bos_token(), Some("<|endoftext|>"));
    let plain = tok.encode("Hello world", false).expect("encode");
    let with = tok.encode("Hello world", true).expect("encode");
    assert_eq!(with[0], 1011);
    assert_eq!(&with[1..], &plain[..]);
}

fn config_error(meta: &Metadata) -> (String, String) {
    match tokenizer_files(meta, &gguf_path()) {
        Err(e @ TokenizerError::Config { .. }) => {
            let TokenizerError::Config { ref field, .. } = e else { unreachable!() };
            (field.clone(), e.to_string())
        }
        Err(other) => panic!("unexpected error kind: {other}"),
        Ok(_) => panic!("expected an error"),
    }
}

#[test]
fn errors_name_the_key_and_file() {
    let mut meta = fixture_meta();
    meta.remove(KEY_TOKENS);
    let (field, msg) = config_error(&meta);
    assert_eq!(field, KEY_TOKENS);
    assert!(msg.contains("missing") && msg.contains("/models/fixture.gguf"), "{msg}");

    let mut meta = fixture_meta();
    meta.insert(KEY_MERGES.into(), MetaValue::Array(vec![MetaValue::I32(3)]));
    let (field, msg) = config_error(&meta);
    assert_eq!(field, KEY_MERGES);
    assert!(msg.contains("array of strings") && msg.contains("INT32"), "{msg}");
    meta.insert(KEY_MERGES.into(), MetaValue::String("a b".into()));
    assert!(config_error(&meta).1.contains("got a STRING"));
    meta.insert(KEY_MERGES.into(), strings(&["Ġ zz"]));
    assert!(config_error(&meta).1.contains("not in tokenizer.ggml.tokens"));

    let mut meta = fixture_meta();
    meta.insert(KEY_PRE.into(), MetaValue::String("klingon".into()));
    let (field, msg) = config_error(&meta);
    assert_eq!(field, KEY_PRE);
    assert!(msg.contains("`klingon`") && msg.contains("qwen2") && msg.contains("deepseek-v3"), "{msg}");

    let mut meta = fixture_meta();
    meta.insert(KEY_MODEL.into(), MetaValue::String("bert".into()));
    let msg = config_error(&meta).1;
    assert!(msg.contains("`bert` is not supported") && msg.contains("gpt2, llama"), "{msg}");

    // A text at two ids (either vocabulary model would keep one of them).
    let mut meta = fixture_meta();
    if let Some(MetaValue::Array(tokens)) = meta.get_mut(KEY_TOKENS) {
        tokens[5] = tokens[4].clone();
    }
    let (field, msg) = config_error(&meta);
    assert_eq!(field, KEY_TOKENS);
    assert!(msg.contains("appears at ids 4 and 5"), "{msg}");

    let mut meta = fixture_meta();
    meta.insert(KEY_EOS.into(), MetaValue::U32(999_999));
    let (field, msg) = config_error(&meta);
    assert_eq!(field, KEY_EOS);
    assert!(msg.contains("999999"), "{msg}");
}

#[test]
fn unloadable_tokenizer_reports_the_cause() {
    let mut meta = fixture_meta();
    meta.insert(KEY_HF_JSON.into(), MetaValue::String(r#"{"model": {"type": "Nope"}}"#.into()));
    let err = Tokenizer::from_gguf(&meta, &gguf_path()).expect_err("must fail");
    let msg = err.to_string();
    assert!(msg.contains("/models/fixture.gguf") && msg.contains("does not load"), "{msg}");
    assert!(!msg.contains("cannot read"), "{msg}");
}

/// The pre-tokenizer pieces of `text` under a rebuilt tokenizer.json.
fn pieces(files: &TokenizerFiles, text: &str) -> Vec<String> {
    let pre: tokenizers::PreTokenizerWrapper =
        serde_json::from_value(files.tokenizer_json["pre_tokenizer"].clone()).expect("pre_tokenizer");
    let mut s = PreTokenizedString::from(text);
    pre.pre_tokenize(&mut s).expect("pre_tokenize");
    s.get_splits(OffsetReferential::Original, OffsetType::Byte)
        .into_iter()
        .map(|(_, (a, b), _)| text[a..b].to_string())
        .collect()
}

#[test]
fn every_family_builds_and_segments_like_llama_cpp() {
    let text = "Hello WORLD's 12345 日本語かな\n\n  x=1;";
    for family in PRE_FAMILIES {
        for name in family.names {
            let mut meta = hf_to_gguf_metadata(&fixture_dir(), name);
            meta.insert(KEY_BOS.into(), MetaValue::U32(1011));
            let tok = Tokenizer::from_gguf(&meta, &gguf_path()).unwrap_or_else(|e| panic!("{name}: {e}"));
            let ids = tok.encode(text, false).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(tok.decode(&ids, false).expect("decode"), text, "{name}");
        }
    }
    let files = |pre: &str| {
        let mut meta = hf_to_gguf_metadata(&fixture_dir(), pre);
        meta.insert(KEY_BOS.into(), MetaValue::U32(1011));
        // Without the key, the family's llama.cpp default decides.
        meta.remove(KEY_ADD_BOS);
        tokenizer_files(&meta, &gguf_path()).expect("files")
    };
    let qwen = files("qwen2");
    assert_eq!(pieces(&qwen, "ab 123"), ["ab", " ", "1", "2", "3"]);
    assert_eq!(pieces(&qwen, "e\u{301}x 12"), ["e", "\u{301}x", " ", "1", "2"]);
    // Qwen3.5 keeps a combining mark with its letter.
    assert_eq!(pieces(&files("qwen35"), "e\u{301}x 12"), ["e\u{301}x", " ", "1", "2"]);
    let llama3 = files("llama-bpe");
    assert_eq!(pieces(&llama3, "I'VE 12345"), ["I", "'VE", " ", "123", "45"]);
    assert_eq!(llama3.tokenizer_json["model"]["ignore_merges"], Json::Bool(true));
    assert_eq!(llama3.tokenizer_config["add_bos_token"], Json::Bool(true));
    let v3 = files("deepseek-v3");
    assert_eq!(pieces(&v3, "abc日本語かな1234 x"), ["abc", "日本語かな", "123", "4", " x"]);
    let ds = files("deepseek-llm");
    // The third split's `:-~` range covers ASCII letters too, so it re-splits a mixed word
    // the second one isolated; llama.cpp applies the same list in the same order.
    assert_eq!(pieces(&ds, "Héllo 日本 42!"), ["H", "é", "llo", " ", "日本", " ", "42", "!"]);
    let o200k = files("gpt-4o");
    assert_eq!(pieces(&o200k, "HelloWorld 12345"), ["Hello", "World", " ", "123", "45"]);
    let gpt2 = files("gpt-2");
    assert_eq!(pieces(&gpt2, "Hello  world"), ["Hello", " ", " world"]);
}

const PY_TOKENIZER_WRITER: &str = r#"
import json, sys, gguf
src, out = sys.argv[1], sys.argv[2]
tj = json.load(open(src + "/tokenizer.json", encoding="utf-8"))
cfg = json.load(open(src + "/tokenizer_config.json", encoding="utf-8"))
rev = {i: t for t, i in tj["model"]["vocab"].items()}
kinds = {}
for a in tj["added_tokens"]:
    rev[a["id"]] = a["content"]
    kinds[a["id"]] = gguf.TokenType.CONTROL if a["special"] else gguf.TokenType.USER_DEFINED
tokens = [rev[i] for i in range(max(rev) + 1)]
types = [kinds.get(i, gguf.TokenType.NORMAL) for i in range(len(tokens))]
w = gguf.GGUFWriter(out, "qwen3moe")
w.add_tokenizer_model("gpt2")
w.add_tokenizer_pre("qwen2")
w.add_token_list(tokens)
w.add_token_types(types)
w.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in tj["model"]["merges"]])
w.add_eos_token_id(tokens.index(cfg["eos_token"]))
w.add_pad_token_id(tokens.index(cfg["pad_token"]))
w.add_add_bos_token(False)
w.add_chat_template(cfg["chat_template"])
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
"#;

/// The Python (`FT_PYTHON` or `.venv/bin/python`) if it can import `modules`; `None` with a
/// message when it cannot, a failure with `FT_REQUIRE_GGUF_PY=1` (CI, which installs them).
fn python_with(modules: &str, check: &str) -> Option<PathBuf> {
    let python = std::env::var_os("FT_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python"));
    let require = std::env::var("FT_REQUIRE_GGUF_PY").is_ok_and(|v| v == "1");
    let probe = std::process::Command::new(&python).args(["-c", &format!("import {modules}")]).output();
    if probe.as_ref().is_ok_and(|o| o.status.success()) {
        return Some(python);
    }
    let why = match &probe {
        Ok(o) => String::from_utf8_lossy(&o.stderr).into_owned(),
        Err(e) => e.to_string(),
    };
    let shown = python.display();
    assert!(!require, "FT_REQUIRE_GGUF_PY=1 but {shown} cannot import {modules} (run .ci/install-python.sh): {why}");
    eprintln!("skipping {check}: {shown} cannot import {modules} ({why}); run .ci/install-python.sh");
    None
}

#[test]
fn loads_a_tokenizer_written_by_gguf_py() {
    let Some(python) = python_with("gguf", "the gguf-py tokenizer check") else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("ft_gguf_tokenizer_{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let out = dir.join("tok.gguf");
    let run = std::process::Command::new(&python)
        .args(["-c", PY_TOKENIZER_WRITER])
        .arg(fixture_dir())
        .arg(&out)
        .output()
        .expect("run python");
    assert!(run.status.success(), "gguf-py writer failed: {}", String::from_utf8_lossy(&run.stderr));
    let file = crate::model::gguf::file::GgufFile::open(&out).expect("gguf-py file opens");
    let tok = Tokenizer::from_gguf(file.metadata(), &out).expect("tokenizer from gguf-py metadata");
    let hf = Tokenizer::from_dir(&fixture_dir()).expect("fixture loads");
    let cases = read_json(&fixture_dir().join("cases.json"));
    for case in cases["encode"].as_array().expect("encode cases") {
        let text = case["text"].as_str().expect("text");
        let ids = tok.encode(text, true).expect("encode");
        assert_eq!(ids, ids_of(&case["ids"]), "ids for {text:?}");
        assert_eq!(tok.decode(&ids, true).expect("decode"), hf.decode(&ids, true).expect("decode"));
    }
    assert_eq!(tok.eos_token_id(), hf.eos_token_id());
    assert_eq!(tok.pad_token_id(), hf.pad_token_id());
    assert_eq!(tok.special_ids(), hf.special_ids());
    assert_eq!(tok.chat_template(), hf.chat_template());
    let _ = std::fs::remove_dir_all(&dir);
}

/// SentencePiece metadata as convert_hf_to_gguf.py writes it: `<unk>`, `<s>`, `</s>`, the 256
/// byte pieces, then `pieces` (NORMAL, with their scores).
fn spm_meta(pieces: &[(&str, f32)]) -> Metadata {
    let mut tokens = vec!["<unk>".to_string(), "<s>".into(), "</s>".into()];
    let mut types = vec![2, 3, 3];
    let mut scores = vec![0.0f32; 3];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
        scores.push(0.0);
    }
    for (text, score) in pieces {
        tokens.push(text.to_string());
        types.push(1);
        scores.push(*score);
    }
    let mut meta = Metadata::new();
    meta.insert(KEY_MODEL.into(), MetaValue::String("llama".into()));
    meta.insert(KEY_PRE.into(), MetaValue::String("default".into()));
    meta.insert(KEY_TOKENS.into(), MetaValue::Array(tokens.into_iter().map(MetaValue::String).collect()));
    meta.insert(KEY_TYPES.into(), MetaValue::Array(types.into_iter().map(MetaValue::I32).collect()));
    meta.insert("tokenizer.ggml.scores".into(), MetaValue::Array(scores.into_iter().map(MetaValue::F32).collect()));
    meta.insert(KEY_BOS.into(), MetaValue::U32(1));
    meta.insert(KEY_EOS.into(), MetaValue::U32(2));
    meta.insert(KEY_UNK.into(), MetaValue::U32(0));
    meta
}

/// Pieces whose scores make llama.cpp's highest-score-first merging differ from both
/// leftmost-first and longest-match segmentation.
const SPM_PIECES: &[(&str, f32)] = &[
    ("▁", -10.0),
    ("a", -10.0),
    ("b", -10.0),
    ("c", -10.0),
    ("ab", -1.0),
    ("bc", -0.5),
    ("▁a", -2.0),
    ("▁ab", -3.0),
    ("abc", -4.0),
];

#[test]
fn sentencepiece_merges_by_score_with_byte_fallback() {
    let meta = spm_meta(SPM_PIECES);
    let id = |piece: &str| 259 + SPM_PIECES.iter().position(|(p, _)| *p == piece).expect("piece") as u32;
    let byte = |b: u8| 3 + u32::from(b);
    let tok = Tokenizer::from_gguf(&meta, &gguf_path()).expect("loads");
    // "▁abc▁ab", merged by hand as llama.cpp would: bc (-0.5), then the second ab (-1), then
    // ▁a (-2) beats abc (-4), then ▁ab (-3); ▁abc is no piece.
    let ids = tok.encode("abc ab", true).expect("encode");
    assert_eq!(ids, [1, id("▁a"), id("bc"), id("▁ab")]);
    assert_eq!(tok.decode(&ids, true).expect("decode"), "abc ab");
    assert_eq!(tok.decode(&ids, false).expect("decode"), "<s> abc ab");
    // `d` and `é` are no pieces: one byte token per UTF-8 byte.
    let ids = tok.encode("dé", false).expect("encode");
    assert_eq!(ids, [id("▁"), byte(b'd'), byte(0xC3), byte(0xA9)]);
    assert_eq!(tok.decode(&ids, false).expect("decode"), "dé");
    // A control token in the text is matched whole; the text after it gets its own prefix.
    let ids = tok.encode("ab</s>c", false).expect("encode");
    assert_eq!(ids, [id("▁ab"), 2, id("▁"), id("c")]);
    assert_eq!(tok.encode("", true).expect("encode"), [1]);
    assert_eq!(tok.encode("", false).expect("encode"), Vec::<u32>::new());
    assert_eq!(tok.bos_token(), Some("<s>"));
    assert_eq!(tok.eos_token_id(), Some(2));
    assert_eq!(tok.unk_token(), Some("<unk>"));
    assert_eq!(tok.special_ids(), [0, 1, 2]);
    assert_eq!(tok.vocab_size(), 259 + SPM_PIECES.len());

    let mut meta = spm_meta(SPM_PIECES);
    meta.insert("tokenizer.ggml.add_space_prefix".into(), MetaValue::Bool(false));
    meta.insert(KEY_ADD_BOS.into(), MetaValue::Bool(false));
    let tok = Tokenizer::from_gguf(&meta, &gguf_path()).expect("loads");
    // "abc▁ab": bc, ab, then ▁ab (-3) before abc (-4).
    let ids = tok.encode("abc ab", true).expect("encode");
    assert_eq!(ids, [id("abc"), id("▁ab")]);
    assert_eq!(tok.decode(&ids, true).expect("decode"), "abc ab");
    assert_eq!(tok.decode(&tok.encode(" a", true).expect("encode"), true).expect("decode"), " a");
}

#[test]
fn sentencepiece_metadata_errors_name_the_key() {
    let scores = "tokenizer.ggml.scores";
    let mut meta = spm_meta(SPM_PIECES);
    meta.remove(scores);
    let (field, msg) = config_error(&meta);
    assert_eq!(field, scores);
    assert!(msg.contains("missing") && msg.contains("/models/fixture.gguf"), "{msg}");

    let mut meta = spm_meta(SPM_PIECES);
    if let Some(MetaValue::Array(s)) = meta.get_mut(scores) {
        s.pop();
    }
    let (field, msg) = config_error(&meta);
    assert_eq!(field, scores);
    assert!(msg.contains("267 entries for 268 tokens"), "{msg}");

    let mut meta = spm_meta(SPM_PIECES);
    meta.insert(scores.into(), strings(&["x"]));
    assert!(config_error(&meta).1.contains("array of numbers"));
    meta.insert(scores.into(), MetaValue::F32(0.0));
    assert!(config_error(&meta).1.contains("got a FLOAT32"));

    let mut meta = spm_meta(SPM_PIECES);
    if let Some(MetaValue::Array(s)) = meta.get_mut(scores) {
        s[260] = MetaValue::F32(f32::NAN);
    }
    let (field, msg) = config_error(&meta);
    assert_eq!(field, scores);
    assert!(msg.contains("token 260 (\"a\") is NaN"), "{msg}");

    let mut meta = spm_meta(SPM_PIECES);
    meta.insert("tokenizer.ggml.add_space_prefix".into(), MetaValue::U8(1));
    assert_eq!(config_error(&meta).0, "tokenizer.ggml.add_space_prefix");

    let mut meta = spm_meta(SPM_PIECES);
    if let Some(MetaValue::Array(t)) = meta.get_mut(KEY_TOKENS) {
        t[262] = MetaValue::String("a".into());
    }
    let (field, msg) = config_error(&meta);
    assert_eq!(field, KEY_TOKENS);
    assert!(msg.contains("ids 260 and 262"), "{msg}");
}

/// Trains SentencePiece BPE models with the `sentencepiece` package, has gguf-py write them as
/// llama.cpp's converter does (tests/python/spm_to_gguf.py), and checks that the rebuilt
/// tokenizer encodes and decodes every case exactly as sentencepiece does.
#[test]
fn sentencepiece_gguf_matches_sentencepiece() {
    let Some(python) = python_with("gguf, sentencepiece", "the SentencePiece GGUF check") else {
        return;
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = std::env::temp_dir().join(format!("ft_gguf_spm_{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let run = std::process::Command::new(&python)
        .arg(root.join("tests/python/spm_to_gguf.py"))
        .arg(&dir)
        .arg(fixture_dir().join("cases.json"))
        .output()
        .expect("run python");
    assert!(run.status.success(), "spm_to_gguf.py failed: {}", String::from_utf8_lossy(&run.stderr));
    let expected = read_json(&dir.join("expected.json"));
    let variants = expected.as_object().expect("variants");
    assert_eq!(variants.len(), 2);
    for (name, variant) in variants {
        let path = PathBuf::from(variant["gguf"].as_str().expect("gguf path"));
        let file = crate::model::gguf::file::GgufFile::open(&path).expect("gguf-py file opens");
        let tok = Tokenizer::from_gguf(file.metadata(), &path).expect("tokenizer from gguf-py metadata");
        let bos = variant["bos"].as_u64().expect("bos") as u32;
        assert_eq!(tok.bos_token_id(), Some(bos), "{name}");
        let cases = variant["cases"].as_array().expect("cases");
        let mut byte_fallback = false;
        for case in cases {
            let text = case["text"].as_str().expect("text");
            let want = ids_of(&case["ids"]);
            let ids = tok.encode(text, true).expect("encode");
            assert_eq!(ids, want, "{name}: ids for {text:?}: {:?}", tok.ids_to_tokens(&ids));
            let decoded = tok.decode(&ids, true).expect("decode");
            assert_eq!(decoded, case["decoded"].as_str().expect("decoded"), "{name}: decode of {text:?}");
            if !text.contains("</s>") && !text.contains("<s>") {
                assert_eq!(decoded, text, "{name}: round trip");
            }
            // Streaming decodes a short window at a time; the leading-space strip and byte
            // runs must still come out as in the full decode.
            let mut stream = tok.stream_decoder(true);
            let mut streamed = String::new();
            for &id in &ids {
                streamed.extend(stream.step(&tok, id).expect("stream step"));
            }
            streamed.extend(stream.flush(&tok).expect("stream flush"));
            assert_eq!(streamed, decoded, "{name}: streamed decode of {text:?}");
            byte_fallback |= tok.ids_to_tokens(&ids).iter().any(|t| t.starts_with("<0x"));
        }
        assert!(cases.len() > 20 && byte_fallback, "{name}: the cases must reach byte fallback");
        // The converter's `[PAD{id}]` placeholders are not part of the tokenizer.
        let n_tokens = file.metadata()[KEY_TOKENS].as_array().expect("tokens").len();
        assert_eq!(tok.vocab_size(), n_tokens - 3, "{name}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
