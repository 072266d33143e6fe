//! Per-sequence model state: the KV cache of attention layers, the latent cache of MLA
//! layers and the convolution + recurrent state of linear-attention layers, up to one
//! sequence's context; plus snapshots of it, which anchors keep to resume a conversation.
//!
//! Per-token caches are allocated as tokens arrive (doubling, from [`INITIAL_ROWS`]), not for
//! the whole context up front: a request that may run to 40k tokens but stops at 300 holds
//! 512 rows, so many sequences fit where their worst cases would not.

pub mod reuse;

use crate::model::config::{LayerKind, V4Attention};
use crate::model::{Model, ModelError};
use ft_backend::{Backend, BufferUsage, CopyDesc, DType, DeviceBuffer, StreamId};
use std::sync::Arc;

/// The cached state of one layer for one sequence.
pub enum LayerState {
    /// Keys and values, `[capacity, kv_heads, head_dim]` each.
    Attention {
        /// Keys.
        k: DeviceBuffer,
        /// Values.
        v: DeviceBuffer,
    },
    /// Multi-head latent attention: per token the normalised latent followed by the rotated
    /// shared key part, `[capacity, kv_lora_rank + qk_rope_head_dim]`. Never per-head keys.
    Latent {
        /// The latent rows.
        kv: DeviceBuffer,
    },
    /// Gated DeltaNet: fixed-size state that summarises every token so far.
    Recurrent {
        /// The last `kernel - 1` inputs of the short convolution, `[kernel - 1, conv_dim]`.
        conv: DeviceBuffer,
        /// The delta-rule state, `[v_heads, k_head_dim, v_head_dim]`.
        state: DeviceBuffer,
    },
    /// DeepSeek-V4: the shared key/value rows of every token (attention reads the last
    /// `sliding_window`), the compressed entries and, for CSA, the indexer's keys (entry `w` at
    /// row `w`, one per `rate` tokens), and the compressors' carried state (the rows of the
    /// window not yet complete, the previous window's overlap), which cannot be rolled back.
    Compressed {
        /// `[capacity, head_dim]` rotated K=V rows.
        kv: DeviceBuffer,
        /// `[capacity, head_dim]` compressed entries (CSA and HCA layers).
        entries: Option<DeviceBuffer>,
        /// `[capacity, index_head_dim]` indexer keys (CSA layers).
        index_keys: Option<DeviceBuffer>,
        /// Fixed-size compressor (then indexer) carry, f32.
        carry: Option<DeviceBuffer>,
    },
}

/// Rows a new state's per-token caches start with.
pub const INITIAL_ROWS: usize = 256;

/// Everything a sequence carries between forward passes.
pub struct SequenceState {
    /// One entry per decoder layer.
    pub layers: Vec<LayerState>,
    len: usize,
    /// Most tokens it may hold.
    capacity: usize,
    /// Tokens its per-token buffers have room for now (grows up to `capacity`).
    allocated: usize,
    backend: Arc<dyn Backend>,
}

/// A copy of a [`SequenceState`] after some number of tokens, in device or host memory.
///
/// Attention and latent caches are copied only up to the snapshot's length; recurrent
/// state is copied whole. Restoring it into any state of the same model with enough
/// capacity continues exactly as the original sequence would have.
pub struct StateSnapshot {
    len: usize,
    /// One entry per state buffer, in [`SequenceState::buffers`] order.
    parts: Vec<Part>,
}

/// Where one buffer of a snapshot lives.
enum Part {
    Device(DeviceBuffer),
    /// The buffer's bytes and dtype; anchors move here when device memory for them runs out.
    Host(Vec<u8>, DType),
}

impl Part {
    fn dtype(&self) -> DType {
        match self {
            Part::Device(b) => b.dtype(),
            Part::Host(_, dtype) => *dtype,
        }
    }

    fn elements(&self) -> usize {
        match self {
            Part::Device(b) => b.len(),
            Part::Host(v, dtype) => v.len() / dtype.size(),
        }
    }
}

impl StateSnapshot {
    /// Tokens the snapshot covers.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the snapshot was taken before any token.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes the snapshot holds (device and host together).
    pub fn size_bytes(&self) -> usize {
        self.parts
            .iter()
            .map(|p| match p {
                Part::Device(b) => b.size_bytes(),
                Part::Host(v, _) => v.len(),
            })
            .sum()
    }

