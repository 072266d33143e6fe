//! The paged KV pool: the attention and latent caches of every sequence live in fixed-size
//! pages of one pool buffer per layer, taken as tokens arrive and given back when no
//! sequence or saved prefix holds them.
//!
//! A page may have several holders: a saved prefix and every sequence restored from it share
//! its pages instead of copying them, and a holder that is about to write into a shared page
//! gets a copy of its own first (copy on write; only a sequence's last, partly filled page is
//! ever written). Recurrent state is fixed-size and stays with its sequence.
//!
//! The pool's buffers grow (doubling, up to `max_pages`) when the free pages run out, so
//! memory is taken as it is used; page numbers survive growth, since rows keep their places.

use crate::model::config::LayerKind;
use crate::model::{Model, ModelError};
use ft_backend::{Backend, BackendError, BufferUsage, CopyDesc, DType, DeviceBuffer, KvPages, StreamId};
use std::sync::{Arc, Mutex, MutexGuard};

/// Rows per page, unless configured: a sequence wastes less than this at its end, and the
/// CPU's attention reads each page run with one tiled pass.
pub const PAGE_ROWS: usize = 64;
/// Pages a pool's buffers start with.
const INITIAL_PAGES: usize = 4;

/// One layer's part of the pool.
pub enum PoolLayer {
    /// The layer keeps no per-token cache here (recurrent layers).
    None,
    /// Keys and values, `[pages × page_rows, width]` each.
    Kv {
        /// Keys.
        k: DeviceBuffer,
        /// Values.
        v: DeviceBuffer,
    },
    /// Multi-head latent attention's rows, `[pages × page_rows, width]`.
    Latent {
        /// The latent rows.
        kv: DeviceBuffer,
    },
}

impl PoolLayer {
    fn buffers(&self) -> Vec<&DeviceBuffer> {
        match self {
            PoolLayer::None => vec![],
            PoolLayer::Kv { k, v } => vec![k, v],
            PoolLayer::Latent { kv } => vec![kv],
        }
    }

    fn buffers_mut(&mut self) -> Vec<&mut DeviceBuffer> {
        match self {
            PoolLayer::None => vec![],
            PoolLayer::Kv { k, v } => vec![k, v],
            PoolLayer::Latent { kv } => vec![kv],
        }
    }
}

/// The pages of every layer, with their holders.
pub struct PagePool {
    page_rows: usize,
    max_pages: usize,
    /// Values per row of each layer's buffers (0 for a layer without any).
    widths: Vec<usize>,
    layers: Vec<PoolLayer>,
    /// Latent (MLA) rows, one buffer a layer, rather than keys and values.
    latent: bool,
    /// Holders of each page the buffers have room for (0: free).
    refs: Vec<u32>,
    free: Vec<u32>,
    dtype: DType,
    backend: Arc<dyn Backend>,
}

/// A pool shared by the sequences and saved prefixes of one model.
pub type SharedPool = Arc<Mutex<PagePool>>;

/// Locks a pool; a holder that panicked left the counts as they were (every change is made
/// under the lock in one step), so a poisoned lock is taken over.
pub fn lock(pool: &SharedPool) -> MutexGuard<'_, PagePool> {
    pool.lock().unwrap_or_else(|p| p.into_inner())
}

impl PagePool {
    /// Whether `model` keeps any cache in pages (attention or latent layers; DeepSeek-V4 keeps
    /// its compressed state per sequence).
    pub fn needed(model: &Model) -> bool {
        let cfg = model.config();
        cfg.v4.is_none() && cfg.layer_kinds.iter().any(|k| *k != LayerKind::LinearAttention)
    }

    /// A pool for `model`'s caches in `dtype`, pages of `page_rows` rows, at most `max_pages`.
    pub fn new(model: &Model, dtype: DType, page_rows: usize, max_pages: usize) -> Result<PagePool, ModelError> {
        let cfg = model.config();
        if page_rows == 0 || max_pages == 0 {
            return Err(ModelError::Invalid(format!("a KV pool of {max_pages} pages of {page_rows} rows holds nothing")));
        }
        let widths = (0..cfg.num_layers)
            .map(|i| match (cfg.layer_kinds[i], &cfg.mla) {
                (LayerKind::LinearAttention, _) => 0,
                (_, Some(m)) => m.cache_width(),
                _ => cfg.num_kv_heads * cfg.head_dim,
            })
            .collect::<Vec<_>>();
        if let Some(why) = Self::unfit(model, dtype) {
            return Err(ModelError::Invalid(why));
        }
        let mut pool = PagePool {
            page_rows,
            max_pages,
            layers: Vec::new(),
            widths,
            latent: cfg.mla.is_some(),
            refs: Vec::new(),
            free: Vec::new(),
            dtype,
            backend: model.backend_arc(),
        };
        pool.layers = pool.alloc_layers(INITIAL_PAGES.min(max_pages))?;
        pool.add_pages(INITIAL_PAGES.min(max_pages));
        Ok(pool)
    }

