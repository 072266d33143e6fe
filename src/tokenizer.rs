//! Tokenizer loaded from a Hugging Face model folder, plus an incremental detokenizer.
//!
//! `tokenizer.json` drives encoding and decoding (through the `tokenizers` crate);
//! `tokenizer_config.json`, `special_tokens_map.json` and `chat_template.jinja` supply the
//! special-token names and the chat template, with the same precedence transformers uses.

use std::collections::HashSet;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use serde_json::Value as Json;

mod boundary;
mod stream;

pub use boundary::BoundaryToken;
pub use stream::StreamDecoder;

/// Why a tokenizer could not be loaded or used.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// A file could not be read (missing, unreadable, not UTF-8).
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file that failed.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A file is not valid JSON, or does not have the shape its reader expects.
    #[error("malformed {path}: {message}")]
    Json {
        /// The file that failed.
        path: PathBuf,
        /// 1-based line reported by serde_json (0 when unknown).
        line: usize,
        /// 1-based column reported by serde_json (0 when unknown).
        column: usize,
        /// serde_json's message, which includes the line and column.
        message: String,
    },
    /// A JSON file parsed but one field has a value this loader cannot use.
    #[error("invalid field `{field}` in {path}: {message}")]
    Config {
        /// The file that failed.
        path: PathBuf,
        /// The offending field.
        field: String,
        /// What is wrong with it.
        message: String,
    },
    /// A token string is not in the vocabulary.
    #[error("unknown token {0:?}")]
    UnknownToken(String),
    /// The `tokenizers` crate failed to encode a text.
    #[error("encoding failed: {0}")]
    Encode(String),
    /// The `tokenizers` crate failed to decode ids.
    #[error("decoding failed: {0}")]
    Decode(String),
}

/// A named special token (bos, eos, pad, unk) and its id when it exists in the vocabulary.
#[derive(Debug, Clone, PartialEq, Eq)]
struct NamedToken {
    content: String,
    id: Option<u32>,
}

/// tokenizer_config.json and special_tokens_map.json contents, with the paths errors name.
struct SideFiles<'a> {
    cfg: Option<&'a Json>,
    cfg_path: &'a Path,
    map: Option<&'a Json>,
    map_path: &'a Path,
}

/// A tokenizer for one model folder: vocabulary, special tokens and chat template(s).
#[derive(Debug, Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    vocab_size: usize,
    special_ids: Vec<u32>,
    special_set: HashSet<u32>,
    /// Ids `decode(.., skip_special_tokens = true)` drops: added tokens flagged special.
    decode_skipped: HashSet<u32>,
    bos: Option<NamedToken>,
    eos: Option<NamedToken>,
    pad: Option<NamedToken>,
    unk: Option<NamedToken>,
    add_bos_token: Option<bool>,
    add_eos_token: Option<bool>,
    /// (name, source); the unnamed/legacy template is stored as "default".
    chat_templates: Vec<(String, String)>,
    boundary: Vec<BoundaryToken>,
}

impl Tokenizer {
    /// Loads `tokenizer.json` (required) and the optional side files from a model folder.
    pub fn from_dir(dir: &Path) -> Result<Tokenizer, TokenizerError> {
        let tok_path = dir.join("tokenizer.json");
        let text = read_text(&tok_path)?;
        let inner: tokenizers::Tokenizer =
            serde_json::from_str(&text).map_err(|e| json_error(&tok_path, &e))?;

        let cfg_path = dir.join("tokenizer_config.json");
        let cfg = read_optional_json(&cfg_path)?;
        let map_path = dir.join("special_tokens_map.json");
        let map = read_optional_json(&map_path)?;
        let side = SideFiles {
            cfg: cfg.as_ref(),
            cfg_path: &cfg_path,
            map: map.as_ref(),
            map_path: &map_path,
        };
        Self::assemble(inner, side, || {
            load_chat_templates(dir, cfg.as_ref(), &cfg_path)
        })
    }