    /// Whether any part is in device memory.
    pub fn on_device(&self) -> bool {
        self.parts.iter().any(|p| matches!(p, Part::Device(_)))
    }

    /// Moves every part into host memory (frees the device copies).
    pub fn move_to_host(&mut self, be: &dyn Backend) -> Result<(), ModelError> {
        for part in &mut self.parts {
            if let Part::Device(buf) = part {
                let mut bytes = vec![0u8; buf.size_bytes()];
                be.download(StreamId::COMPUTE, buf, 0, &mut bytes)?;
                *part = Part::Host(bytes, buf.dtype());
            }
        }
        Ok(())
    }
}

fn copy_prefix(be: &dyn Backend, src: &DeviceBuffer, dst: &mut DeviceBuffer, len: usize) -> Result<(), ModelError> {
    be.copy(StreamId::COMPUTE, src, dst, &CopyDesc { src_offset: 0, dst_offset: 0, len })?;
    Ok(())
}

/// How one state buffer grows: `per_token` elements per token, or a fixed size.
#[derive(Clone, Copy)]
enum Extent {
    PerToken(usize),
    Fixed,
}

impl SequenceState {
    /// State for up to `capacity` tokens on the model's backend; per-token caches start at
    /// [`INITIAL_ROWS`] rows and grow as tokens arrive.
    pub fn new(model: &Model, capacity: usize) -> Result<SequenceState, ModelError> {
        Self::with_rows(model, capacity, INITIAL_ROWS, DType::F32)
    }

    /// State for up to `capacity` tokens whose per-token caches hold `dtype` (f32, bf16 or
    /// f16; recurrent state is always f32) and start at `rows` rows (at least 1): a sequence
    /// waiting for room in the KV pool holds one.
    pub fn with_rows(model: &Model, capacity: usize, rows: usize, dtype: DType) -> Result<SequenceState, ModelError> {
        let rows = rows.min(capacity).max(1);
        let cfg = model.config();
        let be = model.backend();
        let alloc = |len: usize| be.alloc(DType::F32, len, BufferUsage::Kv);
        let alloc_kv = |len: usize| be.alloc(dtype, len, BufferUsage::Kv);
        if let Some(v4) = &cfg.v4 {
            let layers = v4_layers(cfg, v4, rows, &alloc)?;
            return Ok(SequenceState { layers, len: 0, capacity, allocated: rows, backend: model.backend_arc() });
        }
        let layers = (0..cfg.num_layers)
            .map(|i| {
                Ok(match (cfg.layer_kinds[i], &cfg.mla, &cfg.linear_attn) {
                    (LayerKind::LinearAttention, _, Some(l)) => LayerState::Recurrent {
                        conv: alloc((l.conv_kernel - 1) * l.conv_dim())?,
                        state: alloc(l.state_len())?,
                    },
                    (LayerKind::LinearAttention, _, None) => {
                        return Err(ModelError::Invalid("linear-attention layer without its settings".into()))
                    }
                    (_, Some(m), _) => LayerState::Latent { kv: alloc_kv(rows * m.cache_width())? },
                    // Sliding-window layers get the full context too (the attention op masks by
                    // position); a ring buffer of `window` rows would save memory there.
                    _ => {
                        let per_token = cfg.num_kv_heads * cfg.head_dim;
                        LayerState::Attention { k: alloc_kv(rows * per_token)?, v: alloc_kv(rows * per_token)? }
                    }
                })
            })
            .collect::<Result<_, ModelError>>()?;
        Ok(SequenceState { layers, len: 0, capacity, allocated: rows, backend: model.backend_arc() })
    }

    /// Tokens processed so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no token has been processed.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Tokens this state can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Tokens its per-token buffers have room for before they grow again.
    pub fn allocated(&self) -> usize {
        self.allocated
    }

    /// Bytes its per-token caches hold now (what it takes from the KV pool).
    pub fn held_bytes(&self) -> u64 {
        self.buffers().iter().map(|(b, e)| if matches!(e, Extent::PerToken(_)) { b.size_bytes() as u64 } else { 0 }).sum()
    }

