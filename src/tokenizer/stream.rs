//! Incremental, UTF-8-safe detokenization for streaming generated text.

use super::{Tokenizer, TokenizerError};

/// Held-back tokens beyond which pending text is emitted anyway (U+FFFD included). A UTF-8
/// sequence needs at most 3 more bytes, so this only triggers on output that can never
/// complete, and it keeps the decode window (and per-token cost) bounded on garbage output.
const MAX_PENDING_TOKENS: usize = 32;

/// Incremental, UTF-8-safe detokenizer (prefix-offset / read-offset technique).
///
/// Each step decodes only a short window: the tokens already emitted at the previous step
/// (context, so decoders that strip a leading space or merge pieces behave as in a full
/// decode) plus the tokens not yet emitted, and returns the text beyond the context's text.
/// Text ending in U+FFFD is held back, because the last token may end mid-character.
/// Concatenating every [`StreamDecoder::step`] result and a final [`StreamDecoder::flush`]
/// gives exactly `decode(all_ids)`. (One exception, inherent to byte-fallback vocabularies:
/// their decoder turns a whole run of byte tokens into U+FFFD when any byte of the run is
/// invalid UTF-8, which would rewrite characters already streamed; it needs invalid output.)
#[derive(Debug, Clone, Default)]
pub struct StreamDecoder {
    skip_special: bool,
    /// Window: ids[..read] were emitted at the previous step; ids[read..] are pending.
    ids: Vec<u32>,
    read: usize,
    /// decode(ids[..read]), cached because every step diffs against it.
    prefix: String,
}

impl StreamDecoder {
    /// A decoder with an empty history.
    pub fn new(skip_special_tokens: bool) -> Self {
        StreamDecoder {
            skip_special: skip_special_tokens,
            ..Default::default()
        }
    }

    /// Feeds one id; returns the newly completed text, or `None` while nothing new is complete.
    pub fn step(&mut self, tok: &Tokenizer, id: u32) -> Result<Option<String>, TokenizerError> {
        // A skipped special token is filtered out before the decoder runs, so leaving it out
        // of the window changes no output and keeps runs of them from growing the window.
        if self.skip_special && tok.skipped_by_decode(id) {
            return Ok(None);
        }
        self.ids.push(id);
        let text = tok.decode(&self.ids, self.skip_special)?;
        let nothing_new = text.len() <= self.prefix.len() || text.ends_with('\u{FFFD}');
        if nothing_new && self.ids.len() - self.read <= MAX_PENDING_TOKENS {
            return Ok(None);
        }
        self.emit(tok, text)
    }

    /// Emits whatever is pending, U+FFFD included (for a sequence that ended mid-character).
    pub fn flush(&mut self, tok: &Tokenizer) -> Result<Option<String>, TokenizerError> {
        if self.ids.len() == self.read {
            return Ok(None);
        }
        let text = tok.decode(&self.ids, self.skip_special)?;
        self.emit(tok, text)
    }

    /// Forgets all history (for reuse on a new sequence).
    pub fn reset(&mut self) {
        self.ids.clear();
        self.read = 0;
        self.prefix.clear();
    }

    fn emit(&mut self, tok: &Tokenizer, text: String) -> Result<Option<String>, TokenizerError> {
        let new = match text.strip_prefix(self.prefix.as_str()) {
            Some(rest) => rest.to_string(),
            None => {
                // A decoder rewrote the context text (not seen with byte-level BPE or
                // metaspace); emit from the first differing character so nothing is lost.
                let common = self
                    .prefix
                    .char_indices()
                    .zip(text.chars())
                    .find(|((_, a), b)| a != b)
                    .map_or(self.prefix.len().min(text.len()), |((i, _), _)| i);
                tracing::debug!(
                    "stream decoder context changed; output may differ from a full decode"
                );
                text.get(common..).unwrap_or_default().to_string()
            }
        };
        // The just-decoded tokens become the next context; older ones are dropped so the
        // window stays short.
        self.ids.drain(..self.read);
        self.read = self.ids.len();
        self.prefix = tok.decode(&self.ids, self.skip_special)?;
        Ok((!new.is_empty()).then_some(new))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn fixture() -> Tokenizer {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer");
        Tokenizer::from_dir(&dir).expect("fixture tokenizer loads")
    }

    #[test]
    fn stream_window_stays_short() {
        let tok = fixture();
        let text = "The router selects the top experts for every token. ".repeat(20);
        let ids = tok.encode(&text, false).unwrap();
        let mut dec = tok.stream_decoder(false);
        let mut out = String::new();
        for &id in &ids {
            out.extend(dec.step(&tok, id).unwrap());
            assert!(dec.ids.len() <= 4, "window grew to {}", dec.ids.len());
        }
        out.extend(dec.flush(&tok).unwrap());
        assert_eq!(out, tok.decode(&ids, false).unwrap());
    }

    #[test]
    fn skipped_specials_do_not_grow_the_window() {
        let tok = fixture();
        let end = tok.require_token_id("<|im_end|>").unwrap();
        let mut ids = tok.encode("Hi 世界", false).unwrap();
        ids.extend(std::iter::repeat_n(end, 100));
        ids.extend(tok.encode(" bye", false).unwrap());
        let mut dec = tok.stream_decoder(true);
        let mut out = String::new();
        for &id in &ids {
            out.extend(dec.step(&tok, id).unwrap());
            assert!(dec.ids.len() <= 8, "window grew to {}", dec.ids.len());
        }
        out.extend(dec.flush(&tok).unwrap());
        assert_eq!(out, tok.decode(&ids, true).unwrap());
    }
}