    /// Builds a tokenizer from in-memory tokenizer.json and tokenizer_config.json contents;
    /// `source` names where they came from in errors. Chat templates come from the config only.
    pub fn from_json(
        tokenizer_json: Json,
        tokenizer_config: Option<&Json>,
        source: &Path,
    ) -> Result<Tokenizer, TokenizerError> {
        let inner: tokenizers::Tokenizer = serde_json::from_value(tokenizer_json).map_err(|e| {
            TokenizerError::Json {
                path: source.to_path_buf(),
                line: 0,
                column: 0,
                message: format!("tokenizer.json content does not load: {e}"),
            }
        })?;
        let side = SideFiles {
            cfg: tokenizer_config,
            cfg_path: source,
            map: None,
            map_path: source,
        };
        Self::assemble(inner, side, || config_chat_templates(tokenizer_config, source))
    }

    /// Rebuilds the tokenizer, special tokens and chat templates of a GGUF file from its
    /// metadata; `path` (the GGUF file) names the source in errors.
    pub fn from_gguf(
        meta: &crate::model::gguf::Metadata,
        path: &Path,
    ) -> Result<Tokenizer, TokenizerError> {
        let files = crate::model::gguf::tokenizer::tokenizer_files(meta, path)?;
        Self::from_json(files.tokenizer_json, Some(&files.tokenizer_config), path)
    }

    /// The tokenizer of a model path: a folder's files, or a GGUF file's metadata.
    pub fn open(path: &Path) -> Result<Tokenizer, TokenizerError> {
        if !crate::model::gguf::is_gguf(path) {
            return Self::from_dir(path);
        }
        let file = crate::model::gguf::GgufFile::open(path).map_err(|e| TokenizerError::Json {
            path: path.to_path_buf(),
            line: 0,
            column: 0,
            message: e.to_string(),
        })?;
        Self::from_gguf(file.metadata(), path)
    }

    /// The part shared by every constructor: special tokens, flags and derived id sets.
    /// Templates load last so errors come in the order `from_dir` always reported them.
    fn assemble(
        inner: tokenizers::Tokenizer,
        side: SideFiles<'_>,
        load_templates: impl FnOnce() -> Result<Vec<(String, String)>, TokenizerError>,
    ) -> Result<Tokenizer, TokenizerError> {
        let SideFiles {
            cfg,
            cfg_path,
            map,
            map_path,
        } = side;

        // tokenizer_config wins over special_tokens_map when it names a token, as in
        // transformers, where the map only fills in what the config leaves unset.
        let named = |field: &str| -> Result<Option<String>, TokenizerError> {
            if let Some(c) = cfg {
                if let Some(v) = token_field(c, field, cfg_path)? {
                    return Ok(Some(v));
                }
            }
            match map {
                Some(m) => token_field(m, field, map_path),
                None => Ok(None),
            }
        };
        let resolve = |content: Option<String>| {
            content.map(|content| NamedToken {
                id: inner.token_to_id(&content),
                content,
            })
        };
        let bos = resolve(named("bos_token")?);
        let eos = resolve(named("eos_token")?);
        let pad = resolve(named("pad_token")?);
        let unk = resolve(named("unk_token")?);

        let bool_field = |field: &str| -> Result<Option<bool>, TokenizerError> {
            match cfg.and_then(|c| c.get(field)) {
                None | Some(Json::Null) => Ok(None),
                Some(Json::Bool(b)) => Ok(Some(*b)),
                Some(other) => Err(config_error(
                    cfg_path,
                    field,
                    format!("expected a bool, got {other}"),
                )),
            }
        };
        let add_bos_token = bool_field("add_bos_token")?;
        let add_eos_token = bool_field("add_eos_token")?;
        if bool_field("clean_up_tokenization_spaces")? == Some(true) {
            tracing::debug!("clean_up_tokenization_spaces=true is ignored; decoding follows tokenizer.json only");
        }

        let chat_templates = load_templates()?;

        let added = inner.get_added_tokens_decoder();
        let decode_skipped: HashSet<u32> = added
            .iter()
            .filter(|(_, t)| t.special)
            .map(|(id, _)| *id)
            .collect();
        let mut special_set = decode_skipped.clone();
        // Configured special tokens count as special even if tokenizer.json forgot the flag,
        // matching transformers' `all_special_ids`.
        special_set.extend(
            [&bos, &eos, &pad, &unk]
                .into_iter()
                .flatten()
                .filter_map(|t| t.id),
        );
        for list_field in ["additional_special_tokens", "extra_special_tokens"] {
            for source in [cfg, map].into_iter().flatten() {
                if let Some(Json::Array(items)) = source.get(list_field) {
                    for item in items {
                        let content = item
                            .as_str()
                            .or_else(|| item.get("content").and_then(Json::as_str));
                        if let Some(id) = content.and_then(|c| inner.token_to_id(c)) {
                            special_set.insert(id);
                        }
                    }
                }
            }
        }
        let mut special_ids: Vec<u32> = special_set.iter().copied().collect();
        special_ids.sort_unstable();

        // Ids may have gaps (added tokens placed past the model vocabulary), so the size an
        // embedding table must cover is the largest id plus one, not the count of tokens.
        let vocab_size = inner
            .get_vocab(true)
            .values()
            .max()
            .map_or(0, |m| *m as usize + 1);

        let eos_content = eos.as_ref().map(|t| t.content.as_str());
        let boundary = boundary::find(&inner, eos_content, &special_set, &chat_templates);

        Ok(Tokenizer {
            inner,
            vocab_size,
            special_ids,
            special_set,
            decode_skipped,
            bos,
            eos,
            pad,
            unk,
            add_bos_token,
            add_eos_token,
            chat_templates,
            boundary,
        })
    }

