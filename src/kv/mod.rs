//! Per-sequence model state: the KV cache of attention layers, the latent cache of MLA
//! layers and the convolution + recurrent state of linear-attention layers, up to one
//! sequence's context; plus snapshots of it, which anchors keep to resume a conversation.
//!
//! Attention and latent rows live in the pages of a [`PagePool`]: a sequence holds a page
//! table, takes pages as tokens arrive and gives them back when it ends, and a saved prefix
//! shares its pages with the sequences restored from it (copy on write). What is not paged —
//! recurrent state, DeepSeek-V4's compressed state — stays with its sequence; V4's per-token
//! buffers grow by doubling from [`INITIAL_ROWS`].

pub mod pages;
pub mod reuse;
mod snapshot;

pub use pages::{PagePool, SharedPool, PAGE_ROWS};
pub use snapshot::StateSnapshot;

use crate::model::config::{LayerKind, V4Attention};
use crate::model::{Model, ModelError};
use ft_backend::{Backend, BufferUsage, CopyDesc, DType, DeviceBuffer, StreamId};
use std::sync::Arc;

/// The cached state of one layer for one sequence.
pub enum LayerState {
    /// Attention keys and values, or MLA latent rows (per token the normalised latent then
    /// the rotated shared key part): in the sequence's pages of the pool's buffers for this
    /// layer.
    Paged,
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

/// Rows DeepSeek-V4's per-token buffers start with.
pub const INITIAL_ROWS: usize = 256;

/// A sequence's pages: its table into a pool shared with other sequences and saved prefixes.
pub struct SeqPages {
    pool: SharedPool,
    table: Vec<u32>,
}

impl SeqPages {
    /// The pool.
    pub fn pool(&self) -> &SharedPool {
        &self.pool
    }

    /// The pool page of each of the sequence's pages, in order.
    pub fn table(&self) -> &[u32] {
        &self.table
    }

    fn release_all(&mut self) {
        pages::lock(&self.pool).release_table(&mut self.table);
    }
}

/// Everything a sequence carries between forward passes.
pub struct SequenceState {
    /// One entry per decoder layer.
    pub layers: Vec<LayerState>,
    len: usize,
    /// Most tokens it may hold.
    capacity: usize,
    /// Tokens its unpaged per-token buffers have room for now (grows up to `capacity`).
    allocated: usize,
    pages: Option<SeqPages>,
    backend: Arc<dyn Backend>,
}

impl Drop for SequenceState {
    fn drop(&mut self) {
        if let Some(p) = &mut self.pages {
            p.release_all();
        }
    }
}

/// How one unpaged state buffer grows: `per_token` elements per token, or a fixed size.
#[derive(Clone, Copy)]
enum Extent {
    PerToken(usize),
    Fixed,
}

fn copy_prefix(be: &dyn Backend, src: &DeviceBuffer, dst: &mut DeviceBuffer, len: usize) -> Result<(), ModelError> {
    be.copy(StreamId::COMPUTE, src, dst, &CopyDesc { src_offset: 0, dst_offset: 0, len })?;
    Ok(())
}

impl SequenceState {
    /// State for up to `capacity` tokens on the model's backend, f32 caches in a pool of its
    /// own that grows as tokens arrive.
    pub fn new(model: &Model, capacity: usize) -> Result<SequenceState, ModelError> {
        Self::with_rows(model, capacity, INITIAL_ROWS, DType::F32)
    }

    /// State for up to `capacity` tokens whose caches hold `dtype` (f32, bf16 or f16;
    /// recurrent state is always f32), in a pool of its own (pages of [`PAGE_ROWS`]);
    /// unpaged per-token buffers start at `rows` rows (at least 1).
    pub fn with_rows(model: &Model, capacity: usize, rows: usize, dtype: DType) -> Result<SequenceState, ModelError> {
        let pool = if PagePool::needed(model) { Some(PagePool::new(model, dtype, PAGE_ROWS, u32::MAX as usize)?.shared()) } else { None };
        Self::build(model, capacity, rows, pool)
    }