    /// Makes room for `tokens` tokens: per-token buffers grow to at least twice their rows
    /// (at most `capacity`), keeping what they hold. On failure the state is as it was.
    pub fn reserve(&mut self, tokens: usize) -> Result<(), ModelError> {
        if tokens > self.capacity {
            return Err(ModelError::ContextOverflow { needed: tokens, capacity: self.capacity });
        }
        if tokens <= self.allocated {
            return Ok(());
        }
        let rows = crate::policy::rows_after(self.allocated, tokens, self.capacity);
        let be = self.backend.clone();
        let (old, len) = (self.allocated, self.len);
        // Every new buffer is made before any replaces its old one.
        let mut grown = Vec::new();
        for (buf, extent) in self.buffers() {
            if let Extent::PerToken(per) = extent {
                let mut new = be.alloc(buf.dtype(), rows * per, BufferUsage::Kv)?;
                if len > 0 {
                    copy_prefix(be.as_ref(), buf, &mut new, len * per)?;
                }
                grown.push(new);
            }
        }
        let mut grown = grown.into_iter();
        let mut next = || grown.next().ok_or_else(|| ModelError::Invalid("kv growth lost a buffer".into()));
        for l in &mut self.layers {
            match l {
                LayerState::Attention { k, v } => {
                    *k = next()?;
                    *v = next()?;
                }
                LayerState::Latent { kv } => {
                    *kv = next()?;
                }
                LayerState::Recurrent { .. } => {}
                LayerState::Compressed { kv, entries, index_keys, .. } => {
                    *kv = next()?;
                    for b in [entries, index_keys].into_iter().flatten() {
                        *b = next()?;
                    }
                }
            }
        }
        tracing::trace!("sequence state grown from {old} to {rows} rows");
        self.allocated = rows;
        Ok(())
    }

    /// Whether some layer keeps recurrent state, which summarises all tokens and so cannot
    /// be rolled back (restore a [`StateSnapshot`] instead).
    pub fn has_recurrent_layers(&self) -> bool {
        self.layers.iter().any(|l| matches!(l, LayerState::Recurrent { .. } | LayerState::Compressed { carry: Some(_), .. }))
    }

    /// Forgets everything after the first `len` tokens. Attention and latent caches roll
    /// back freely; a model with recurrent layers can only "truncate" to its current length.
    pub fn truncate(&mut self, len: usize) -> Result<(), ModelError> {
        if len < self.len && self.has_recurrent_layers() {
            return Err(ModelError::Invalid(format!(
                "cannot roll a recurrent state back from {} to {len} tokens; restore a snapshot taken at {len} instead",
                self.len
            )));
        }
        self.len = self.len.min(len);
        Ok(())
    }

    /// Records that `n` more tokens were written.
    pub(crate) fn advance(&mut self, n: usize) {
        self.len += n;
    }

    /// Every state buffer with how it grows, in a fixed order (layer by layer).
    fn buffers(&self) -> Vec<(&DeviceBuffer, Extent)> {
        let capacity = self.allocated.max(1);
        let mut out = Vec::new();
        for l in &self.layers {
            match l {
                LayerState::Attention { k, v } => {
                    out.push((k, Extent::PerToken(k.len() / capacity)));
                    out.push((v, Extent::PerToken(v.len() / capacity)));
                }
                LayerState::Latent { kv } => out.push((kv, Extent::PerToken(kv.len() / capacity))),
                LayerState::Recurrent { conv, state } => {
                    out.push((conv, Extent::Fixed));
                    out.push((state, Extent::Fixed));
                }
                LayerState::Compressed { kv, entries, index_keys, carry } => {
                    for b in [Some(kv), entries.as_ref(), index_keys.as_ref()].into_iter().flatten() {
                        out.push((b, Extent::PerToken(b.len() / capacity)));
                    }
                    if let Some(c) = carry {
                        out.push((c, Extent::Fixed));
                    }
                }
            }
        }
        out
    }

