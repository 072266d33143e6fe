//! Constrained decoding with `llguidance`: a JSON schema or a Lark grammar becomes a matcher
//! that says, before each token, which ids may come next; the sampler never picks another.
//! The token trie is built from the model's own tokenizer (the bytes each id stands for).

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, SimpleVob, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};
use std::sync::Arc;

/// A grammar that failed to compile, or a matcher that failed mid-generation.
#[derive(Clone, Debug, thiserror::Error)]
#[error("{0}")]
pub struct GrammarError(pub String);

/// What the output must match.
#[derive(Clone, Debug, PartialEq)]
pub enum GrammarSpec {
    /// A JSON value matching this JSON schema (`{}`: any JSON value).
    JsonSchema(serde_json::Value),
    /// A Lark grammar (llguidance's dialect, which can embed `%json {schema}`).
    Lark(String),
}

/// `schema` with JSON written as `json.dumps` writes it (`", "` and `": "`, no other
/// whitespace): llguidance otherwise lets a model pad JSON with whitespace, which a weak or
/// random model does without end.
pub fn compact_json(mut schema: serde_json::Value) -> serde_json::Value {
    if let Some(o) = schema.as_object_mut() {
        o.entry("x-guidance").or_insert_with(|| serde_json::json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}));
    }
    schema
}

/// The tokenizer-wide part: the token trie and the parser factory, built once per model.
pub struct GrammarEnv {
    factory: ParserFactory,
}

impl GrammarEnv {
    /// The environment for a model whose logits have `vocab` entries; `token_bytes[id]` is
    /// what id stands for ([`crate::tokenizer::Tokenizer::token_bytes`]); `eos` is the id
    /// that ends a finished output.
    pub fn new(mut token_bytes: Vec<Vec<u8>>, vocab: usize, eos: u32) -> Result<GrammarEnv, GrammarError> {
        token_bytes.resize(vocab.max(token_bytes.len()), Vec::new());
        if eos as usize >= token_bytes.len() {
            return Err(GrammarError(format!("end-of-sequence id {eos} is outside the vocabulary of {}", token_bytes.len())));
        }
        let info = TokRxInfo::new(token_bytes.len() as u32, eos);
        let trie = TokTrie::from(&info, &token_bytes);
        let env: llguidance::toktrie::TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| GrammarError(e.to_string()))?;
        factory.quiet();
        Ok(GrammarEnv { factory })
    }

    /// A fresh matcher for `spec`; a schema or grammar llguidance cannot compile is an error.
    pub fn compile(&self, spec: &GrammarSpec) -> Result<Constraint, GrammarError> {
        let grammar = match spec {
            GrammarSpec::JsonSchema(s) => TopLevelGrammar::from_json_schema(compact_json(s.clone())),
            GrammarSpec::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
        };
        let parser = self.factory.create_parser(grammar).map_err(|e| GrammarError(format!("the grammar does not compile: {e}")))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(GrammarError(format!("the grammar does not compile: {e}")));
        }
        Ok(Constraint { matcher })
    }
}

/// One sequence's matcher: the ids allowed next, advanced by each sampled id.
#[derive(Clone)]
pub struct Constraint {
    matcher: Matcher,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Constraint")
    }
}

/// The ids allowed at one step.
pub struct Mask(SimpleVob);

impl Mask {
    /// Whether the grammar allows `id` next.
    pub fn is_allowed(&self, id: u32) -> bool {
        self.0.is_allowed(id)
    }

    /// Sets every logit the grammar does not allow to −∞.
    pub fn apply(&self, logits: &mut [f32]) {
        for (id, l) in logits.iter_mut().enumerate() {
            if !self.0.is_allowed(id as u32) {
                *l = f32::NEG_INFINITY;
            }
        }
    }

    /// How many ids are allowed.
    pub fn allowed(&self) -> usize {
        self.0.num_set()
    }
}

impl Constraint {
    /// The ids allowed next (only end-of-sequence once the grammar is complete).
    pub fn mask(&mut self) -> Result<Mask, GrammarError> {
        self.matcher.compute_mask_or_eos().map(Mask).map_err(|e| GrammarError(format!("constrained decoding failed: {e}")))
    }

    /// Advances past the sampled id.
    pub fn consume(&mut self, token: u32) -> Result<(), GrammarError> {
        if self.matcher.is_stopped() {
            return Ok(());
        }
        self.matcher.consume_token(token).map_err(|e| GrammarError(format!("constrained decoding failed at token {token}: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Single bytes plus a few multi-byte tokens, an end token and an unused id.
    fn env() -> GrammarEnv {
        let mut words: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        words.extend([b"true".to_vec(), b"{\"".to_vec(), b"\xFF<|end|>".to_vec(), vec![]]);
        GrammarEnv::new(words, 262, 258).expect("env")
    }

    #[test]
    fn a_schema_allows_only_matching_output_then_the_end() {
        let env = env();
        let schema = serde_json::json!({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": false});
        let mut c = env.compile(&GrammarSpec::JsonSchema(schema)).expect("compiles");
        let m = c.mask().unwrap();
        assert!(m.0.is_allowed(b'{' as u32) && !m.0.is_allowed(b'x' as u32) && !m.0.is_allowed(258));
        // Written as json.dumps writes it: a space after the colon and nowhere else.
        for &b in br#"{"ok": "# {
            assert!(c.mask().unwrap().0.is_allowed(b as u32), "{}", b as char);
            c.consume(b as u32).unwrap();
        }
        let m = c.mask().unwrap();
        assert!(m.0.is_allowed(256), "the multi-byte token `true` fits");
        assert!(!m.0.is_allowed(b'1' as u32), "a number is not a boolean");
        c.consume(256).unwrap();
        c.consume(b'}' as u32).unwrap();
        let m = c.mask().unwrap();
        assert_eq!(m.allowed(), 1);
        assert!(m.0.is_allowed(258), "complete: only the end");
        let mut logits = vec![1.0f32; 262];
        m.apply(&mut logits);
        assert_eq!(logits.iter().filter(|l| l.is_finite()).count(), 1);
    }

    #[test]
    fn bad_grammars_are_errors_not_panics() {
        let env = env();
        assert!(env.compile(&GrammarSpec::JsonSchema(serde_json::json!({"type": "nonsense"}))).is_err());
        assert!(env.compile(&GrammarSpec::Lark("start: (".into())).is_err());
        assert!(GrammarEnv::new(vec![vec![1]], 1, 5).is_err());
    }
}