    /// State for up to `capacity` tokens whose caches take pages of `pool` (shared with
    /// other sequences of the same model); holds no page until tokens arrive.
    pub fn in_pool(model: &Model, capacity: usize, pool: &SharedPool) -> Result<SequenceState, ModelError> {
        Self::build(model, capacity, INITIAL_ROWS, PagePool::needed(model).then(|| pool.clone()))
    }

    fn build(model: &Model, capacity: usize, rows: usize, pool: Option<SharedPool>) -> Result<SequenceState, ModelError> {
        let rows = rows.min(capacity).max(1);
        let cfg = model.config();
        let be = model.backend();
        let alloc = |len: usize| be.alloc(DType::F32, len, BufferUsage::Kv);
        let pages = pool.map(|pool| SeqPages { pool, table: vec![] });
        if let Some(v4) = &cfg.v4 {
            let layers = v4_layers(cfg, v4, rows, &alloc)?;
            return Ok(SequenceState { layers, len: 0, capacity, allocated: rows, pages: None, backend: model.backend_arc() });
        }
        let layers = (0..cfg.num_layers)
            .map(|i| {
                Ok(match (cfg.layer_kinds[i], &cfg.linear_attn) {
                    (LayerKind::LinearAttention, Some(l)) => LayerState::Recurrent {
                        conv: alloc((l.conv_kernel - 1) * l.conv_dim())?,
                        state: alloc(l.state_len())?,
                    },
                    (LayerKind::LinearAttention, None) => {
                        return Err(ModelError::Invalid("linear-attention layer without its settings".into()))
                    }
                    // Sliding-window layers get the full context too (the attention op masks by
                    // position); freeing pages that slid out of the window would save memory.
                    _ => LayerState::Paged,
                })
            })
            .collect::<Result<_, ModelError>>()?;
        Ok(SequenceState { layers, len: 0, capacity, allocated: rows, pages, backend: model.backend_arc() })
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

    /// Tokens it has room for before it takes more memory: its pages' rows (or its unpaged
    /// buffers' rows, whichever is fewer).
    pub fn allocated(&self) -> usize {
        let unpaged = self.has_unpaged_rows().then_some(self.allocated);
        let paged = self.pages.as_ref().map(|p| p.table.len() * pages::lock(&p.pool).page_rows());
        match (unpaged, paged) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b).unwrap_or(self.capacity),
        }
    }

    /// The sequence's pages, when the model keeps any cache in pages.
    pub fn pages(&self) -> Option<&SeqPages> {
        self.pages.as_ref()
    }

    /// Layer `l`'s state and the sequence's pages, borrowed together.
    pub(crate) fn layer_and_pages(&mut self, l: usize) -> (&mut LayerState, Option<&SeqPages>) {
        (&mut self.layers[l], self.pages.as_ref())
    }

    /// Bytes its per-token caches hold now (what it takes from the KV pool): its pages, shared
    /// or not, and its unpaged per-token buffers.
    pub fn held_bytes(&self) -> u64 {
        let paged = self.pages.as_ref().map_or(0, |p| p.table.len() as u64 * pages::lock(&p.pool).page_bytes());
        let unpaged: u64 = self.buffers().iter().map(|(b, e)| if matches!(e, Extent::PerToken(_)) { b.size_bytes() as u64 } else { 0 }).sum();
        paged + unpaged
    }

    /// Bytes it will hold once it has room for `tokens` tokens (at most its capacity).
    pub fn bytes_after(&self, tokens: usize) -> u64 {
        self.bytes_growing_from(self.allocated, self.pages.as_ref().map_or(0, |p| p.table.len()), tokens)
    }