    fn buffers_mut(&mut self) -> Vec<&mut DeviceBuffer> {
        let mut out = Vec::new();
        for l in &mut self.layers {
            match l {
                LayerState::Attention { k, v } => {
                    out.push(k);
                    out.push(v);
                }
                LayerState::Latent { kv } => out.push(kv),
                LayerState::Recurrent { conv, state } => {
                    out.push(conv);
                    out.push(state);
                }
                LayerState::Compressed { kv, entries, index_keys, carry } => {
                    out.push(kv);
                    out.extend(entries.as_mut());
                    out.extend(index_keys.as_mut());
                    out.extend(carry.as_mut());
                }
            }
        }
        out
    }

    /// Elements of each buffer a snapshot at `len` tokens holds.
    fn snapshot_extents(&self, len: usize) -> Vec<usize> {
        self.buffers()
            .iter()
            .map(|(b, e)| match e {
                Extent::PerToken(n) => len * n,
                Extent::Fixed => b.len(),
            })
            .collect()
    }

    /// Bytes a snapshot of this state at its current length would take.
    pub fn snapshot_bytes(&self) -> usize {
        self.buffers().iter().zip(self.snapshot_extents(self.len)).map(|((b, _), n)| n * b.dtype().size()).sum()
    }

    /// Copies the state as it is now into device memory.
    pub fn snapshot(&self) -> Result<StateSnapshot, ModelError> {
        self.take_snapshot(false)
    }

    /// Copies the state as it is now straight into host memory.
    pub fn snapshot_to_host(&self) -> Result<StateSnapshot, ModelError> {
        self.take_snapshot(true)
    }

    fn take_snapshot(&self, to_host: bool) -> Result<StateSnapshot, ModelError> {
        let be = self.backend.as_ref();
        let parts = self
            .buffers()
            .into_iter()
            .zip(self.snapshot_extents(self.len))
            .map(|((buf, _), n)| {
                if to_host {
                    let mut bytes = vec![0u8; n * buf.dtype().size()];
                    if n > 0 {
                        be.download(StreamId::COMPUTE, buf, 0, &mut bytes)?;
                    }
                    Ok(Part::Host(bytes, buf.dtype()))
                } else {
                    let mut copy = be.alloc(buf.dtype(), n, BufferUsage::Kv)?;
                    copy_prefix(be, buf, &mut copy, n)?;
                    Ok(Part::Device(copy))
                }
            })
            .collect::<Result<_, ModelError>>()?;
        Ok(StateSnapshot { len: self.len, parts })
    }

    /// Makes this state what it was when `snapshot` was taken (of a state of the same model).
    pub fn restore(&mut self, snapshot: &StateSnapshot) -> Result<(), ModelError> {
        self.restore_prefix(snapshot, snapshot.len)
    }

    /// Like [`restore`](Self::restore), then keeps only the first `len` tokens: attention
    /// state taken after a longer sequence serves any of its prefixes. A snapshot with
    /// recurrent state can only be restored whole.
    pub fn restore_prefix(&mut self, snapshot: &StateSnapshot, len: usize) -> Result<(), ModelError> {
        if len > snapshot.len {
            return Err(ModelError::Invalid(format!("cannot restore {len} tokens from a snapshot of {}", snapshot.len)));
        }
        if len < snapshot.len && self.has_recurrent_layers() {
            return Err(ModelError::Invalid(format!(
                "a snapshot of {} tokens with recurrent state cannot be cut to {len}",
                snapshot.len
            )));
        }
        if len > self.capacity {
            return Err(ModelError::ContextOverflow { needed: len, capacity: self.capacity });
        }
        // Check every buffer before copying any, so a mismatch leaves this state untouched.
        let want = self.snapshot_extents(snapshot.len);
        if want.len() != snapshot.parts.len() || want.iter().zip(&snapshot.parts).any(|(n, p)| *n != p.elements()) {
            return Err(ModelError::Invalid("snapshot layers do not match this model's state".into()));
        }
        if self.buffers().iter().zip(&snapshot.parts).any(|((b, _), p)| b.dtype() != p.dtype()) {
            return Err(ModelError::Invalid("the snapshot's cache type differs from this state's".into()));
        }
        // Per-token buffers only need the kept prefix; fixed-size ones are copied whole.
        self.reserve(len)?;
        let keep = self.snapshot_extents(len);
        let be = self.backend.clone();
        for ((dst, part), n) in self.buffers_mut().into_iter().zip(&snapshot.parts).zip(keep) {
            if n == 0 {
                continue;
            }
            match part {
                Part::Device(src) => copy_prefix(be.as_ref(), src, dst, n)?,
                Part::Host(bytes, dtype) => be.upload(StreamId::COMPUTE, &bytes[..n * dtype.size()], dst, 0)?,
            }
        }
        self.len = len;
        Ok(())
    }

