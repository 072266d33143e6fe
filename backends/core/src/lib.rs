//! The device abstraction of ft-actor.
//!
//! Scheduling code is written once against [`Backend`] and never names CUDA, wgpu or CPU
//! types. The trait is object-safe (held as `Arc<dyn Backend>`): ops are chosen by
//! descriptors and enums, never by generic methods. [`reference`] holds plain, obviously
//! correct implementations of every op that [`conformance`] checks each backend against.

pub mod buffer;
pub mod conformance;
pub mod dtype;
pub mod error;
pub mod ops;
pub mod quant;
pub mod reference;

pub use buffer::{BufferStorage, BufferUsage, DeviceBuffer, HostBytes};
pub use dtype::DType;
pub use error::{BackendError, Result};
pub use ops::*;

use std::any::Any;

/// Which implementation a backend is (for logs, `info` and error messages only).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BackendKind {
    /// Host CPU, SIMD where available.
    Cpu,
    /// NVIDIA GPU through the CUDA driver API.
    Cuda,
    /// Any Vulkan/Metal/DX12/GL adapter through wgpu.
    Wgpu,
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BackendKind::Cpu => "cpu",
            BackendKind::Cuda => "cuda",
            BackendKind::Wgpu => "wgpu",
        })
    }
}

/// Free and total device memory in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryInfo {
    /// Bytes still available for allocation.
    pub free: u64,
    /// Bytes the device has in all.
    pub total: u64,
}

/// A queue of device work. Stream 0 is the compute stream every backend has.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId(pub u32);

impl StreamId {
    /// The compute stream on which all kernels run.
    pub const COMPUTE: StreamId = StreamId(0);
}

/// A point in a stream's work that other streams (or the host) can wait for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventId(pub u64);

/// The device abstraction: memory, copies on streams with events, and the model's kernels.
///
/// Activations are always `f32`; weights may be `f32`, `bf16` or `f16`. Kernels run on
/// [`StreamId::COMPUTE`] in submission order; copies run on the stream they are given.
/// Every method returns a typed error instead of panicking on bad shapes or dtypes.
pub trait Backend: Send + Sync {
    /// Which implementation this is.
    fn kind(&self) -> BackendKind;
    /// A human-readable device description (e.g. CPU model and SIMD level, GPU name).
    fn device_name(&self) -> String;
    /// Free/total device memory.
    fn memory_info(&self) -> Result<MemoryInfo>;
    /// Whether `op` is implemented for weights (or data) of `dtype`.
    fn supports(&self, op: Op, dtype: DType) -> bool;
    /// Whether [`Backend::attention`] runs for `desc` with a `kv_dtype` cache: [`Backend::supports`]
    /// and the kernel's size limits (shared memory, accumulators per thread). Where this is
    /// false, `attention` answers [`BackendError::Unsupported`] and the engine runs it on the CPU.
    fn supports_attention(&self, desc: &AttentionDesc, kv_dtype: DType) -> bool {
        let _ = desc;
        self.supports(Op::Attention, kv_dtype)
    }
    /// For downcasting in tests and backend-specific tooling.
    fn as_any(&self) -> &dyn Any;

    // --- memory -------------------------------------------------------------------------
    /// Allocates a zero-filled buffer of `len` elements.
    fn alloc(&self, dtype: DType, len: usize, usage: BufferUsage) -> Result<DeviceBuffer>;
    /// Makes host bytes (e.g. a slice of a memory-mapped file) usable as a device buffer.
    /// A backend whose device memory is host memory may use the bytes in place (no copy).
    fn import_host(&self, data: HostBytes, dtype: DType, usage: BufferUsage) -> Result<DeviceBuffer>;
    /// Copies host bytes into `dst` starting at byte `dst_offset`, ordered on `stream`.
    fn upload(&self, stream: StreamId, src: &[u8], dst: &mut DeviceBuffer, dst_offset: usize) -> Result<()>;
    /// Copies bytes of `src` starting at byte `src_offset` into `dst`; returns when done.
    fn download(&self, stream: StreamId, src: &DeviceBuffer, src_offset: usize, dst: &mut [u8]) -> Result<()>;
    /// Device-to-device copy of `desc.len` elements of the same dtype.
    fn copy(&self, stream: StreamId, src: &DeviceBuffer, dst: &mut DeviceBuffer, desc: &CopyDesc) -> Result<()>;
    /// Writes `desc.len` f32 values of `src` into `dst` at element `desc.dst_offset`, in
    /// `dst`'s dtype (bf16 or f16, rounded to nearest even; f16 saturates at ±65504, so a
    /// cache never holds an infinity), on the compute stream: how new tokens enter a KV cache
    /// kept narrower than the activations. `copy` when `dst` is f32. A block-quantized cache
    /// (Q8_0, where [`Backend::supports_store`] says so) takes whole blocks at block offsets,
    /// each quantized as [`crate::quant::quantize_row`] does.
    fn store(&self, src: &DeviceBuffer, dst: &mut DeviceBuffer, desc: &CopyDesc) -> Result<()> {
        if dst.dtype() == src.dtype() {
            return self.copy(StreamId::COMPUTE, src, dst, desc);
        }
        Err(BackendError::Unsupported { backend: self.kind().to_string(), op: Op::Copy, dtype: dst.dtype() })
    }
    /// Whether [`Backend::store`] writes f32 values into a buffer of `dtype`.
    fn supports_store(&self, dtype: DType) -> bool {
        dtype == DType::F32
    }

