//! The tokenizer of a GGUF file, rebuilt as the `tokenizer.json` and `tokenizer_config.json` a
//! Hugging Face folder would hold, so GGUF models go through the same `tokenizers`-based
//! [`crate::tokenizer::Tokenizer`] as safetensors folders.
//!
//! llama.cpp's converter stores the vocabulary as parallel arrays (`tokenizer.ggml.tokens`,
//! `token_type`, `merges`) and names the pre-tokenizer family in `tokenizer.ggml.pre`; the
//! splitting regexes themselves are not stored, so they come from the table below, written as
//! the family's own tokenizer.json writes them. SentencePiece vocabularies (model `llama`) keep
//! scores instead of merges; `spm.rs` turns them into a BPE with byte fallback.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use serde_json::{json, Map, Value as Json};

use super::{MetaValue, Metadata};
use crate::tokenizer::TokenizerError;

/// What a GGUF's metadata says about its tokenizer, as the JSON files of a HF folder.
#[derive(Debug, Clone)]
pub struct TokenizerFiles {
    /// The `tokenizers` crate's serialized tokenizer (tokenizer.json).
    pub tokenizer_json: Json,
    /// Special-token names, add_bos/add_eos and chat templates (tokenizer_config.json).
    pub tokenizer_config: Json,
}

const KEY_MODEL: &str = "tokenizer.ggml.model";
const KEY_PRE: &str = "tokenizer.ggml.pre";
const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
const KEY_TYPES: &str = "tokenizer.ggml.token_type";
const KEY_MERGES: &str = "tokenizer.ggml.merges";
const KEY_BOS: &str = "tokenizer.ggml.bos_token_id";
const KEY_EOS: &str = "tokenizer.ggml.eos_token_id";
const KEY_PAD: &str = "tokenizer.ggml.padding_token_id";
const KEY_UNK: &str = "tokenizer.ggml.unknown_token_id";
const KEY_ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
const KEY_ADD_EOS: &str = "tokenizer.ggml.add_eos_token";
const KEY_HF_JSON: &str = "tokenizer.huggingface.json";
const KEY_TEMPLATE: &str = "tokenizer.chat_template";
const KEY_TEMPLATE_NAMES: &str = "tokenizer.chat_templates";

// llama.cpp's token types (gguf-py `TokenType`).
const TYPE_NORMAL: i64 = 1;
const TYPE_UNKNOWN: i64 = 2;
const TYPE_CONTROL: i64 = 3;
const TYPE_USER_DEFINED: i64 = 4;
const TYPE_UNUSED: i64 = 5;
const TYPE_BYTE: i64 = 6;

/// One `tokenizer.ggml.pre` family: how its HF tokenizer.json splits and normalizes text.
struct PreFamily {
    /// The `tokenizer.ggml.pre` values llama.cpp maps to this family.
    names: &'static [&'static str],
    /// Split regexes applied in turn (each an `Isolated` Split), before the ByteLevel step.
    splits: &'static [&'static str],
    /// Whether the HF tokenizer has an NFC normalizer.
    nfc: bool,
    /// Whether a pre-token that is itself in the vocabulary skips the merges (llama.cpp's
    /// `ignore_merges`, HF's BPE `ignore_merges`).
    ignore_merges: bool,
    /// llama.cpp's add_bos default for the family, when the GGUF does not say.
    add_bos: bool,
}