    /// Bytes of f32 cache that grow with each token of context, for `model`.
    pub fn bytes_per_token(model: &Model) -> usize {
        Self::bytes_per_token_as(model, DType::F32)
    }

    /// Bytes of cache in `dtype` that grow with each token of context, for `model`.
    pub fn bytes_per_token_as(model: &Model, dtype: DType) -> usize {
        Self::bytes_per_token_of(model.config(), dtype)
    }

    /// Bytes of cache in `dtype` that grow with each token of context, from the config alone.
    pub fn bytes_per_token_of(c: &crate::model::ModelConfig, dtype: DType) -> usize {
        if let Some(v4) = &c.v4 {
            // V4 state is always f32 (the attention reads it on the host).
            return v4.attention.iter().map(|k| v4_widths(c, v4, *k).0).sum::<usize>() * DType::F32.size();
        }
        let per_layer = |kind: LayerKind| match (kind, &c.mla) {
            (LayerKind::LinearAttention, _) => 0,
            (_, Some(m)) => m.cache_width(),
            _ => 2 * c.num_kv_heads * c.head_dim,
        };
        c.layer_kinds.iter().map(|k| per_layer(*k)).sum::<usize>() * dtype.size()
    }

    /// Bytes of fixed-size (recurrent) state per sequence, for `model`.
    pub fn fixed_bytes(model: &Model) -> usize {
        Self::fixed_bytes_of(model.config())
    }

    /// Bytes of fixed-size (recurrent) state per sequence, from the config alone.
    pub fn fixed_bytes_of(c: &crate::model::ModelConfig) -> usize {
        if let Some(v4) = &c.v4 {
            return v4.attention.iter().map(|k| v4_widths(c, v4, *k).1).sum::<usize>() * DType::F32.size();
        }
        let per_layer = c.linear_attn.map_or(0, |l| (l.conv_kernel - 1) * l.conv_dim() + l.state_len());
        c.num_layers_of(LayerKind::LinearAttention) * per_layer * DType::F32.size()
    }
}

/// Per-token and fixed f32 elements of one DeepSeek-V4 layer's state: K=V rows, then entries
/// and indexer keys (allocated a row per token, of which one per `rate` is used), and the carry.
fn v4_widths(c: &crate::model::ModelConfig, v4: &crate::model::config::V4Config, kind: V4Attention) -> (usize, usize) {
    use crate::model::deepseek_v4::carry_len;
    let hd = c.head_dim;
    match kind {
        V4Attention::Sliding => (hd, 0),
        V4Attention::HeavilyCompressed => (2 * hd, carry_len(v4.hca_rate, hd, false)),
        V4Attention::CompressedSparse => {
            (2 * hd + v4.index_head_dim, carry_len(v4.csa_rate, hd, true) + carry_len(v4.csa_rate, v4.index_head_dim, true))
        }
    }
}

/// Fresh DeepSeek-V4 layer states of `rows` rows (always f32: the attention reads them on the host).
fn v4_layers(
    c: &crate::model::ModelConfig,
    v4: &crate::model::config::V4Config,
    rows: usize,
    alloc: &dyn Fn(usize) -> Result<DeviceBuffer, ft_backend::BackendError>,
) -> Result<Vec<LayerState>, ModelError> {
    v4.attention
        .iter()
        .map(|&kind| {
            let hd = c.head_dim;
            let (_, fixed) = v4_widths(c, v4, kind);
            let compressed = kind != V4Attention::Sliding;
            Ok(LayerState::Compressed {
                kv: alloc(rows * hd)?,
                entries: if compressed { Some(alloc(rows * hd)?) } else { None },
                index_keys: if kind == V4Attention::CompressedSparse { Some(alloc(rows * v4.index_head_dim)?) } else { None },
                carry: if fixed > 0 { Some(alloc(fixed)?) } else { None },
            })
        })
        .collect()
}
