//! One forward pass over several sequences at once: their tokens share every weight read
//! (the mixers' projections, routed experts, the head), and only the part of a token mixer
//! that reads a sequence's own state (attention over its cache, the delta rule over its
//! recurrent state) runs per sequence.

use super::forward::{download_f32, scratch, ExpertRunner, Logits, Trace};
use super::mixer::Span;
use super::weights::{FeedForward, Mixer};
use super::{Model, ModelError};
use crate::kv::SequenceState;
use ft_backend::{BinaryOp, MatmulDesc, RmsNormDesc};

/// One sequence's part of a batched step.
pub struct BatchItem<'a> {
    /// Its state, advanced by `tokens`.
    pub state: &'a mut SequenceState,
    /// The tokens it advances by (a decoded token, or a chunk of its prompt).
    pub tokens: &'a [u32],
    /// Which of its logits come back.
    pub logits: Logits,
}

impl BatchItem<'_> {
    fn check(&self, model: &Model) -> Result<(), ModelError> {
        let cfg = model.config();
        let t = self.tokens.len();
        if t == 0 {
            return Err(ModelError::Invalid("forward called with no tokens".into()));
        }
        if self.state.layers.len() != model.layers.len() {
            return Err(ModelError::Invalid(format!(
                "sequence state has {} layers, the model {}",
                self.state.layers.len(),
                model.layers.len()
            )));
        }
        if self.state.len() + t > self.state.capacity() {
            return Err(ModelError::ContextOverflow { needed: self.state.len() + t, capacity: self.state.capacity() });
        }
        if let Some(bad) = self.tokens.iter().find(|&&id| id as usize >= cfg.vocab_size) {
            return Err(ModelError::Invalid(format!("token id {bad} is outside the vocabulary (size {})", cfg.vocab_size)));
        }
        Ok(())
    }

    /// Rows of this item's logits, relative to its first token.
    pub(crate) fn logit_rows(&self) -> std::ops::Range<usize> {
        let t = self.tokens.len();
        match self.logits {
            Logits::None => t..t,
            Logits::All => 0..t,
            Logits::Last => t - 1..t,
        }
    }
}

impl Model {
    /// Runs every item's tokens after the tokens already in its state, all through each layer
    /// together; returns each item's logits as [`Model::forward`] would.
    ///
    /// A token's result does not depend on the batch it is in, up to the matmul kernels'
    /// summation order for different token counts. On error every item's state is unusable
    /// (see [`Model::forward_with`]).
    pub fn forward_batch(
        &self,
        items: &mut [BatchItem<'_>],
        mut trace: Option<&mut Trace>,
        experts: &mut dyn ExpertRunner,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        if items.is_empty() {
            return Ok(vec![]);
        }
        for item in items.iter() {
            item.check(self)?;
        }
        for item in items.iter_mut() {
            let needed = item.state.len() + item.tokens.len();
            item.state.reserve(needed)?;
        }
        if self.config().v4.is_some() {
            return self.forward_batch_v4(items, trace, experts);
        }
        let cfg = self.config();
        let be = self.backend();
        let h = cfg.hidden_size;
        let tokens: Vec<u32> = items.iter().flat_map(|i| i.tokens.iter().copied()).collect();
        let t = tokens.len();
        let offsets: Vec<usize> = items
            .iter()
            .scan(0, |at, i| {
                let o = *at;
                *at += i.tokens.len();
                Some(o)
            })
            .collect();
        let pasts: Vec<usize> = items.iter().map(|i| i.state.len()).collect();
        let positions: Vec<Vec<u32>> =
            items.iter().zip(&pasts).map(|(i, &p)| (p..p + i.tokens.len()).map(|p| p as u32).collect()).collect();
        let mut x = scratch(be, t * h)?;
        self.embed.lookup(be, &tokens, h, &mut x)?;
        let mut normed = scratch(be, t * h)?;
        let mut delta = scratch(be, t * h)?;
        let norm = RmsNormDesc { rows: t, dim: h, eps: cfg.rms_norm_eps, unit_offset: cfg.norm_unit_offset };
        let all_positions: Vec<u32> = positions.concat();
        for (l, layer) in self.layers.iter().enumerate() {
            be.rms_norm(&x, &layer.input_norm, &mut normed, &norm)?;
            let mut spans: Vec<Span<'_>> = items
                .iter_mut()
                .zip(&offsets)
                .zip(&pasts)
                .map(|((item, &offset), &past)| {
                    let len = item.tokens.len();
                    let (state, pages) = item.state.layer_and_pages(l);
                    Span { layer: l, state, pages, past, offset, len }
                })
                .collect();
            match &layer.mixer {
                Mixer::Attention(w) => self.attention(w, cfg.layer_kinds[l], &mut spans, &all_positions, &normed, &mut delta)?,
                Mixer::Mla(w) => self.mla(w, &mut spans, &all_positions, &normed, &mut delta)?,
                Mixer::DeltaNet(w) => self.delta_net(w, &mut spans, t, &normed, &mut delta)?,
                Mixer::DeepseekV4(_) => return Err(ModelError::Invalid("a DeepSeek-V4 layer in another family's model".into())),
            }
            be.binary(BinaryOp::Add, &mut x, &delta, t * h)?;
            be.rms_norm(&x, &layer.post_attention_norm, &mut normed, &norm)?;
            match &layer.ffn {
                FeedForward::Dense(mlp) => self.mlp(mlp, &normed, &mut delta, t)?,
                FeedForward::Moe(moe) => {
                    let routing = self.moe(moe, &normed, &mut delta, t, l, trace.as_deref_mut(), experts)?;
                    if let Some(tr) = trace.as_deref_mut() {
                        tr.routing.push((l, routing));
                    }
                }
            }
            be.binary(BinaryOp::Add, &mut x, &delta, t * h)?;
            if let Some(tr) = trace.as_deref_mut() {
                tr.hidden.push(download_f32(be, &x, t * h)?);
            }
        }
        for item in items.iter_mut() {
            item.state.advance(item.tokens.len());
        }
        let rows: Vec<u32> = items
            .iter()
            .zip(&offsets)
            .flat_map(|(i, &o)| i.logit_rows().map(move |r| (o + r) as u32))
            .collect();
        if rows.is_empty() {
            return Ok(vec![vec![]; items.len()]);
        }
        // The head reads its weights once for every row any item asked for.
        let n = rows.len();
        let mut picked = scratch(be, n * h)?;
        be.gather_rows(&x, &rows, h, &mut picked)?;
        let mut final_normed = scratch(be, n * h)?;
        be.rms_norm(&picked, &self.final_norm, &mut final_normed, &RmsNormDesc { rows: n, ..norm })?;
        let vocab = cfg.vocab_size;
        let mut out = scratch(be, n * vocab)?;
        match &self.lm_head {
            Some(head) => head.forward(be, &final_normed, &mut out, n)?,
            None => super::reads::matmul(be, &final_normed, self.lm_head(), None, &mut out, &MatmulDesc::new(n, h, vocab))?,
        }
        let all = download_f32(be, &out, n * vocab)?;
        Ok(split_logits(items, &all, vocab))
    }
}

/// Each item's rows of `all` (the logits of every row any item asked for, in item order).
pub(crate) fn split_logits(items: &[BatchItem<'_>], all: &[f32], vocab: usize) -> Vec<Vec<f32>> {
    let mut at = 0;
    items
        .iter()
        .map(|i| {
            let len = i.logit_rows().len() * vocab;
            let v = all[at..at + len].to_vec();
            at += len;
            v
        })
        .collect()
}