    /// Encodes `text`. With `add_special_tokens`, the post-processor's tokens are added and
    /// `add_bos_token`/`add_eos_token` from tokenizer_config.json are honoured.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TokenizerError> {
        let enc = self
            .inner
            .encode(text, add_special_tokens)
            .map_err(|e| TokenizerError::Encode(e.to_string()))?;
        let mut ids = enc.get_ids().to_vec();
        if add_special_tokens {
            // Tokens inserted by the post-processor carry no sequence id; this separates a BOS
            // the template added from a literal "<s>" typed in the text.
            let seq = enc.get_sequence_ids();
            let bos_id = self.bos_token_id();
            let eos_id = self.eos_token_id();
            let added_bos =
                bos_id.is_some() && ids.first().copied() == bos_id && seq.first() == Some(&None);
            let added_eos =
                eos_id.is_some() && ids.last().copied() == eos_id && seq.last() == Some(&None);
            match (self.add_bos_token, bos_id) {
                (Some(true), Some(id)) if !added_bos => ids.insert(0, id),
                (Some(false), _) if added_bos => {
                    ids.remove(0);
                }
                _ => {}
            }
            match (self.add_eos_token, eos_id) {
                (Some(true), Some(id)) if !added_eos => ids.push(id),
                (Some(false), _) if added_eos => {
                    ids.pop();
                }
                _ => {}
            }
        }
        Ok(ids)
    }

    /// Decodes ids to text; ids outside the vocabulary are skipped, as the `tokenizers` crate does.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, TokenizerError> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| TokenizerError::Decode(e.to_string()))
    }

    /// The token strings (vocabulary form, e.g. `Ġworld`) of `ids`; unknown ids are skipped.
    pub fn ids_to_tokens(&self, ids: &[u32]) -> Vec<String> {
        ids.iter()
            .filter_map(|id| self.inner.id_to_token(*id))
            .collect()
    }

    /// The id of a token string (vocabulary form), including added tokens.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Like [`Tokenizer::token_to_id`], but an absent token is an error.
    pub fn require_token_id(&self, token: &str) -> Result<u32, TokenizerError> {
        self.token_to_id(token)
            .ok_or_else(|| TokenizerError::UnknownToken(token.to_string()))
    }

    /// The token string (vocabulary form) of an id.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The bytes each id stands for, indexed by id (for the token trie of constrained
    /// decoding): byte-level BPE symbols mapped back to bytes, SentencePiece's `▁` to a space
    /// and `<0xNN>` to its byte; special tokens as `0xFF` + their text, which is how the trie
    /// tells them from text. Ids with no token are empty.
    pub fn token_bytes(&self) -> Vec<Vec<u8>> {
        let decoder = serde_json::to_value(self.inner.get_decoder()).map(|d| d.to_string()).unwrap_or_default();
        let byte_level = decoder.contains("\"ByteLevel\"");
        let unicode_to_byte: std::collections::HashMap<char, u8> = byte_level_chars().into_iter().map(|(b, c)| (c, b)).collect();
        let added = self.inner.get_added_tokens_decoder();
        let mut out = vec![Vec::new(); self.vocab_size];
        for (token, id) in self.inner.get_vocab(true) {
            let Some(slot) = out.get_mut(id as usize) else { continue };
            *slot = match added.get(&id) {
                Some(t) if t.special => [&[0xFF][..], t.content.as_bytes()].concat(),
                Some(t) => t.content.as_bytes().to_vec(),
                None if byte_level => token
                    .chars()
                    .map(|c| unicode_to_byte.get(&c).copied())
                    .collect::<Option<Vec<u8>>>()
                    .unwrap_or_else(|| token.as_bytes().to_vec()),
                None => match token.strip_prefix("<0x").and_then(|h| h.strip_suffix('>')).and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) if token.len() == 6 => vec![b],
                    _ => token.replace('\u{2581}', " ").into_bytes(),
                },
            };
        }
        out
    }

    /// Largest token id plus one (model vocabulary and added tokens).
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Sorted ids of special tokens: added tokens flagged special plus the configured
    /// bos/eos/pad/unk and additional special tokens.
    pub fn special_ids(&self) -> &[u32] {
        &self.special_ids
    }

    /// Whether `id` is in [`Tokenizer::special_ids`].
    pub fn is_special(&self, id: u32) -> bool {
        self.special_set.contains(&id)
    }

    /// Whether `decode(.., skip_special_tokens = true)` drops `id` (an added token flagged
    /// special in tokenizer.json; narrower than [`Tokenizer::is_special`]).
    pub fn skipped_by_decode(&self, id: u32) -> bool {
        self.decode_skipped.contains(&id)
    }

    /// The BOS token string, if configured.
    pub fn bos_token(&self) -> Option<&str> {
        self.bos.as_ref().map(|t| t.content.as_str())
    }

    /// The BOS token id, if configured and present in the vocabulary.
    pub fn bos_token_id(&self) -> Option<u32> {
        self.bos.as_ref().and_then(|t| t.id)
    }

    /// The EOS token string, if configured.
    pub fn eos_token(&self) -> Option<&str> {
        self.eos.as_ref().map(|t| t.content.as_str())
    }

    /// The EOS token id, if configured and present in the vocabulary. Generation may stop on
    /// more ids than this one (generation_config.json's `eos_token_id` list).
    pub fn eos_token_id(&self) -> Option<u32> {
        self.eos.as_ref().and_then(|t| t.id)
    }

    /// The padding token string, if configured.
    pub fn pad_token(&self) -> Option<&str> {
        self.pad.as_ref().map(|t| t.content.as_str())
    }

    /// The padding token id, if configured and present in the vocabulary.
    pub fn pad_token_id(&self) -> Option<u32> {
        self.pad.as_ref().and_then(|t| t.id)
    }

    /// The unknown-token string, if configured.
    pub fn unk_token(&self) -> Option<&str> {
        self.unk.as_ref().map(|t| t.content.as_str())
    }

    /// The default chat template: `chat_template.jinja` if present, else tokenizer_config's
    /// `chat_template` (a string, or the entry named "default" of a list).
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template_named("default")
    }

    /// A named chat template (e.g. "tool_use" from a list, or additional_chat_templates/NAME.jinja).
    pub fn chat_template_named(&self, name: &str) -> Option<&str> {
        self.chat_templates
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, s)| s.as_str())
    }

    /// Names of all chat templates found, in load order.
    pub fn chat_template_names(&self) -> impl Iterator<Item = &str> {
        self.chat_templates.iter().map(|(n, _)| n.as_str())
    }

    /// Turn, reasoning and tool-call marker tokens (`<|im_end|>`, `</think>`, `<tool_call>`,
    /// `<|return|>`, `<｜end▁of▁sentence｜>`, ...) and the EOS token, for those that exist in
    /// this vocabulary, plus every special token the chat template writes; ids are looked up
    /// by content, never assumed.
    pub fn boundary_tokens(&self) -> &[BoundaryToken] {
        &self.boundary
    }

    /// The ids of [`Tokenizer::boundary_tokens`].
    pub fn boundary_ids(&self) -> Vec<u32> {
        self.boundary.iter().map(|b| b.id).collect()
    }

    /// A fresh incremental detokenizer for this tokenizer.
    pub fn stream_decoder(&self, skip_special_tokens: bool) -> StreamDecoder {
        StreamDecoder::new(skip_special_tokens)
    }
}