const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
// Qwen3.5's: Qwen2's with combining marks kept with their letters (llama.cpp's `qwen35`).
const QWEN35_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const GPT4O_SPLIT: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const GPT2_SPLIT: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
const DEEPSEEK_V3_SPLITS: &[&str] = &[
    r"\p{N}{1,3}",
    "[\u{4E00}-\u{9FA5}\u{3040}-\u{309F}\u{30A0}-\u{30FF}]+",
    r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##,
];
// Cased letters of many scripts, spelled out as DeepSeek's tokenizer.json does (not \p{L}).
const DEEPSEEK_LLM_SPLITS: &[&str] = &[
    "[\r\n]",
    concat!(
        r"\s?[",
        "A-Za-z\u{B5}\u{C0}-\u{D6}\u{D8}-\u{F6}\u{F8}-\u{1BA}\u{1BC}-\u{1BF}\u{1C4}-\u{293}",
        "\u{295}-\u{2AF}\u{370}-\u{373}\u{376}\u{377}\u{37B}-\u{37D}\u{37F}\u{386}\u{388}-\u{38A}",
        "\u{38C}\u{38E}-\u{3A1}\u{3A3}-\u{3F5}\u{3F7}-\u{481}\u{48A}-\u{52F}\u{531}-\u{556}",
        "\u{10A0}-\u{10C5}\u{13A0}-\u{13F5}\u{13F8}-\u{13FD}\u{1C90}-\u{1CBA}\u{1CBD}-\u{1CBF}",
        "\u{1D00}-\u{1D2B}\u{1D6B}-\u{1D77}\u{1D79}-\u{1D9A}\u{1E00}-\u{1F15}\u{1F18}-\u{1F1D}",
        "\u{1F20}-\u{1F45}\u{1F48}-\u{1F4D}\u{1F50}-\u{1F57}\u{1F59}\u{1F5B}\u{1F5D}",
        "\u{1F5F}-\u{1F7D}\u{1F80}-\u{1FB4}\u{1FB6}-\u{1FBC}\u{1FBE}\u{1FC2}-\u{1FC4}",
        "\u{1FC6}-\u{1FCC}\u{1FD0}-\u{1FD3}\u{1FD6}-\u{1FDB}\u{1FE0}-\u{1FEC}\u{1FF2}-\u{1FF4}",
        "\u{1FF6}-\u{1FFC}\u{2102}\u{2107}\u{210A}-\u{2113}\u{2115}\u{2119}-\u{211D}\u{2124}",
        "\u{2126}\u{2128}\u{212A}-\u{212D}\u{212F}-\u{2134}\u{2139}\u{213C}-\u{213F}",
        "\u{2145}-\u{2149}\u{214E}\u{2183}\u{2184}\u{2C00}-\u{2C7B}\u{2C7E}-\u{2CE4}",
        "\u{2CEB}-\u{2CEE}\u{2CF2}\u{2CF3}\u{A640}-\u{A66D}\u{A680}-\u{A69B}\u{A722}-\u{A76F}",
        "\u{A771}-\u{A787}\u{A78B}-\u{A78E}\u{AB70}-\u{ABBF}\u{FB00}-\u{FB06}\u{FB13}-\u{FB17}",
        "\u{FF21}-\u{FF3A}\u{FF41}-\u{FF5A}\u{10400}-\u{1044F}\u{104B0}-\u{104D3}",
        "\u{104D8}-\u{104FB}\u{10C80}-\u{10CB2}\u{10CC0}-\u{10CF2}\u{118A0}-\u{118DF}",
        "\u{1E900}-\u{1E943}]+"
    ),
    concat!(
        r"\s?[",
        "!-/:-~\u{FF01}-\u{FF0F}\u{FF1A}-\u{FF5E}\u{2018}-\u{201F}\u{3000}-\u{3002}]+"
    ),
    r"\s+$",
    "[\u{4E00}-\u{9FA5}\u{800}-\u{4E00}\u{AC00}-\u{D7FF}]+",
    r"\p{N}+",
];
// llama.cpp's fallback family, for GGUFs whose converter did not recognize the tokenizer.
const DEFAULT_SPLITS: &[&str] = &[
    r"[\p{P}\$\+<=>\^~\|]+",
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
    r"\p{N}+",
    r"[0-9][0-9][0-9]",
];