    // --- streams and events ---------------------------------------------------------------
    /// Creates a new stream (e.g. a copy stream beside the compute stream).
    fn create_stream(&self) -> Result<StreamId>;
    /// Records an event after all work submitted so far to `stream`.
    fn record_event(&self, stream: StreamId) -> Result<EventId>;
    /// Makes later work on `stream` wait until `event` has completed.
    fn wait_event(&self, stream: StreamId, event: EventId) -> Result<()>;
    /// Whether `event` has completed (non-blocking).
    fn event_done(&self, event: EventId) -> Result<bool>;
    /// Blocks the host until all work on `stream` has completed.
    fn synchronize(&self, stream: StreamId) -> Result<()>;

    // --- kernels --------------------------------------------------------------------------
    /// `out[n, m] = x[n, k] · w[m, k]ᵀ (+ bias[m])`; GEMV when `n == 1`.
    fn matmul(
        &self,
        x: &DeviceBuffer,
        w: &DeviceBuffer,
        bias: Option<&DeviceBuffer>,
        out: &mut DeviceBuffer,
        desc: &MatmulDesc,
    ) -> Result<()>;
    /// Several products of the same activations `x` (a layer's query, key and value
    /// projections), each as [`Backend::matmul`] computes it: a backend may run them as one
    /// piece of work and prepare `x` once. By default, one call after another.
    fn matmul_same_x(&self, x: &DeviceBuffer, parts: &mut [MatmulPart<'_>]) -> Result<()> {
        for p in parts.iter_mut() {
            self.matmul(x, p.w, p.bias, p.out, &p.desc)?;
        }
        Ok(())
    }
    /// Row-wise RMS normalisation: `out = x / rms(x) * w` (or `* (1 + w)`).
    fn rms_norm(&self, x: &DeviceBuffer, w: &DeviceBuffer, out: &mut DeviceBuffer, desc: &RmsNormDesc) -> Result<()>;
    /// Rotary position embedding, in place, over (part of) every head of every token.
    fn rope(&self, x: &mut DeviceBuffer, desc: &RopeDesc) -> Result<()>;
    /// Causal scaled-dot-product attention of new queries against a KV cache (GQA,
    /// optional sliding window and learned sinks).
    fn attention(
        &self,
        q: &DeviceBuffer,
        k_cache: &DeviceBuffer,
        v_cache: &DeviceBuffer,
        sinks: Option<&DeviceBuffer>,
        out: &mut DeviceBuffer,
        desc: &AttentionDesc,
    ) -> Result<()>;
    /// [`Backend::attention`] over a paged cache: `k_pool` and `v_pool` (the same buffer for
    /// a latent cache) hold the rows of many sequences in pages and `pages` says which are
    /// this sequence's, `[pool rows, n_kv_heads, head_dim]`. The default gathers the
    /// sequence's rows into contiguous buffers with [`Backend::copy`] ([`gather_kv_pages`]) and
    /// runs [`Backend::attention`]; a backend that reads pages in place overrides it.
    #[allow(clippy::too_many_arguments)]
    fn attention_paged(
        &self,
        q: &DeviceBuffer,
        k_pool: &DeviceBuffer,
        v_pool: &DeviceBuffer,
        pages: &KvPages<'_>,
        sinks: Option<&DeviceBuffer>,
        out: &mut DeviceBuffer,
        desc: &AttentionDesc,
    ) -> Result<()> {
        let (k, v) = gather_kv_pages(self, k_pool, v_pool, pages, desc)?;
        self.attention(q, &k, v.as_ref().unwrap_or(&k), sinks, out, desc)
    }
    /// Element-wise `a = op(a, b)` over `n` elements (residual add, SwiGLU, gating).
    fn binary(&self, op: BinaryOp, a: &mut DeviceBuffer, b: &DeviceBuffer, n: usize) -> Result<()>;
    /// `x *= s` over `n` elements.
    fn scale(&self, x: &mut DeviceBuffer, s: f32, n: usize) -> Result<()>;
    /// Row-wise softmax in place over `rows × cols`.
    fn softmax(&self, x: &mut DeviceBuffer, rows: usize, cols: usize) -> Result<()>;
    /// Per row, the `k` largest values (descending) and their column indices.
    fn top_k(&self, x: &DeviceBuffer, rows: usize, cols: usize, k: usize) -> Result<TopK>;
    /// `out[i, :] = src[ids[i], :]` (as f32) for a table of `cols` columns.
    fn gather_rows(&self, src: &DeviceBuffer, ids: &[u32], cols: usize, out: &mut DeviceBuffer) -> Result<()>;
    /// `acc[rows[i], :] += scales[i] * x[i, :]`: combines expert outputs into the tokens.
    fn scatter_add_rows(
        &self,
        acc: &mut DeviceBuffer,
        x: &DeviceBuffer,
        rows: &[u32],
        scales: &[f32],
        cols: usize,
    ) -> Result<()>;
    /// [`Backend::scatter_add_rows`] of each of `parts` in turn, from host memory (the outputs
    /// of experts run on the CPU): each row of `acc` receives its additions in the order of
    /// `parts`, so the result is that of the parts added one after another. The default
    /// uploads each part into one scratch buffer first; a backend that reads host memory adds
    /// them where they lie.
    fn scatter_add_rows_host(&self, acc: &mut DeviceBuffer, parts: &[HostRows<'_>], cols: usize) -> Result<()> {
        let most = parts.iter().map(|p| p.rows.len()).max().unwrap_or(0);
        if most == 0 || cols == 0 {
            return Ok(());
        }
        HostRows::check(parts, acc.len(), cols)?;
        let mut y = self.alloc(DType::F32, most.saturating_mul(cols), BufferUsage::Scratch)?;
        for p in parts {
            self.upload(StreamId::COMPUTE, bytemuck::cast_slice(&p.x[..p.rows.len() * cols]), &mut y, 0)?;
            self.scatter_add_rows(acc, &y, p.rows, p.scales, cols)?;
        }
        Ok(())
    }

    // --- recurrent layers (Gated DeltaNet) ---------------------------------------------------
    // These have default bodies that report the op as unsupported, so a backend that does not
    // run hybrid models yet still builds; `supports` must then answer false for them.

    /// Depthwise causal convolution continuing from `state`, which it updates (see
    /// [`ConvDesc`]).
    fn causal_conv1d(
        &self,
        x: &DeviceBuffer,
        w: &DeviceBuffer,
        state: &mut DeviceBuffer,
        out: &mut DeviceBuffer,
        desc: &ConvDesc,
    ) -> Result<()> {
        let _ = (x, state, out, desc);
        Err(BackendError::Unsupported { backend: self.kind().to_string(), op: Op::CausalConv1d, dtype: w.dtype() })
    }
    /// The gated delta rule over `desc.n_tokens` steps, continuing from `state`, which it
    /// updates; writes one output row per step and value head (see [`DeltaRuleDesc`]).
    fn gated_delta_rule(
        &self,
        inputs: &DeltaRuleInputs<'_>,
        state: &mut DeviceBuffer,
        out: &mut DeviceBuffer,
        desc: &DeltaRuleDesc,
    ) -> Result<()> {
        let _ = (inputs, state, out, desc);
        Err(BackendError::Unsupported { backend: self.kind().to_string(), op: Op::GatedDeltaRule, dtype: DType::F32 })
    }
}

/// A sequence's keys and values gathered out of their pools into contiguous buffers for
/// [`Backend::attention`]: the values are `None` where they are the keys (a latent cache, one
/// pool read as both).
pub fn gather_kv_pages<B: Backend + ?Sized>(
    be: &B,
    k_pool: &DeviceBuffer,
    v_pool: &DeviceBuffer,
    pages: &KvPages<'_>,
    desc: &AttentionDesc,
) -> Result<(DeviceBuffer, Option<DeviceBuffer>)> {
    let k = gather_pages(be, k_pool, pages, desc.kv_len, desc.n_kv_heads * desc.head_dim)?;
    if std::ptr::eq(k_pool, v_pool) && desc.v_head_dim == desc.head_dim {
        return Ok((k, None));
    }
    let v = gather_pages(be, v_pool, pages, desc.kv_len, desc.n_kv_heads * desc.v_head_dim)?;
    Ok((k, Some(v)))
}

/// The first `rows` logical rows of a paged `pool` (`width` values a row) as one contiguous
/// scratch buffer, copied page run by page run.
pub fn gather_pages<B: Backend + ?Sized>(be: &B, pool: &DeviceBuffer, pages: &KvPages<'_>, rows: usize, width: usize) -> Result<DeviceBuffer> {
    let mut out = be.alloc(pool.dtype(), rows.max(1) * width, BufferUsage::Scratch)?;
    for (j, r, n) in pages.runs(0, rows)? {
        be.copy(StreamId::COMPUTE, pool, &mut out, &CopyDesc { src_offset: r * width, dst_offset: j * width, len: n * width })?;
    }
    Ok(out)
}
