//! Gated DeltaNet (Qwen3-Next, Qwen3.5): input projections, causal short convolution,
//! gated delta rule over the recurrent state, gated RMSNorm and output projection.
//!
//! Prefill and decode run the same backend ops over however many tokens arrive, continuing
//! from the layer's carried state, so a sequence fed in any split gives the same result.

use super::{gather_units, gcd, put_rows, take_rows, Span};
use crate::kv::LayerState;
use crate::model::forward::scratch;
use crate::model::weights::{DeltaNetProjections, DeltaNetWeights, Linear};
use crate::model::{Model, ModelError};
use ft_backend::{BinaryOp, ConvDesc, DeltaRuleDesc, DeltaRuleInputs, DeviceBuffer, RmsNormDesc};

/// `(qkv [t, conv_dim], z [t, Hv·dv], b [t, Hv], a [t, Hv])`.
type Projected = (DeviceBuffer, DeviceBuffer, DeviceBuffer, DeviceBuffer);

impl Model {
    /// The linear-attention mixer of the step's new tokens (normed input `x`, `[t, hidden]`,
    /// the sequences' rows one after another as `spans` say).
    pub(crate) fn delta_net(
        &self,
        w: &DeltaNetWeights,
        spans: &mut [Span<'_>],
        t: usize,
        x: &DeviceBuffer,
        out: &mut DeviceBuffer,
    ) -> Result<(), ModelError> {
        let cfg = self.config();
        let be = self.backend();
        let l = cfg.linear_attn.ok_or_else(|| ModelError::Invalid("linear-attention layer without its settings".into()))?;
        let (hk, hv, dk, dv) = (l.num_k_heads, l.num_v_heads, l.k_head_dim, l.v_head_dim);
        let (qkv, mut z, b, a) = self.delta_net_inputs(w, t, x)?;
        let mut core = scratch(be, t * hv * dv)?;
        let single = spans.len() == 1;
        for sp in spans.iter_mut() {
            let LayerState::Recurrent { conv, state } = &mut *sp.state else {
                return Err(ModelError::Invalid("linear-attention layer given a non-recurrent state".into()));
            };
            let n = sp.len;
            // Alone, the sequence's rows are the whole batch: no copies in or out.
            let parts = if single {
                None
            } else {
                Some((
                    take_rows(be, &qkv, sp.offset, n, l.conv_dim())?,
                    take_rows(be, &b, sp.offset, n, hv)?,
                    take_rows(be, &a, sp.offset, n, hv)?,
                ))
            };
            let (qkv_i, b_i, a_i) = match &parts {
                Some((q, b, a)) => (q, b, a),
                None => (&qkv, &b, &a),
            };
            let mut mixed = scratch(be, n * l.conv_dim())?;
            let conv_desc = ConvDesc { n_tokens: n, channels: l.conv_dim(), kernel: l.conv_kernel, silu: true };
            be.causal_conv1d(qkv_i, &w.conv, conv, &mut mixed, &conv_desc)?;
            let inputs = DeltaRuleInputs { qkv: &mixed, beta_logits: b_i, decay_in: a_i, a_log: &w.a_log, dt_bias: &w.dt_bias };
            let desc = DeltaRuleDesc {
                n_tokens: n,
                n_k_heads: hk,
                n_v_heads: hv,
                k_head_dim: dk,
                v_head_dim: dv,
                l2norm_eps: 1e-6,
                scale: 1.0 / (dk as f32).sqrt(),
            };
            if single {
                be.gated_delta_rule(&inputs, state, &mut core, &desc)?;
            } else {
                let mut ci = scratch(be, n * hv * dv)?;
                be.gated_delta_rule(&inputs, state, &mut ci, &desc)?;
                put_rows(be, &ci, &mut core, sp.offset, n, hv * dv)?;
            }
        }
        // Gated RMSNorm per value head: norm(core) · w · silu(z); its weight is plain `w`.
        let mut normed = scratch(be, t * hv * dv)?;
        let norm = RmsNormDesc { rows: t * hv, dim: dv, eps: cfg.rms_norm_eps, unit_offset: false };
        be.rms_norm(&core, &w.norm, &mut normed, &norm)?;
        be.binary(BinaryOp::SwiGlu, &mut z, &normed, t * hv * dv)?;
        w.out.forward(be, &z, out, t)
    }

    /// Projects `x` into the convolution input, the output gate and the two gate inputs.
    fn delta_net_inputs(&self, w: &DeltaNetWeights, t: usize, x: &DeviceBuffer) -> Result<Projected, ModelError> {
        let be = self.backend();
        let l = self.config().linear_attn.ok_or_else(|| ModelError::Invalid("linear-attention layer without its settings".into()))?;
        let (hk, hv, dk, dv) = (l.num_k_heads, l.num_v_heads, l.k_head_dim, l.v_head_dim);
        match &w.proj {
            DeltaNetProjections::Split { qkv, z, b, a } => {
                let (mut y_qkv, mut y_z) = (scratch(be, t * qkv.out_dim)?, scratch(be, t * z.out_dim)?);
                let (mut y_b, mut y_a) = (scratch(be, t * b.out_dim)?, scratch(be, t * a.out_dim)?);
                Linear::forward_same_x(be, x, t, &mut [(qkv, &mut y_qkv), (z, &mut y_z), (b, &mut y_b), (a, &mut y_a)])?;
                Ok((y_qkv, y_z, y_b, y_a))
            }
            DeltaNetProjections::Grouped { qkvz, ba } => {
                // Qwen3-Next groups the projections per key head: [q dk | k dk | v r·dv | z r·dv]
                // and [b r | a r], r = Hv/Hk. Regroup into all-q, all-k, all-v (the order the
                // convolution's channels use), z, b and a.
                let r = hv / hk;
                let u = gcd(dk, dv);
                let (qk_units, v_units) = (dk / u, r * dv / u);
                let group = 2 * qk_units + 2 * v_units;
                let (mut mixed, mut gates) = (scratch(be, t * qkvz.out_dim)?, scratch(be, t * ba.out_dim)?);
                Linear::forward_same_x(be, x, t, &mut [(qkvz, &mut mixed), (ba, &mut gates)])?;
                let part = |first: usize, len: usize| {
                    (0..t).flat_map(move |tok| (0..hk).flat_map(move |g| (0..len).map(move |i| (tok * hk + g) * group + first + i)))
                };
                let qkv_ids = (0..t).flat_map(|tok| {
                    let q = (0..hk).flat_map(move |g| (0..qk_units).map(move |i| (tok * hk + g) * group + i));
                    let k = (0..hk).flat_map(move |g| (0..qk_units).map(move |i| (tok * hk + g) * group + qk_units + i));
                    let v = (0..hk).flat_map(move |g| (0..v_units).map(move |i| (tok * hk + g) * group + 2 * qk_units + i));
                    q.chain(k).chain(v)
                });
                let qkv = gather_units(be, &mixed, qkv_ids, u)?;
                let z = gather_units(be, &mixed, part(2 * qk_units + v_units, v_units), u)?;
                let b = gather_units(be, &gates, (0..t * hv).map(|i| (i / hv) * 2 * hv + (i % hv / r) * 2 * r + i % r), 1)?;
                let a = gather_units(be, &gates, (0..t * hv).map(|i| (i / hv) * 2 * hv + (i % hv / r) * 2 * r + r + i % r), 1)?;
                Ok((qkv, z, b, a))
            }
        }
    }
}
