//! The plain reference forward pass: one layer after another on the backend, experts
//! straight from host memory. It stays as the oracle the actor pipeline is checked against.

use super::routing::{route, Routing};
use super::weights::{AttentionWeights, FeedForward, HostMatrix, MoeWeights, Mlp};
use super::{Model, ModelError};
use crate::kv::{LayerState, SequenceState};
use ft_backend::{
    AttentionDesc, Backend, BinaryOp, BufferUsage, CopyDesc, DType, DeviceBuffer, MatmulDesc, RmsNormDesc, RopeDesc,
    StreamId,
};

/// Which logits a forward pass returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// `[tokens, vocab]`.
    All,
    /// `[vocab]` of the last token only (decode, and prefill before sampling).
    Last,
    /// None (prefill of a prefix whose continuation is known).
    None,
}

/// Intermediate values a caller may ask for (tests compare them to transformers).
#[derive(Default, Debug)]
pub struct Trace {
    /// Per MoE layer index: the raw router logits `[tokens, experts]`.
    pub router_logits: Vec<(usize, Vec<f32>)>,
    /// Per MoE layer index: the routing chosen.
    pub routing: Vec<(usize, Routing)>,
    /// The residual stream after each layer, `[tokens, hidden]`.
    pub hidden: Vec<Vec<f32>>,
}

/// Computes the routed experts of one MoE layer for a batch of tokens.
///
/// The layer loop is written once ([`Model::forward_with`]); what differs between the
/// reference pass and the actor pipeline is only where each expert runs.
pub trait ExpertRunner {
    /// Adds `Σ weight · expert(h[token])` for every routed (token, expert) pair into `out`
    /// (`[tokens, hidden]`, already holding other contributions).
    fn run_experts(
        &mut self,
        model: &Model,
        layer: usize,
        h: &DeviceBuffer,
        routing: &Routing,
        out: &mut DeviceBuffer,
    ) -> Result<(), ModelError>;
}

/// Runs every expert on the model's backend straight from host memory (the oracle).
pub struct ReferenceExperts;

impl ExpertRunner for ReferenceExperts {
    fn run_experts(
        &mut self,
        model: &Model,
        layer: usize,
        h: &DeviceBuffer,
        routing: &Routing,
        out: &mut DeviceBuffer,
    ) -> Result<(), ModelError> {
        let be = model.backend();
        let hidden = model.config().hidden_size;
        let experts = model.experts(layer);
        for (expert, rows, weights) in routing.by_expert() {
            let w = &experts[expert as usize];
            let import = |m: &HostMatrix| be.import_host(m.bytes.clone(), m.dtype, BufferUsage::ExpertSlot);
            let bufs = ExpertBuffers { gate: import(&w.gate)?, up: import(&w.up)?, down: import(&w.down)? };
            let mut xs = scratch(be, rows.len() * hidden)?;
            be.gather_rows(h, &rows, hidden, &mut xs)?;
            let y = expert_forward(be, &bufs, &xs, rows.len(), w.gate.rows, hidden)?;
            be.scatter_add_rows(out, &y, &rows, &weights, hidden)?;
        }
        Ok(())
    }
}

/// One expert's three matrices as device buffers (imported host memory or a cache slot).
pub struct ExpertBuffers {
    /// `[I, H]`.
    pub gate: DeviceBuffer,
    /// `[I, H]`.
    pub up: DeviceBuffer,
    /// `[H, I]`.
    pub down: DeviceBuffer,
}

/// `down(silu(gate · x) ⊙ (up · x))` over `n` gathered token rows; returns `[n, hidden]`.
pub fn expert_forward(
    be: &dyn Backend,
    w: &ExpertBuffers,
    xs: &DeviceBuffer,
    n: usize,
    inter: usize,
    hidden: usize,
) -> Result<DeviceBuffer, ModelError> {
    let mut g = scratch(be, n * inter)?;
    let mut u = scratch(be, n * inter)?;
    be.matmul(xs, &w.gate, None, &mut g, &MatmulDesc::new(n, hidden, inter))?;
    be.matmul(xs, &w.up, None, &mut u, &MatmulDesc::new(n, hidden, inter))?;
    be.binary(BinaryOp::SwiGlu, &mut g, &u, n * inter)?;
    let mut y = scratch(be, n * hidden)?;
    be.matmul(&g, &w.down, None, &mut y, &MatmulDesc::new(n, inter, hidden))?;
    Ok(y)
}

fn scratch(be: &dyn Backend, len: usize) -> Result<DeviceBuffer, ModelError> {
    Ok(be.alloc(DType::F32, len, BufferUsage::Scratch)?)
}