const PRE_FAMILIES: &[PreFamily] = &[
    PreFamily {
        names: &["qwen2", "deepseek-r1-qwen", "megrez"],
        splits: &[QWEN2_SPLIT],
        nfc: true,
        ignore_merges: false,
        add_bos: false,
    },
    PreFamily {
        names: &["qwen35"],
        splits: &[QWEN35_SPLIT],
        nfc: true,
        ignore_merges: false,
        add_bos: false,
    },
    PreFamily {
        names: &["llama-bpe", "llama3", "llama-v3", "falcon3"],
        splits: &[LLAMA3_SPLIT],
        nfc: false,
        ignore_merges: true,
        add_bos: true,
    },
    PreFamily {
        names: &["deepseek-v3"],
        splits: DEEPSEEK_V3_SPLITS,
        nfc: false,
        ignore_merges: false,
        add_bos: false,
    },
    PreFamily {
        names: &["deepseek-llm"],
        splits: DEEPSEEK_LLM_SPLITS,
        nfc: false,
        ignore_merges: false,
        add_bos: false,
    },
    PreFamily {
        names: &["gpt-4o"],
        splits: &[GPT4O_SPLIT],
        nfc: false,
        ignore_merges: false,
        add_bos: false,
    },
    PreFamily {
        names: &["glm4", "chatglm-bpe"],
        splits: &[LLAMA3_SPLIT],
        nfc: false,
        ignore_merges: false,
        add_bos: false,
    },
    PreFamily {
        names: &["gpt-2", "gpt2"],
        splits: &[GPT2_SPLIT],
        nfc: false,
        ignore_merges: false,
        add_bos: false,
    },
    PreFamily {
        names: &["default"],
        splits: DEFAULT_SPLITS,
        nfc: false,
        ignore_merges: false,
        add_bos: false,
    },
];

/// Rebuilds tokenizer.json and tokenizer_config.json from a GGUF's `tokenizer.*` metadata;
/// `path` (the GGUF file) is only used in error messages.
pub fn tokenizer_files(meta: &Metadata, path: &Path) -> Result<TokenizerFiles, TokenizerError> {
    let keys = Keys { meta, path };
    let model = keys
        .str(KEY_MODEL)?
        .ok_or_else(|| keys.error(KEY_MODEL, "missing".into()))?;
    let tokens = keys.tokens()?;
    let bos = keys.token_id(KEY_BOS, tokens.len())?;
    let eos = keys.token_id(KEY_EOS, tokens.len())?;
    let unk = keys.token_id(KEY_UNK, tokens.len())?;

    let (tokenizer_json, default_add_bos) = match model {
        _ if meta.contains_key(KEY_HF_JSON) => {
            let text = keys
                .str(KEY_HF_JSON)?
                .ok_or_else(|| keys.error(KEY_HF_JSON, "missing".into()))?;
            let doc = serde_json::from_str(text)
                .map_err(|e| keys.error(KEY_HF_JSON, format!("not valid JSON: {e}")))?;
            (doc, false)
        }
        "gpt2" => {
            let family = keys.pre_family()?;
            (byte_level_bpe(&keys, &tokens, family)?, family.add_bos)
        }
        // llama.cpp adds a BOS for SentencePiece vocabularies unless the file says otherwise.
        "llama" => (spm::sentencepiece_bpe(&keys, &tokens, unk)?, true),
        other => {
            let msg = format!("tokenizer model `{other}` is not supported (supported: gpt2, llama)");
            return Err(keys.error(KEY_MODEL, msg));
        }
    };
    let mut tokenizer_json = tokenizer_json;

    let mut add_bos = keys.bool(KEY_ADD_BOS)?.unwrap_or(default_add_bos);
    let mut add_eos = keys.bool(KEY_ADD_EOS)?.unwrap_or(false);
    if add_bos && bos.is_none() {
        tracing::warn!("{}: add_bos_token is set but {KEY_BOS} is not; no BOS is added", path.display());
        add_bos = false;
    }
    if add_eos && eos.is_none() {
        tracing::warn!("{}: add_eos_token is set but {KEY_EOS} is not; no EOS is added", path.display());
        add_eos = false;
    }
    let content = |id: Option<usize>| id.map(|i| tokens[i].text.to_string());
    let (bos_text, eos_text) = (content(bos), content(eos));
    // An embedded tokenizer.json brings its own post-processor.
    if !meta.contains_key(KEY_HF_JSON) && (add_bos || add_eos) {
        let bos = bos.filter(|_| add_bos).map(|i| (tokens[i].text, i));
        let eos = eos.filter(|_| add_eos).map(|i| (tokens[i].text, i));
        tokenizer_json["post_processor"] = template_processor(bos, eos);
    }

    let mut config = Map::new();
    config.insert("add_bos_token".into(), json!(add_bos));
    config.insert("add_eos_token".into(), json!(add_eos));
    config.insert("bos_token".into(), json!(bos_text));
    config.insert("eos_token".into(), json!(eos_text));
    let pad = keys.token_id(KEY_PAD, tokens.len())?;
    config.insert("pad_token".into(), json!(content(pad)));
    config.insert("unk_token".into(), json!(content(unk)));
    if let Some(templates) = chat_templates(&keys)? {
        config.insert("chat_template".into(), templates);
    }
    Ok(TokenizerFiles {
        tokenizer_json,
        tokenizer_config: Json::Object(config),
    })
}

