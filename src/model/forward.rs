//! The plain reference forward pass: one layer after another on the backend, experts
//! straight from host memory. It stays as the oracle the actor pipeline is checked against.

use crate::model::reads;
use super::config::ExpertActivation;
use super::routing::{route, Routing};
use super::weights::{ExpertWeights, Linear, MoeWeights, Mlp};
use super::batch::BatchItem;
use super::{Model, ModelError};
use crate::kv::SequenceState;
use ft_backend::{Backend, BinaryOp, BufferUsage, DType, DeviceBuffer, HostBytes, MatmulDesc, StreamId};

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
    /// The residual stream after each layer, `[tokens, hidden]` (DeepSeek-V4: `[tokens,
    /// hc_mult, hidden]`).
    pub hidden: Vec<Vec<f32>>,
    /// DeepSeek-V4, per CSA/HCA layer: every compressed entry so far, `[entries, head_dim]`.
    pub compressed: Vec<(usize, Vec<f32>)>,
    /// DeepSeek-V4, per CSA layer: the indexer's keys so far and, per new token, the entries
    /// it attends to (best score first).
    pub indexer: Vec<(usize, Vec<f32>, Vec<Vec<usize>>)>,
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
            let w = experts
                .get(expert as usize)
                .ok_or_else(|| ModelError::Invalid(format!("layer {layer} has no expert {expert}")))?;
            let mut xs = scratch(be, rows.len() * hidden)?;
            be.gather_rows(h, &rows, hidden, &mut xs)?;
            let act = model.config().expert_activation;
            let y = if [&w.gate, &w.up, &w.down].iter().all(|m| be.supports(ft_backend::Op::Matmul, m.dtype)) {
                let bufs = ExpertBuffers::import(be, w)?;
                let extras = ExpertExtras::import(be, w, act)?;
                expert_forward_with(be, &bufs, &extras, &xs, rows.len(), w.gate.rows, hidden)?
            } else {
                // No device kernel for the experts' block type: the expert runs on the CPU.
                let cpu = model.host_cpu()?;
                let xh = super::fallback::move_to(be, cpu.as_ref(), &xs)?;
                let bufs = ExpertBuffers::import(cpu.as_ref(), w)?;
                let extras = ExpertExtras::import(cpu.as_ref(), w, act)?;
                let yh = expert_forward_with(cpu.as_ref(), &bufs, &extras, &xh, rows.len(), w.gate.rows, hidden)?;
                let mut y = scratch(be, rows.len() * hidden)?;
                super::fallback::to_device(be, cpu.as_ref(), &yh, &mut y, 0, rows.len() * hidden)?;
                y
            };
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

impl ExpertBuffers {
    /// Imports a host expert's matrices (zero-copy where the backend reads host memory).
    pub fn import(be: &dyn Backend, w: &ExpertWeights) -> Result<Self, ModelError> {
        let m = |h: &super::weights::HostMatrix| be.import_host(h.bytes.clone(), h.dtype, BufferUsage::ExpertSlot);
        Ok(Self { gate: m(&w.gate)?, up: m(&w.up)?, down: m(&w.down)? })
    }
}

/// What an expert computes besides its matrices: the activation between the projections
/// and, for architectures that have them (gpt-oss), f32 biases on device.
pub struct ExpertExtras {
    /// `gate = act(gate, up)`.
    pub activation: ExpertActivation,
    /// `[I]` gate bias.
    pub gate_bias: Option<DeviceBuffer>,
    /// `[I]` up bias.
    pub up_bias: Option<DeviceBuffer>,
    /// `[H]` down bias.
    pub down_bias: Option<DeviceBuffer>,
}

impl ExpertExtras {
    /// Plain SwiGLU without biases (every architecture but gpt-oss).
    pub const SWIGLU: ExpertExtras =
        ExpertExtras { activation: ExpertActivation::SwiGlu, gate_bias: None, up_bias: None, down_bias: None };

    /// The model's activation and `w`'s biases, imported (zero-copy where possible).
    pub fn import(be: &dyn Backend, w: &ExpertWeights, activation: ExpertActivation) -> Result<Self, ModelError> {
        let b = |h: &HostBytes| be.import_host(h.clone(), DType::F32, BufferUsage::ExpertSlot);
        let (gate_bias, up_bias, down_bias) = match &w.biases {
            Some(x) => (Some(b(&x.gate)?), Some(b(&x.up)?), Some(b(&x.down)?)),
            None => (None, None, None),
        };
        Ok(Self { activation, gate_bias, up_bias, down_bias })
    }
}

/// `down(silu(gate · x) ⊙ (up · x))` over `n` gathered token rows; returns `[n, hidden]`.
/// Only for bias-free SwiGLU experts; [`expert_forward_with`] covers every architecture.
pub fn expert_forward(
    be: &dyn Backend,
    w: &ExpertBuffers,
    xs: &DeviceBuffer,
    n: usize,
    inter: usize,
    hidden: usize,
) -> Result<DeviceBuffer, ModelError> {
    expert_forward_with(be, w, &ExpertExtras::SWIGLU, xs, n, inter, hidden)
}