    /// Bytes a fresh state of the same model would hold with room for `tokens` tokens.
    pub fn fresh_bytes_for(&self, tokens: usize) -> u64 {
        self.bytes_growing_from(INITIAL_ROWS.min(self.capacity), 0, tokens)
    }

    fn bytes_growing_from(&self, rows: usize, pages_held: usize, tokens: usize) -> u64 {
        let tokens = tokens.min(self.capacity);
        let paged = self.pages.as_ref().map_or(0, |p| {
            let pool = pages::lock(&p.pool);
            tokens.div_ceil(pool.page_rows()).max(pages_held) as u64 * pool.page_bytes()
        });
        let per_row: usize =
            self.buffers().iter().map(|(b, e)| if let Extent::PerToken(n) = e { n * b.dtype().size() } else { 0 }).sum();
        let unpaged = if per_row > 0 { crate::policy::rows_after(rows, tokens, self.capacity) * per_row } else { 0 };
        paged + unpaged as u64
    }

    fn has_unpaged_rows(&self) -> bool {
        self.layers.iter().any(|l| matches!(l, LayerState::Compressed { .. }))
    }

    /// Makes room for `tokens` tokens: pages up to the one holding the last of them (a shared
    /// page about to be written is copied first), and unpaged per-token buffers grown to at
    /// least twice their rows (at most `capacity`), keeping what they hold.
    pub fn reserve(&mut self, tokens: usize) -> Result<(), ModelError> {
        if tokens > self.capacity {
            return Err(ModelError::ContextOverflow { needed: tokens, capacity: self.capacity });
        }
        self.grow_rows(tokens)?;
        let len = self.len;
        if let Some(p) = &mut self.pages {
            let mut pool = pages::lock(&p.pool);
            let rows = pool.page_rows();
            let need = tokens.div_ceil(rows);
            // Copy on write: the pages rows `len..tokens` land in.
            for i in len / rows..p.table.len().min(need) {
                if pool.holders(p.table[i]) > 1 {
                    p.table[i] = pool.unshare(p.table[i])?;
                }
            }
            while p.table.len() < need {
                let page = pool.take()?;
                p.table.push(page);
            }
        }
        Ok(())
    }

    /// Grows the unpaged per-token buffers for `tokens` tokens. On failure they are as they were.
    fn grow_rows(&mut self, tokens: usize) -> Result<(), ModelError> {
        if tokens <= self.allocated || !self.has_unpaged_rows() {
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
            if let LayerState::Compressed { kv, entries, index_keys, .. } = l {
                *kv = next()?;
                for b in [entries, index_keys].into_iter().flatten() {
                    *b = next()?;
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

    /// Every unpaged state buffer with how it grows, in a fixed order (layer by layer).
    fn buffers(&self) -> Vec<(&DeviceBuffer, Extent)> {
        let capacity = self.allocated.max(1);
        let mut out = Vec::new();
        for l in &self.layers {
            match l {
                LayerState::Paged => {}
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
                LayerState::Paged => {}
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

    /// Elements of each unpaged buffer a snapshot at `len` tokens holds.
    fn snapshot_extents(&self, len: usize) -> Vec<usize> {
        self.buffers()
            .iter()
            .map(|(b, e)| match e {
                Extent::PerToken(n) => len * n,
                Extent::Fixed => b.len(),
            })
            .collect()
    }

    /// Bytes a snapshot of this state at its current length would take: its unpaged parts,
    /// and the pages that hold its rows.
    pub fn snapshot_bytes(&self) -> usize {
        let unpaged: usize = self.buffers().iter().zip(self.snapshot_extents(self.len)).map(|((b, _), n)| n * b.dtype().size()).sum();
        let paged = self.pages.as_ref().map_or(0, |p| {
            let pool = pages::lock(&p.pool);
            self.len.div_ceil(pool.page_rows()) * pool.page_bytes() as usize
        });
        unpaged + paged
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
        dtype.row_bytes(c.layer_kinds.iter().map(|k| per_layer(*k)).sum::<usize>())
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
