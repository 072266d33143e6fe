//! The DeepSeek-V4 layer loop over a batch of sequences: hyper-connections around attention
//! (per sequence) and the MoE block (the whole batch's tokens together).

use super::attention::{attention, lin_host, upload, Ctx};
use super::hyper::{combine, rms_rows, HcShape};
use super::rope::Rotary;
use crate::model::batch::BatchItem;
use crate::model::forward::{download_f32, scratch, ExpertRunner, Trace};
use crate::model::routing::{route, route_by_table};
use crate::model::weights::{FeedForward, Mixer, MoeWeights};
use crate::model::{Model, ModelError};
use ft_backend::{BinaryOp, MatmulDesc};

impl Model {
    /// [`Model::forward_batch`] for DeepSeek-V4; items are already checked and reserved.
    pub(crate) fn forward_batch_v4(
        &self,
        items: &mut [BatchItem<'_>],
        mut trace: Option<&mut Trace>,
        experts: &mut dyn ExpertRunner,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let cfg = self.config();
        let v4 = cfg.v4.as_ref().ok_or_else(|| ModelError::Invalid("DeepSeek-V4 model without its settings".into()))?;
        let be = self.backend();
        let (h, hc) = (cfg.hidden_size, v4.hc_mult);
        let ctx = Ctx { model: self, be, cfg, v4, main: Rotary::new(&v4.rope_main, cfg.head_dim), compress: Rotary::new(&v4.rope_compress, cfg.head_dim) };
        let shape = HcShape { hc, hidden: h, norm_eps: cfg.rms_norm_eps, eps: v4.hc_eps, iters: v4.hc_sinkhorn_iters };
        let tokens: Vec<u32> = items.iter().flat_map(|i| i.tokens.iter().copied()).collect();
        let t = tokens.len();
        let mut emb = scratch(be, t * h)?;
        self.embed.lookup(be, &tokens, h, &mut emb)?;
        let emb = download_f32(be, &emb, t * h)?;
        // Every stream starts as the token's embedding.
        let mut x: Vec<f32> = emb.chunks(h).flat_map(|row| std::iter::repeat_n(row, hc).flatten().copied()).collect();
        for (l, layer) in self.layers.iter().enumerate() {
            let Mixer::DeepseekV4(w) = &layer.mixer else {
                return Err(ModelError::Invalid(format!("layer {l} is not a DeepSeek-V4 layer")));
            };
            let FeedForward::Moe(moe) = &layer.ffn else {
                return Err(ModelError::Invalid(format!("layer {l} of a DeepSeek-V4 model has no MoE block")));
            };
            let mix = w.attn_hc.mix(&x, shape);
            let normed = rms_rows(&mix.collapsed, &w.attn_norm, cfg.rms_norm_eps);
            let mut out = Vec::with_capacity(t * h);
            let mut at = 0;
            for item in items.iter_mut() {
                let ti = item.tokens.len();
                let past = item.state.len();
                let (o, seen) = attention(&ctx, w, &mut item.state.layers[l], past, &normed[at * h..(at + ti) * h], trace.is_some())?;
                out.extend(o);
                at += ti;
                if let Some(tr) = trace.as_deref_mut() {
                    if let Some(entries) = seen.entries {
                        tr.compressed.push((l, entries));
                    }
                    if let Some(chosen) = seen.chosen {
                        tr.indexer.push((l, seen.keys, chosen));
                    }
                }
            }
            x = combine(&mix, &out, &x, hc, h);

            let mix = w.ffn_hc.mix(&x, shape);
            let normed = rms_rows(&mix.collapsed, &w.ffn_norm, cfg.rms_norm_eps);
            let y = self.v4_moe(moe, w.tid2eid.as_deref(), &normed, &tokens, l, trace.as_deref_mut(), experts)?;
            x = combine(&mix, &y, &x, hc, h);
            if let Some(tr) = trace.as_deref_mut() {
                tr.hidden.push(x.clone());
            }
        }
        for item in items.iter_mut() {
            item.state.advance(item.tokens.len());
        }
        // Logits of the rows asked for: collapse the streams, norm, head.
        let mut rows = Vec::new();
        let mut at = 0;
        for item in items.iter() {
            rows.extend(item.logit_rows().map(|r| at + r));
            at += item.tokens.len();
        }
        if rows.is_empty() {
            return Ok(vec![vec![]; items.len()]);
        }
        let picked: Vec<f32> = rows.iter().flat_map(|&r| x[r * hc * h..(r + 1) * hc * h].iter().copied()).collect();
        let hcs = match &self.hc_head {
            Some(head) => head.collapse(&picked, shape),
            None => return Err(ModelError::Invalid("DeepSeek-V4 model without its hyper-connection head".into())),
        };
        let final_norm = download_f32(be, &self.final_norm, h)?;
        let normed = rms_rows(&hcs, &final_norm, cfg.rms_norm_eps);
        let vocab = cfg.vocab_size;
        let n = rows.len();
        let all = match &self.lm_head {
            Some(head) => lin_host(be, head, &normed, n)?,
            None => {
                let xd = upload(be, &normed)?;
                let mut out = scratch(be, n * vocab)?;
                crate::model::reads::matmul(be, &xd, self.lm_head(), None, &mut out, &MatmulDesc::new(n, h, vocab))?;
                download_f32(be, &out, n * vocab)?
            }
        };
        Ok(crate::model::batch::split_logits(items, &all, vocab))
    }

    /// The MoE block: routed experts through `experts`, plus the shared expert; `[t, hidden]`.
    #[allow(clippy::too_many_arguments)]
    fn v4_moe(
        &self,
        w: &MoeWeights,
        tid2eid: Option<&[u32]>,
        x: &[f32],
        tokens: &[u32],
        layer: usize,
        trace: Option<&mut Trace>,
        experts: &mut dyn ExpertRunner,
    ) -> Result<Vec<f32>, ModelError> {
        let cfg = self.config();
        let be = self.backend();
        let (h, e, t) = (cfg.hidden_size, cfg.num_experts, tokens.len());
        let xd = upload(be, x)?;
        let mut logits = scratch(be, t * e)?;
        w.router.forward(be, &xd, &mut logits, t)?;
        let logits = download_f32(be, &logits, t * e)?;
        let routing = match tid2eid {
            Some(table) => route_by_table(&w.params, table, &logits, tokens, e),
            None => route(&w.params, &logits, t, e),
        };
        let mut out = scratch(be, t * h)?;
        experts.run_experts(self, layer, &xd, &routing, &mut out)?;
        if let Some(shared) = &w.shared {
            let mut y = scratch(be, t * h)?;
            // The shared expert clamps its SwiGLU like the routed ones.
            self.mlp_with(shared, &xd, &mut y, t, cfg.expert_activation.binary_op())?;
            be.binary(BinaryOp::Add, &mut out, &y, t * h)?;
        }
        if let Some(tr) = trace {
            tr.router_logits.push((layer, logits));
            tr.routing.push((layer, routing));
        }
        download_f32(be, &out, t * h)
    }
}