fn read_text(path: &Path) -> Result<String, TokenizerError> {
    std::fs::read_to_string(path).map_err(|source| TokenizerError::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn json_error(path: &Path, e: &serde_json::Error) -> TokenizerError {
    TokenizerError::Json {
        path: path.to_path_buf(),
        line: e.line(),
        column: e.column(),
        message: e.to_string(),
    }
}

fn config_error(path: &Path, field: &str, message: String) -> TokenizerError {
    TokenizerError::Config {
        path: path.to_path_buf(),
        field: field.to_string(),
        message,
    }
}

/// Reads a JSON file that may be absent; any other failure is an error.
fn read_optional_json(path: &Path) -> Result<Option<Json>, TokenizerError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(TokenizerError::Io {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| json_error(path, &e))
}

/// Reads a text file that may be absent.
fn read_optional_text(path: &Path) -> Result<Option<String>, TokenizerError> {
    match std::fs::read_to_string(path) {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(source) => Err(TokenizerError::Io {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// A special-token field: a string, an AddedToken object (`{"content": ..}`), or null.
fn token_field(doc: &Json, field: &str, path: &Path) -> Result<Option<String>, TokenizerError> {
    match doc.get(field) {
        None | Some(Json::Null) => Ok(None),
        Some(Json::String(s)) => Ok(Some(s.clone())),
        Some(obj @ Json::Object(_)) => match obj.get("content") {
            Some(Json::String(s)) => Ok(Some(s.clone())),
            _ => Err(config_error(
                path,
                field,
                "token object without a string `content`".into(),
            )),
        },
        Some(other) => Err(config_error(
            path,
            field,
            format!("expected a string or token object, got {other}"),
        )),
    }
}

/// Collects chat templates with transformers' precedence: chat_template.jinja replaces the
/// config's default; additional_chat_templates/*.jinja add named ones; chat_template.json
/// (processor folders) is the last resort for the default.
fn load_chat_templates(
    dir: &Path,
    cfg: Option<&Json>,
    cfg_path: &Path,
) -> Result<Vec<(String, String)>, TokenizerError> {
    let mut out = config_chat_templates(cfg, cfg_path)?;
    if let Some(src) = read_optional_text(&dir.join("chat_template.jinja"))? {
        out.retain(|(n, _)| n != "default");
        out.insert(0, ("default".into(), src));
    }
    let extra_dir = dir.join("additional_chat_templates");
    if let Ok(entries) = std::fs::read_dir(&extra_dir) {
        let mut files: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        files.sort();
        for path in files {
            let (Some(stem), Some("jinja")) = (
                path.file_stem().and_then(|s| s.to_str()),
                path.extension().and_then(|s| s.to_str()),
            ) else {
                continue;
            };
            if out.iter().any(|(n, _)| n == stem) {
                continue;
            }
            out.push((stem.to_string(), read_text(&path)?));
        }
    }
    if !out.iter().any(|(n, _)| n == "default") {
        let path = dir.join("chat_template.json");
        if let Some(doc) = read_optional_json(&path)? {
            if let Some(s) = doc.get("chat_template").and_then(Json::as_str) {
                out.insert(0, ("default".into(), s.to_string()));
            }
        }
    }
    Ok(out)
}

/// The chat templates tokenizer_config's `chat_template` holds: a string (stored as
/// "default") or a list of `{name, template}` entries.
fn config_chat_templates(
    cfg: Option<&Json>,
    cfg_path: &Path,
) -> Result<Vec<(String, String)>, TokenizerError> {
    let mut out: Vec<(String, String)> = Vec::new();
    match cfg.and_then(|c| c.get("chat_template")) {
        None | Some(Json::Null) => {}
        Some(Json::String(s)) => out.push(("default".into(), s.clone())),
        Some(Json::Array(items)) => {
            for item in items {
                let name = item.get("name").and_then(Json::as_str);
                let template = item.get("template").and_then(Json::as_str);
                match (name, template) {
                    (Some(n), Some(t)) => out.push((n.to_string(), t.to_string())),
                    _ => {
                        let msg = "list entries must be objects with string `name` and `template`";
                        return Err(config_error(cfg_path, "chat_template", msg.into()));
                    }
                }
            }
        }
        Some(other) => {
            let msg = format!("expected a string or a list, got {}", json_kind(other));
            return Err(config_error(cfg_path, "chat_template", msg));
        }
    }
    Ok(out)
}

fn json_kind(v: &Json) -> &'static str {
    match v {
        Json::Null => "null",
        Json::Bool(_) => "a bool",
        Json::Number(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "a list",
        Json::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture() -> Tokenizer {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer");
        Tokenizer::from_dir(&dir).expect("fixture tokenizer loads")
    }

    #[test]
    fn fixture_special_tokens_and_boundaries() {
        let tok = fixture();
        assert_eq!(tok.eos_token(), Some("<|im_end|>"));
        assert_eq!(tok.eos_token_id(), tok.token_to_id("<|im_end|>"));
        assert_eq!(tok.bos_token(), None);
        assert_eq!(tok.pad_token(), Some("<|endoftext|>"));
        assert!(tok.is_special(tok.require_token_id("<|im_start|>").unwrap()));
        assert!(!tok.is_special(tok.require_token_id("</think>").unwrap()));
        assert_eq!(tok.vocab_size(), 1024);
        let names: Vec<&str> = tok
            .boundary_tokens()
            .iter()
            .map(|b| b.content.as_str())
            .collect();
        for want in [
            "<|im_end|>",
            "<|endoftext|>",
            "</think>",
            "<tool_call>",
            "</tool_response>",
        ] {
            assert!(names.contains(&want), "{want} missing from {names:?}");
        }
        assert!(!names.contains(&"<|return|>"));
        assert!(matches!(
            tok.require_token_id("<nope>"),
            Err(TokenizerError::UnknownToken(_))
        ));
    }
}

/// GPT-2's byte-level alphabet: each byte and the printable character standing for it.
fn byte_level_chars() -> Vec<(u8, char)> {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut next = 256u32;
    (0..=255u8)
        .map(|b| {
            if printable(b) {
                (b, b as char)
            } else {
                let c = char::from_u32(next).unwrap_or('\u{FFFD}');
                next += 1;
                (b, c)
            }
        })
        .collect()
}