/// One entry of the token list with its llama.cpp type.
struct TokenEntry<'a> {
    text: &'a str,
    kind: i64,
}

/// Typed access to the metadata, with errors that name the key and the file.
struct Keys<'a> {
    meta: &'a Metadata,
    path: &'a Path,
}

impl<'a> Keys<'a> {
    fn error(&self, key: &str, message: String) -> TokenizerError {
        TokenizerError::Config {
            path: self.path.to_path_buf(),
            field: key.to_string(),
            message,
        }
    }

    fn wrong_type(&self, key: &str, want: &str, got: &MetaValue) -> TokenizerError {
        self.error(key, format!("expected {want}, got {}", type_desc(got)))
    }

    fn str(&self, key: &str) -> Result<Option<&'a str>, TokenizerError> {
        match self.meta.get(key) {
            None => Ok(None),
            Some(MetaValue::String(s)) => Ok(Some(s)),
            Some(other) => Err(self.wrong_type(key, "a string", other)),
        }
    }

    fn bool(&self, key: &str) -> Result<Option<bool>, TokenizerError> {
        match self.meta.get(key) {
            None => Ok(None),
            Some(MetaValue::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(self.wrong_type(key, "a bool", other)),
        }
    }

    /// A numeric array (llama.cpp writes FLOAT32) as f64.
    fn f64_array(&self, key: &str) -> Result<Option<Vec<f64>>, TokenizerError> {
        let Some(value) = self.meta.get(key) else {
            return Ok(None);
        };
        let bad = || self.wrong_type(key, "an array of numbers", value);
        let items = value.as_array().ok_or_else(bad)?;
        items
            .iter()
            .map(|v| v.as_f64().ok_or_else(bad))
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    fn str_array(&self, key: &str) -> Result<Option<Vec<&'a str>>, TokenizerError> {
        let Some(value) = self.meta.get(key) else {
            return Ok(None);
        };
        let items = value
            .as_array()
            .ok_or_else(|| self.wrong_type(key, "an array of strings", value))?;
        items
            .iter()
            .map(|v| v.as_str().ok_or_else(|| self.wrong_type(key, "an array of strings", value)))
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// The token list with types (NORMAL where `token_type` is absent).
    fn tokens(&self) -> Result<Vec<TokenEntry<'a>>, TokenizerError> {
        let texts = self
            .str_array(KEY_TOKENS)?
            .ok_or_else(|| self.error(KEY_TOKENS, "missing".into()))?;
        let kinds: Vec<i64> = match self.meta.get(KEY_TYPES) {
            None => vec![TYPE_NORMAL; texts.len()],
            Some(value) => {
                let bad = || self.wrong_type(KEY_TYPES, "an array of integers", value);
                let items = value.as_array().ok_or_else(bad)?;
                let kinds = items
                    .iter()
                    .map(|v| v.as_i64().ok_or_else(bad))
                    .collect::<Result<Vec<_>, _>>()?;
                if kinds.len() != texts.len() {
                    let msg = format!("{} entries for {} tokens", kinds.len(), texts.len());
                    return Err(self.error(KEY_TYPES, msg));
                }
                kinds
            }
        };
        Ok(texts
            .into_iter()
            .zip(kinds)
            .map(|(text, kind)| TokenEntry { text, kind })
            .collect())
    }

    fn token_id(&self, key: &str, n_tokens: usize) -> Result<Option<usize>, TokenizerError> {
        let Some(value) = self.meta.get(key) else {
            return Ok(None);
        };
        let id = value
            .as_u64()
            .ok_or_else(|| self.wrong_type(key, "a non-negative integer", value))?;
        match usize::try_from(id) {
            Ok(i) if i < n_tokens => Ok(Some(i)),
            _ => Err(self.error(key, format!("id {id} is outside the {n_tokens}-token vocabulary"))),
        }
    }

    fn pre_family(&self) -> Result<&'static PreFamily, TokenizerError> {
        let pre = match self.str(KEY_PRE)? {
            Some(p) => p,
            None => {
                // llama.cpp does the same, with the same warning: old conversions lack the key.
                tracing::warn!("{}: no {KEY_PRE}; using llama.cpp's `default` pre-tokenizer", self.path.display());
                "default"
            }
        };
        PRE_FAMILIES
            .iter()
            .find(|f| f.names.contains(&pre))
            .ok_or_else(|| {
                let known: Vec<&str> = PRE_FAMILIES.iter().flat_map(|f| f.names.iter().copied()).collect();
                let msg = format!("pre-tokenizer `{pre}` is not supported (supported: {})", known.join(", "));
                self.error(KEY_PRE, msg)
            })
    }
}

