//! SentencePiece vocabularies (`tokenizer.ggml.model = "llama"`: Llama 2, Mistral, Mixtral) as
//! the tokenizer.json transformers' LlamaTokenizerFast writes for them.
//!
//! llama.cpp's SPM tokenizer repeatedly merges the adjacent pair whose concatenation is the
//! highest-scoring vocabulary piece and falls back to `<0xXX>` byte tokens for what no piece
//! covers. A HF BPE model does the same when every way of splitting a piece into two pieces is a
//! merge ranked by that piece's score, and `byte_fallback` is on; GGUF keeps no merges for this
//! model, so they are derived here from the pieces and scores.

use std::collections::HashMap;

use serde_json::{json, Map, Value as Json};

use super::{
    vocab_entries, Keys, TokenEntry, TYPE_BYTE, TYPE_CONTROL, TYPE_NORMAL,
    TYPE_UNKNOWN, TYPE_USER_DEFINED,
};
use crate::tokenizer::TokenizerError;

const KEY_SCORES: &str = "tokenizer.ggml.scores";
const KEY_ADD_SPACE_PREFIX: &str = "tokenizer.ggml.add_space_prefix";

/// SentencePiece's escaped space.
const SPACE: &str = "\u{2581}";

/// A BPE tokenizer.json with byte fallback and metaspace handling for a SentencePiece
/// vocabulary; `unk` is the `unknown_token_id`, when the file names one.
pub(super) fn sentencepiece_bpe(
    keys: &Keys,
    tokens: &[TokenEntry],
    unk: Option<usize>,
) -> Result<Json, TokenizerError> {
    let scores = keys.f64_array(KEY_SCORES)?.ok_or_else(|| {
        keys.error(
            KEY_SCORES,
            "missing (a SentencePiece vocabulary needs its scores)".into(),
        )
    })?;
    if scores.len() != tokens.len() {
        let msg = format!("{} entries for {} tokens", scores.len(), tokens.len());
        return Err(keys.error(KEY_SCORES, msg));
    }
    if let Some(id) = scores.iter().position(|s| s.is_nan()) {
        let msg = format!("the score of token {id} ({:?}) is NaN", tokens[id].text);
        return Err(keys.error(KEY_SCORES, msg));
    }
    // llama.cpp's default for SentencePiece vocabularies; Gemma-style files turn it off.
    let add_space_prefix = keys.bool(KEY_ADD_SPACE_PREFIX)?.unwrap_or(true);

    let mut vocab = Map::new();
    let mut added = Vec::new();
    // Pieces a merge may produce or consume: normal ones, and user-defined ones, which llama.cpp
    // also reaches by merging (sentencepiece matches those whole, as the added tokens do here).
    let mut mergeable: HashMap<&str, usize> = HashMap::new();
    for (id, tok) in vocab_entries(keys, tokens)? {
        // Every piece keeps its id in the model (as in LlamaTokenizerFast), so ids_to_tokens
        // and byte fallback see all of them; the ones typed into text as a whole are also
        // added tokens, matched before the model runs.
        vocab.insert(tok.text.to_string(), json!(id));
        if matches!(tok.kind, TYPE_NORMAL | TYPE_USER_DEFINED) {
            mergeable.insert(tok.text, id);
        }
        if matches!(tok.kind, TYPE_CONTROL | TYPE_USER_DEFINED | TYPE_UNKNOWN) {
            added.push(json!({
                "id": id,
                "content": tok.text,
                "single_word": false,
                "lstrip": false,
                "rstrip": false,
                "normalized": false,
                "special": tok.kind != TYPE_USER_DEFINED,
            }));
        }
    }

    let merges = derive_merges(tokens, &scores, &mergeable);
    let unk_text = unk
        .or_else(|| tokens.iter().position(|t| t.kind == TYPE_UNKNOWN))
        .map(|i| tokens[i].text);
    // HF's byte fallback needs every byte of a character as a token, else it emits unk; a
    // vocabulary without byte pieces was trained to emit unk, so leave it off there.
    let byte_fallback = tokens.iter().any(|t| t.kind == TYPE_BYTE);

    let replace_space = json!({"type": "Replace", "pattern": {"String": " "}, "content": SPACE});
    let normalizer = if add_space_prefix {
        json!({"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": SPACE}, replace_space]})
    } else {
        replace_space
    };
    let mut decoders = vec![
        json!({"type": "Replace", "pattern": {"String": SPACE}, "content": " "}),
        json!({"type": "ByteFallback"}),
        json!({"type": "Fuse"}),
    ];
    if add_space_prefix {
        decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
    }
    // A normalizer, not a Metaspace pre-tokenizer: it prepends the space to every stretch of
    // text between added tokens, as llama.cpp does after each special token (and as
    // LlamaTokenizerFast in legacy mode, the mode Llama 2 and Mixtral ship with).
    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": normalizer,
        "pre_tokenizer": null,
        "post_processor": null,
        "decoder": {"type": "Sequence", "decoders": decoders},
        "model": {
            "type": "BPE",
            "dropout": null,
            "unk_token": unk_text,
            "continuing_subword_prefix": null,
            "end_of_word_suffix": null,
            "fuse_unk": true,
            "byte_fallback": byte_fallback,
            "ignore_merges": false,
            "vocab": vocab,
            "merges": merges,
        },
    }))
}

/// Every split of a mergeable piece into two mergeable pieces, highest piece score first.
///
/// Within one score the order is transformers' SentencePieceExtractor's: by piece id, then by
/// the ids of the two parts. sentencepiece breaks a score tie by position (leftmost first),
/// which no fixed rank can express; it only matters for distinct pieces of equal score, and
/// sentencepiece's BPE trainer gives every normal piece its own score.
fn derive_merges(
    tokens: &[TokenEntry],
    scores: &[f64],
    mergeable: &HashMap<&str, usize>,
) -> Vec<Json> {
    let mut ordered: Vec<(usize, usize, usize)> = Vec::new();
    for (id, tok) in tokens.iter().enumerate() {
        if mergeable.get(tok.text) != Some(&id) {
            continue;
        }
        let start = ordered.len();
        for (pos, _) in tok.text.char_indices().skip(1) {
            let (left, right) = tok.text.split_at(pos);
            if let (Some(&l), Some(&r)) = (mergeable.get(left), mergeable.get(right)) {
                ordered.push((id, l, r));
            }
        }
        ordered[start..].sort_unstable_by_key(|&(_, l, r)| (l, r));
    }
    // Stable, so equal scores keep the id order built above.
    ordered.sort_by(|a, b| scores[b.0].total_cmp(&scores[a.0]));
    ordered
        .into_iter()
        .map(|(_, l, r)| json!([tokens[l].text, tokens[r].text]))
        .collect()
}