pub(crate) fn download_f32(be: &dyn Backend, buf: &DeviceBuffer, len: usize) -> Result<Vec<f32>, ModelError> {
    let mut out = vec![0f32; len];
    be.download(StreamId::COMPUTE, buf, 0, bytemuck::cast_slice_mut(&mut out))?;
    Ok(out)
}

impl Model {
    /// Runs `tokens` through the model after the `state.len()` tokens already in `state`.
    pub fn forward(&self, state: &mut SequenceState, tokens: &[u32], logits: Logits) -> Result<Vec<f32>, ModelError> {
        self.forward_traced(state, tokens, logits, None)
    }

    /// [`Model::forward`] that also records router and hidden-state values into `trace`.
    pub fn forward_traced(
        &self,
        state: &mut SequenceState,
        tokens: &[u32],
        logits: Logits,
        trace: Option<&mut Trace>,
    ) -> Result<Vec<f32>, ModelError> {
        self.forward_with(state, tokens, logits, trace, &mut ReferenceExperts)
    }

    /// The forward pass with routed experts computed by `experts`.
    pub fn forward_with(
        &self,
        state: &mut SequenceState,
        tokens: &[u32],
        logits: Logits,
        mut trace: Option<&mut Trace>,
        experts: &mut dyn ExpertRunner,
    ) -> Result<Vec<f32>, ModelError> {
        let cfg = self.config();
        let be = self.backend();
        let t = tokens.len();
        if t == 0 {
            return Err(ModelError::Invalid("forward called with no tokens".into()));
        }
        if state.len() + t > state.capacity() {
            return Err(ModelError::ContextOverflow { needed: state.len() + t, capacity: state.capacity() });
        }
        if let Some(bad) = tokens.iter().find(|&&id| id as usize >= cfg.vocab_size) {
            return Err(ModelError::Invalid(format!("token id {bad} is outside the vocabulary (size {})", cfg.vocab_size)));
        }
        let h = cfg.hidden_size;
        let mut x = scratch(be, t * h)?;
        be.gather_rows(&self.embed, tokens, h, &mut x)?;
        let mut normed = scratch(be, t * h)?;
        let mut delta = scratch(be, t * h)?;
        let past = state.len();
        let positions: Vec<u32> = (past..past + t).map(|p| p as u32).collect();
        for (i, layer) in self.layers.iter().enumerate() {
            let norm = RmsNormDesc { rows: t, dim: h, eps: cfg.rms_norm_eps, unit_offset: false };
            be.rms_norm(&x, &layer.input_norm, &mut normed, &norm)?;
            self.attention(&layer.attn, &mut state.layers[i], past, &positions, &normed, &mut delta)?;
            be.binary(BinaryOp::Add, &mut x, &delta, t * h)?;
            be.rms_norm(&x, &layer.post_attention_norm, &mut normed, &norm)?;
            match &layer.ffn {
                FeedForward::Dense(mlp) => self.mlp(mlp, &normed, &mut delta, t)?,
                FeedForward::Moe(moe) => {
                    let routing = self.moe(moe, &normed, &mut delta, t, i, trace.as_deref_mut(), experts)?;
                    if let Some(tr) = trace.as_deref_mut() {
                        tr.routing.push((i, routing));
                    }
                }
            }
            be.binary(BinaryOp::Add, &mut x, &delta, t * h)?;
            if let Some(tr) = trace.as_deref_mut() {
                tr.hidden.push(download_f32(be, &x, t * h)?);
            }
        }
        state.advance(t);
        let rows: Vec<u32> = match logits {
            Logits::None => return Ok(vec![]),
            Logits::All => (0..t as u32).collect(),
            Logits::Last => vec![t as u32 - 1],
        };
        let n = rows.len();
        let mut picked = scratch(be, n * h)?;
        be.gather_rows(&x, &rows, h, &mut picked)?;
        let mut final_normed = scratch(be, n * h)?;
        be.rms_norm(&picked, &self.final_norm, &mut final_normed, &RmsNormDesc { rows: n, dim: h, eps: cfg.rms_norm_eps, unit_offset: false })?;
        let mut out = scratch(be, n * cfg.vocab_size)?;
        be.matmul(&final_normed, self.lm_head(), None, &mut out, &MatmulDesc::new(n, h, cfg.vocab_size))?;
        download_f32(be, &out, n * cfg.vocab_size)
    }