    /// Why `model`'s caches cannot be kept in `dtype`, if they cannot: a block-quantized
    /// cache (Q8_0) needs every head (attention) or row (latent) in whole blocks.
    pub fn unfit(model: &Model, dtype: DType) -> Option<String> {
        let cfg = model.config();
        let be = dtype.block_elems();
        let dims = match &cfg.mla {
            Some(m) => vec![m.cache_width()],
            None => vec![cfg.head_dim],
        };
        dims.iter().find(|d| *d % be != 0).map(|d| format!("a {dtype} KV cache needs heads of whole {be}-value blocks; this model's are {d} wide"))
    }

    /// A pool in an [`Arc`] and [`Mutex`] for sharing.
    pub fn shared(self) -> SharedPool {
        Arc::new(Mutex::new(self))
    }

    fn alloc_layers(&self, pages: usize) -> Result<Vec<PoolLayer>, ModelError> {
        let be = self.backend.as_ref();
        let rows = pages * self.page_rows;
        let mla = self.latent;
        self.widths
            .iter()
            .map(|&w| {
                Ok(match w {
                    0 => PoolLayer::None,
                    w if mla => PoolLayer::Latent { kv: be.alloc(self.dtype, rows * w, BufferUsage::Kv)? },
                    w => PoolLayer::Kv { k: be.alloc(self.dtype, rows * w, BufferUsage::Kv)?, v: be.alloc(self.dtype, rows * w, BufferUsage::Kv)? },
                })
            })
            .collect()
    }

    fn add_pages(&mut self, upto: usize) {
        let from = self.refs.len();
        self.refs.resize(upto, 0);
        // Lowest numbers are handed out first.
        self.free.extend((from..upto).rev().map(|p| p as u32));
    }

    /// Doubles the buffers (at most `max_pages`), keeping every row in its place.
    fn grow(&mut self) -> Result<(), ModelError> {
        let have = self.refs.len();
        let want = (have * 2).max(1).min(self.max_pages);
        if want <= have {
            return Err(self.full());
        }
        let mut layers = self.alloc_layers(want)?;
        let be = self.backend.clone();
        for (l, (old, new)) in self.layers.iter().zip(&mut layers).enumerate() {
            let len = have * self.page_rows * self.widths[l];
            for (src, dst) in old.buffers().into_iter().zip(new.buffers_mut()) {
                be.copy(StreamId::COMPUTE, src, dst, &CopyDesc { src_offset: 0, dst_offset: 0, len })?;
            }
        }
        self.layers = layers;
        self.add_pages(want);
        tracing::debug!("KV pool grown from {have} to {want} pages of {} rows", self.page_rows);
        Ok(())
    }

    fn full(&self) -> ModelError {
        ModelError::Backend(BackendError::OutOfMemory { requested: self.page_bytes(), free: 0 })
    }

    /// A free page, held once.
    pub fn take(&mut self) -> Result<u32, ModelError> {
        if self.free.is_empty() {
            self.grow()?;
        }
        let p = self.free.pop().ok_or_else(|| self.full())?;
        self.refs[p as usize] = 1;
        Ok(p)
    }

    /// One more holder of `page`.
    pub fn retain(&mut self, page: u32) {
        if let Some(r) = self.refs.get_mut(page as usize) {
            *r += 1;
        }
    }

    /// One holder fewer of `page`; the last one frees it.
    pub fn release(&mut self, page: u32) {
        if let Some(r) = self.refs.get_mut(page as usize) {
            if *r > 0 {
                *r -= 1;
                if *r == 0 {
                    self.free.push(page);
                }
            }
        }
    }

    /// Lets go of every page of `table`, emptying it: last page first, since the free list
    /// hands pages out last in, first out, so the next sequence gets them in their order again,
    /// one contiguous run for attention to read.
    pub fn release_table(&mut self, table: &mut Vec<u32>) {
        for p in table.drain(..).rev() {
            self.release(p);
        }
    }