/// `down(act(gate · x + b_g, up · x + b_u)) + b_d` over `n` gathered token rows; returns
/// `[n, hidden]`.
pub fn expert_forward_with(
    be: &dyn Backend,
    w: &ExpertBuffers,
    extras: &ExpertExtras,
    xs: &DeviceBuffer,
    n: usize,
    inter: usize,
    hidden: usize,
) -> Result<DeviceBuffer, ModelError> {
    let mut g = scratch(be, n * inter)?;
    let mut u = scratch(be, n * inter)?;
    reads::matmul(be, xs, &w.gate, extras.gate_bias.as_ref(), &mut g, &MatmulDesc::new(n, hidden, inter))?;
    reads::matmul(be, xs, &w.up, extras.up_bias.as_ref(), &mut u, &MatmulDesc::new(n, hidden, inter))?;
    be.binary(extras.activation.binary_op(), &mut g, &u, n * inter)?;
    let mut y = scratch(be, n * hidden)?;
    reads::matmul(be, &g, &w.down, extras.down_bias.as_ref(), &mut y, &MatmulDesc::new(n, inter, hidden))?;
    Ok(y)
}

pub(crate) fn scratch(be: &dyn Backend, len: usize) -> Result<DeviceBuffer, ModelError> {
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
    ///
    /// On error the sequence state is unusable: recurrent layers before the failing one have
    /// already consumed the tokens. Restore a snapshot (or start over) before reusing it.
    pub fn forward_with(
        &self,
        state: &mut SequenceState,
        tokens: &[u32],
        logits: Logits,
        trace: Option<&mut Trace>,
        experts: &mut dyn ExpertRunner,
    ) -> Result<Vec<f32>, ModelError> {
        let mut items = [BatchItem { state, tokens, logits }];
        let mut out = self.forward_batch(&mut items, trace, experts)?;
        Ok(out.pop().unwrap_or_default())
    }

    pub(crate) fn mlp(&self, w: &Mlp, x: &DeviceBuffer, out: &mut DeviceBuffer, t: usize) -> Result<(), ModelError> {
        self.mlp_with(w, x, out, t, BinaryOp::SwiGlu)
    }

    /// A dense gated MLP whose activation is `act` (`gate = act(gate, up)`).
    pub(crate) fn mlp_with(&self, w: &Mlp, x: &DeviceBuffer, out: &mut DeviceBuffer, t: usize, act: BinaryOp) -> Result<(), ModelError> {
        let be = self.backend();
        let inter = w.gate.out_dim;
        let mut g = scratch(be, t * inter)?;
        let mut u = scratch(be, t * inter)?;
        Linear::forward_same_x(be, x, t, &mut [(&w.gate, &mut g), (&w.up, &mut u)])?;
        be.binary(act, &mut g, &u, t * inter)?;
        w.down.forward(be, &g, out, t)
    }

    pub(crate) fn moe(
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
        // The shared expert's gate and up products and its sigmoid gate read the same tokens
        // as the router: one product call for all of them.
        let mut shared = match &w.shared {
            Some(m) => Some((m, scratch(be, t * m.gate.out_dim)?, scratch(be, t * m.up.out_dim)?)),
            None => None,
        };
        let mut shared_gate = match (&w.shared, &w.shared_gate) {
            (Some(_), Some(g)) => Some((g, scratch(be, t)?)),
            _ => None,
        };
        let mut parts: Vec<(&Linear, &mut DeviceBuffer)> = vec![(&w.router, &mut logits)];
        if let Some((m, g, u)) = shared.as_mut() {
            parts.extend([(&m.gate, g), (&m.up, u)]);
        }
        if let Some((lin, g)) = shared_gate.as_mut() {
            parts.push((*lin, g));
        }
        Linear::forward_same_x(be, x, t, &mut parts)?;
        let logits = download_f32(be, &logits, t * e)?;
        let routing = route(&w.params, &logits, t, e);
        if let Some(tr) = trace {
            tr.router_logits.push((layer, logits));
        }
        // `out` is reused scratch: clear it before accumulating expert outputs.
        be.scale(out, 0.0, t * h)?;
        experts.run_experts(self, layer, x, &routing, out)?;
        if let Some((m, mut g, u)) = shared {
            be.binary(BinaryOp::SwiGlu, &mut g, &u, t * m.gate.out_dim)?;
            let mut y = scratch(be, t * h)?;
            m.down.forward(be, &g, &mut y, t)?;
            let scales = match shared_gate {
                Some((_, g)) => download_f32(be, &g, t)?.into_iter().map(ft_backend::sigmoid).collect(),
                None => vec![1.0; t],
            };
            let rows: Vec<u32> = (0..t as u32).collect();
            be.scatter_add_rows(out, &y, &rows, &scales, h)?;
        }
        Ok(routing)
    }
}