fn type_desc(v: &MetaValue) -> String {
    match v {
        MetaValue::Array(items) => match items.first() {
            Some(first) => format!("an ARRAY of {}", first.type_name()),
            None => "an empty ARRAY".into(),
        },
        other => format!("a {}", other.type_name()),
    }
}

/// Whether the entry is one of the `[PAD{id}]` placeholders the converter pads the list with up
/// to the model's embedding size, which the HF tokenizer never had.
fn is_pad_placeholder(id: usize, tok: &TokenEntry) -> bool {
    tok.kind == TYPE_UNUSED && tok.text.strip_prefix("[PAD").and_then(|s| s.strip_suffix(']')) == Some(id.to_string().as_str())
}

/// The vocabulary's real entries with their ids: the `[PAD…]` placeholders left out, and a
/// text that appears at two ids refused (either vocabulary model would keep only one).
fn vocab_entries<'a>(keys: &Keys, tokens: &'a [TokenEntry<'a>]) -> Result<Vec<(usize, &'a TokenEntry<'a>)>, TokenizerError> {
    let mut seen: HashMap<&'a str, usize> = HashMap::new();
    let mut out = Vec::with_capacity(tokens.len());
    for (id, tok) in tokens.iter().enumerate() {
        if is_pad_placeholder(id, tok) {
            continue;
        }
        if let Some(prev) = seen.insert(tok.text, id) {
            let msg = format!("token {:?} appears at ids {prev} and {id}", tok.text);
            return Err(keys.error(KEY_TOKENS, msg));
        }
        out.push((id, tok));
    }
    Ok(out)
}

/// A byte-level BPE tokenizer.json (GPT-2 style, as Qwen, Llama 3, DeepSeek and GLM use).
fn byte_level_bpe(keys: &Keys, tokens: &[TokenEntry], family: &PreFamily) -> Result<Json, TokenizerError> {
    let mut vocab = Map::new();
    let mut added_ids: HashMap<&str, usize> = HashMap::new();
    let mut added = Vec::new();
    for (id, tok) in vocab_entries(keys, tokens)? {
        match tok.kind {
            TYPE_CONTROL | TYPE_USER_DEFINED => {
                added_ids.insert(tok.text, id);
                added.push(json!({
                    "id": id,
                    "content": tok.text,
                    "single_word": false,
                    "lstrip": false,
                    "rstrip": false,
                    "normalized": false,
                    "special": tok.kind == TYPE_CONTROL,
                }));
            }
            _ => {
                vocab.insert(tok.text.to_string(), json!(id));
            }
        }
    }

    let merge_lines = keys
        .str_array(KEY_MERGES)?
        .ok_or_else(|| keys.error(KEY_MERGES, "missing (byte-level BPE needs its merges)".into()))?;
    let mut merges = Vec::with_capacity(merge_lines.len());
    let mut needed: HashSet<String> = HashSet::new();
    for (i, line) in merge_lines.iter().enumerate() {
        // As llama.cpp: the separator is the first space after the first character, so a
        // left part may itself be a lone space.
        let split = line.char_indices().skip(1).find(|&(_, c)| c == ' ').map(|(p, _)| p);
        let Some(pos) = split else {
            return Err(keys.error(KEY_MERGES, format!("entry {i} ({line:?}) is not two tokens separated by a space")));
        };
        let (left, right) = (&line[..pos], &line[pos + 1..]);
        needed.insert(format!("{left}{right}"));
        needed.insert(left.to_string());
        needed.insert(right.to_string());
        merges.push(json!([left, right]));
    }
    for text in &needed {
        if vocab.contains_key(text) {
            continue;
        }
        // An added token that merges can also build must stay reachable from the model.
        match added_ids.get(text.as_str()) {
            Some(&id) => {
                vocab.insert(text.clone(), json!(id));
            }
            None => {
                let msg = format!("a merge uses {text:?}, which is not in {KEY_TOKENS}");
                return Err(keys.error(KEY_MERGES, msg));
            }
        }
    }

    let mut pre_tokenizers: Vec<Json> = family
        .splits
        .iter()
        .map(|re| json!({"type": "Split", "pattern": {"Regex": re}, "behavior": "Isolated", "invert": false}))
        .collect();
    pre_tokenizers.push(json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}));
    let normalizer = if family.nfc { json!({"type": "NFC"}) } else { Json::Null };
    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": normalizer,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": pre_tokenizers},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE",
            "dropout": null,
            "unk_token": null,
            "continuing_subword_prefix": null,
            "end_of_word_suffix": null,
            "fuse_unk": false,
            "byte_fallback": false,
            "ignore_merges": family.ignore_merges,
            "vocab": vocab,
            "merges": merges,
        },
    }))
}