    /// Holders of `page`.
    pub fn holders(&self, page: u32) -> u32 {
        self.refs.get(page as usize).copied().unwrap_or(0)
    }

    /// A page of its own in place of the shared `page` (its rows copied in every layer);
    /// the caller's hold on `page` is given up.
    pub fn unshare(&mut self, page: u32) -> Result<u32, ModelError> {
        let new = self.take()?;
        let be = self.backend.clone();
        let p = self.page_rows;
        for (l, layer) in self.layers.iter_mut().enumerate() {
            let w = self.widths[l];
            for buf in layer.buffers_mut() {
                // Through a page-sized scratch: a copy's source and destination are two buffers.
                let mut tmp = be.alloc(buf.dtype(), p * w, BufferUsage::Scratch)?;
                be.copy(StreamId::COMPUTE, buf, &mut tmp, &CopyDesc { src_offset: page as usize * p * w, dst_offset: 0, len: p * w })?;
                be.copy(StreamId::COMPUTE, &tmp, buf, &CopyDesc { src_offset: 0, dst_offset: new as usize * p * w, len: p * w })?;
            }
        }
        self.release(page);
        Ok(new)
    }

    /// Rows per page.
    pub fn page_rows(&self) -> usize {
        self.page_rows
    }

    /// Bytes one page takes in all layers together.
    pub fn page_bytes(&self) -> u64 {
        let values: usize = self.widths.iter().zip(&self.layers).map(|(w, l)| w * l.buffers().len()).sum();
        self.dtype.row_bytes(values * self.page_rows) as u64
    }

    /// Pages held by someone.
    pub fn used_pages(&self) -> usize {
        self.refs.len() - self.free.len()
    }

    /// Pages the buffers have room for now.
    pub fn allocated_pages(&self) -> usize {
        self.refs.len()
    }

    /// Most pages the pool may grow to.
    pub fn max_pages(&self) -> usize {
        self.max_pages
    }

    /// The cache type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Layer `l`'s buffers.
    pub fn layer_mut(&mut self, l: usize) -> Option<&mut PoolLayer> {
        self.layers.get_mut(l)
    }

    /// Values per row of layer `l`.
    pub fn width(&self, l: usize) -> usize {
        self.widths.get(l).copied().unwrap_or(0)
    }

    /// The first `rows` rows of a sequence (pages `table`) in every layer, as host bytes in
    /// layer order (keys before values).
    pub fn read_rows(&self, table: &[u32], rows: usize) -> Result<Vec<Vec<u8>>, ModelError> {
        let pages = KvPages { table, page_rows: self.page_rows };
        let runs = pages.runs(0, rows)?;
        let mut out = vec![];
        for (l, layer) in self.layers.iter().enumerate() {
            let b = |rows: usize| self.dtype.row_bytes(rows * self.widths[l]);
            for buf in layer.buffers() {
                let mut bytes = vec![0u8; b(rows)];
                for &(j, r, n) in &runs {
                    self.backend.download(StreamId::COMPUTE, buf, b(r), &mut bytes[b(j)..b(j + n)])?;
                }
                out.push(bytes);
            }
        }
        Ok(out)
    }

    /// Writes `rows` rows per buffer (as [`read_rows`](Self::read_rows) gives them) into
    /// the pages `table`.
    pub fn write_rows(&mut self, table: &[u32], rows: usize, parts: &[Vec<u8>]) -> Result<(), ModelError> {
        let pages = KvPages { table, page_rows: self.page_rows };
        let runs = pages.runs(0, rows)?;
        let be = self.backend.clone();
        let dtype = self.dtype;
        let mut parts = parts.iter();
        for (l, layer) in self.layers.iter_mut().enumerate() {
            let w = self.widths[l];
            let b = |rows: usize| dtype.row_bytes(rows * w);
            for buf in layer.buffers_mut() {
                let bytes = parts.next().ok_or_else(|| ModelError::Invalid("saved KV rows do not match the pool's layers".into()))?;
                if bytes.len() < b(rows) {
                    return Err(ModelError::Invalid("saved KV rows are shorter than their length".into()));
                }
                for &(j, r, n) in &runs {
                    be.upload(StreamId::COMPUTE, &bytes[b(j)..b(j + n)], buf, b(r))?;
                }
            }
        }
        Ok(())
    }
}