    fn attention(
        &self,
        w: &AttentionWeights,
        layer_state: &mut LayerState,
        past: usize,
        positions: &[u32],
        x: &DeviceBuffer,
        out: &mut DeviceBuffer,
    ) -> Result<(), ModelError> {
        let cfg = self.config();
        let be = self.backend();
        let t = positions.len();
        let (nh, nkv, hd) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
        let mut q = scratch(be, t * nh * hd)?;
        let mut k = scratch(be, t * nkv * hd)?;
        let mut v = scratch(be, t * nkv * hd)?;
        w.q.forward(be, x, &mut q, t)?;
        w.k.forward(be, x, &mut k, t)?;
        w.v.forward(be, x, &mut v, t)?;
        if let (Some(qn), Some(kn)) = (&w.q_norm, &w.k_norm) {
            let mut tmp = scratch(be, t * nh * hd)?;
            be.rms_norm(&q, qn, &mut tmp, &RmsNormDesc { rows: t * nh, dim: hd, eps: cfg.rms_norm_eps, unit_offset: false })?;
            q = tmp;
            let mut tmp = scratch(be, t * nkv * hd)?;
            be.rms_norm(&k, kn, &mut tmp, &RmsNormDesc { rows: t * nkv, dim: hd, eps: cfg.rms_norm_eps, unit_offset: false })?;
            k = tmp;
        }
        let rope = |heads: usize| RopeDesc {
            n_tokens: t,
            n_heads: heads,
            head_stride: hd,
            row_stride: heads * hd,
            rot_offset: 0,
            rotary_dim: self.rotary_dim,
            interleaved: false,
            positions: positions.to_vec(),
            inv_freq: self.inv_freq.clone(),
            scaling: self.rope_scaling,
        };
        be.rope(&mut q, &rope(nh))?;
        be.rope(&mut k, &rope(nkv))?;
        let LayerState::Attention { k: kc, v: vc } = layer_state;
        let span = CopyDesc { src_offset: 0, dst_offset: past * nkv * hd, len: t * nkv * hd };
        be.copy(StreamId::COMPUTE, &k, kc, &span)?;
        be.copy(StreamId::COMPUTE, &v, vc, &span)?;
        let mut attn = scratch(be, t * nh * hd)?;
        let desc = AttentionDesc {
            n_tokens: t,
            n_heads: nh,
            n_kv_heads: nkv,
            head_dim: hd,
            v_head_dim: hd,
            kv_len: past + t,
            scale: 1.0 / (hd as f32).sqrt(),
            window: None,
        };
        be.attention(&q, kc, vc, None, &mut attn, &desc)?;
        w.o.forward(be, &attn, out, t)
    }

    fn mlp(&self, w: &Mlp, x: &DeviceBuffer, out: &mut DeviceBuffer, t: usize) -> Result<(), ModelError> {
        let be = self.backend();
        let inter = w.gate.out_dim;
        let mut g = scratch(be, t * inter)?;
        let mut u = scratch(be, t * inter)?;
        w.gate.forward(be, x, &mut g, t)?;
        w.up.forward(be, x, &mut u, t)?;
        be.binary(BinaryOp::SwiGlu, &mut g, &u, t * inter)?;
        w.down.forward(be, &g, out, t)
    }

    fn moe(
        &self,
        w: &MoeWeights,
        x: &DeviceBuffer,
        out: &mut DeviceBuffer,
        t: usize,
        layer: usize,
        trace: Option<&mut Trace>,
        experts: &mut dyn ExpertRunner,
    ) -> Result<Routing, ModelError> {
        let cfg = self.config();
        let be = self.backend();
        let (h, e) = (cfg.hidden_size, cfg.num_experts);
        let mut logits = scratch(be, t * e)?;
        w.router.forward(be, x, &mut logits, t)?;
        let logits = download_f32(be, &logits, t * e)?;
        let routing = route(&w.params, &logits, t, e);
        if let Some(tr) = trace {
            tr.router_logits.push((layer, logits));
        }
        // `out` is reused scratch: clear it before accumulating expert outputs.
        be.scale(out, 0.0, t * h)?;
        experts.run_experts(self, layer, x, &routing, out)?;
        if let Some(shared) = &w.shared {
            let mut y = scratch(be, t * h)?;
            self.mlp(shared, x, &mut y, t)?;
            let scales = match &w.shared_gate {
                Some(gate) => {
                    let mut g = scratch(be, t)?;
                    gate.forward(be, x, &mut g, t)?;
                    download_f32(be, &g, t)?.into_iter().map(ft_backend::sigmoid).collect()
                }
                None => vec![1.0; t],
            };
            let rows: Vec<u32> = (0..t as u32).collect();
            be.scatter_add_rows(out, &y, &rows, &scales, h)?;
        }
        Ok(routing)
    }
}