/// A TemplateProcessing post-processor that wraps each sequence in the given BOS/EOS.
fn template_processor(bos: Option<(&str, usize)>, eos: Option<(&str, usize)>) -> Json {
    let special = |t: &str, type_id: u32| json!({"SpecialToken": {"id": t, "type_id": type_id}});
    let seq = |id: &str, type_id: u32| json!({"Sequence": {"id": id, "type_id": type_id}});
    let mut single = Vec::new();
    let mut pair = Vec::new();
    for (name, type_id, out) in [("A", 0, &mut single), ("B", 1, &mut pair)] {
        if let Some((t, _)) = bos {
            out.push(special(t, type_id));
        }
        out.push(seq(name, type_id));
        if let Some((t, _)) = eos {
            out.push(special(t, type_id));
        }
    }
    // The pair template repeats the single one, then B.
    let pair: Vec<Json> = single.iter().cloned().chain(pair).collect();
    let mut specials = Map::new();
    for (t, id) in bos.into_iter().chain(eos) {
        specials.insert(t.to_string(), json!({"id": t, "ids": [id], "tokens": [t]}));
    }
    json!({"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": specials})
}

/// The chat templates in tokenizer_config form: a string, or HF's named list when the GGUF
/// also has named ones (`tokenizer.chat_template.<name>`).
fn chat_templates(keys: &Keys) -> Result<Option<Json>, TokenizerError> {
    let default = keys.str(KEY_TEMPLATE)?;
    let mut names: Vec<String> = keys
        .str_array(KEY_TEMPLATE_NAMES)?
        .unwrap_or_default()
        .into_iter()
        .map(str::to_string)
        .collect();
    // Writers other than gguf-py may leave the name list out; the keys still say it all.
    let prefix = format!("{KEY_TEMPLATE}.");
    for key in keys.meta.keys() {
        if let Some(name) = key.strip_prefix(&prefix) {
            if !names.iter().any(|n| n == name) {
                names.push(name.to_string());
            }
        }
    }
    let mut named = Vec::new();
    for name in &names {
        let key = format!("{prefix}{name}");
        match keys.str(&key)? {
            Some(t) => named.push(json!({"name": name, "template": t})),
            None => return Err(keys.error(KEY_TEMPLATE_NAMES, format!("names `{name}`, but {key} is missing"))),
        }
    }
    Ok(match (default, named.is_empty()) {
        (None, true) => None,
        (Some(t), true) => Some(json!(t)),
        (default, false) => {
            let head = default.map(|t| json!({"name": "default", "template": t}));
            Some(Json::Array(head.into_iter().chain(named).collect()))
        }
    })
}

#[path = "spm.rs"]
mod spm;

#[cfg(test)]
#[path = "tokenizer_tests.rs"]
mod tests;
