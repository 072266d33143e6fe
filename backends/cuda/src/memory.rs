//! Device buffers, the per-call parameter arena, and pinned staging for host transfers.

use crate::error::driver;
use crate::pool::ScratchPool;
use cudarc::driver::{result, sys, CudaContext, CudaEvent, CudaStream, DriverError};
use ft_backend::{BackendError, BufferStorage, DType, DeviceBuffer, Result};
use std::sync::Arc;

/// Device memory owned by a [`DeviceBuffer`] of the CUDA backend; freed on drop.
pub struct CudaStorage {
    pub(crate) ptr: u64,
    /// Bytes the buffer holds (what range checks use).
    pub(crate) bytes: usize,
    /// Bytes allocated, and the pool they return to (scratch buffers only).
    pooled: Option<(usize, Arc<ScratchPool>)>,
    ctx: Arc<CudaContext>,
}

impl CudaStorage {
    /// `bytes` of uninitialised device memory (none for 0 bytes).
    pub(crate) fn alloc(ctx: &Arc<CudaContext>, bytes: usize) -> std::result::Result<Self, DriverError> {
        let ptr = if bytes == 0 { 0 } else { malloc(ctx, bytes)? };
        Ok(Self { ptr, bytes, pooled: None, ctx: ctx.clone() })
    }

    /// `bytes` of scratch memory from `pool` (or fresh), returned to it on drop; not zeroed.
    pub(crate) fn scratch(ctx: &Arc<CudaContext>, pool: &Arc<ScratchPool>, bytes: usize) -> std::result::Result<Self, DriverError> {
        let class = ScratchPool::class(bytes);
        let ptr = match pool.take(class) {
            Some(p) => p,
            None => malloc(ctx, class)?,
        };
        Ok(Self { ptr, bytes, pooled: Some((class, pool.clone())), ctx: ctx.clone() })
    }
}

fn malloc(ctx: &Arc<CudaContext>, bytes: usize) -> std::result::Result<u64, DriverError> {
    ctx.bind_to_thread()?;
    // SAFETY: a plain allocation in the bound context; freed once (Drop or pool release).
    unsafe { result::malloc_sync(bytes) }
}

/// Frees allocations the pool gave up (cuMemFree waits for work still using them).
pub(crate) fn free_all(ctx: &Arc<CudaContext>, ptrs: Vec<u64>) {
    let _ = ctx.bind_to_thread();
    for p in ptrs {
        // SAFETY: each pointer came from malloc and is owned by no buffer any more.
        if let Err(e) = unsafe { result::free_sync(p) } {
            tracing::warn!("cuMemFree failed: {e:?}");
        }
    }
}

impl Drop for CudaStorage {
    fn drop(&mut self) {
        if let Some((class, pool)) = &self.pooled {
            // Kernels already queued may still read it; the next user zeroes it on the same
            // stream first, so stream order keeps them apart.
            if self.ptr != 0 && !pool.give(self.ptr, *class) {
                free_all(&self.ctx, vec![self.ptr]);
            }
            return;
        }
        if self.ptr != 0 {
            // cuMemFree waits for work still using the memory; errors here cannot be returned,
            // and a failed free only leaks.
            let _ = self.ctx.bind_to_thread();
            // SAFETY: allocated by malloc_sync in this context and freed only here.
            if let Err(e) = unsafe { result::free_sync(self.ptr) } {
                tracing::warn!("cuMemFree failed: {e:?}");
            }
        }
    }
}

impl BufferStorage for CudaStorage {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}

/// The storage of `buf`, or [`BackendError::Invalid`] if another backend made it.
pub(crate) fn storage<'a>(buf: &'a DeviceBuffer, what: &str) -> Result<&'a CudaStorage> {
    buf.storage::<CudaStorage>()
        .ok_or_else(|| BackendError::Invalid(format!("{what}: not a CUDA buffer")))
}

/// Device address of elements `offset .. offset + len` of `buf`, after checking the range.
pub(crate) fn ptr_at(buf: &DeviceBuffer, offset: usize, len: usize, what: &str) -> Result<u64> {
    let s = storage(buf, what)?;
    if buf.dtype().is_quantized() {
        // Only the quantized matmul reads block types (it addresses their bytes itself); an
        // element pointer would misplace them, and no other kernel can decode them.
        return Err(BackendError::Invalid(format!("{what}: {} data is read by matmul only", buf.dtype())));
    }
    let es = buf.dtype().size();
    let end = offset.checked_add(len).filter(|e| *e <= buf.len());
    match end {
        Some(_) => Ok(s.ptr + (offset * es) as u64),
        None => Err(BackendError::Shape(format!(
            "{what}: elements {offset}..{offset}+{len} of a buffer of {}",
            buf.len()
        ))),
    }
}

/// Device address and byte count of values `offset .. offset + len` of `buf`, any dtype: for
/// a block type both must fall on block boundaries (copies move whole blocks).
pub(crate) fn byte_range(buf: &DeviceBuffer, offset: usize, len: usize, what: &str) -> Result<(u64, usize)> {
    let s = storage(buf, what)?;
    let (dt, be) = (buf.dtype(), buf.dtype().block_elems());
    if !offset.is_multiple_of(be) || !len.is_multiple_of(be) {
        return Err(BackendError::Shape(format!("{what}: {dt} values {offset}..+{len} are not whole blocks of {be}")));
    }
    if offset.checked_add(len).is_none_or(|e| e > buf.len()) {
        return Err(BackendError::Shape(format!("{what}: elements {offset}..{offset}+{len} of a buffer of {}", buf.len())));
    }
    Ok((s.ptr + (offset / be * dt.size()) as u64, len / be * dt.size()))
}

/// Like [`ptr_at`] for an f32 activation buffer.
pub(crate) fn f32_at(buf: &DeviceBuffer, offset: usize, len: usize, what: &'static str) -> Result<u64> {
    expect(buf, DType::F32, what)?;
    ptr_at(buf, offset, len, what)
}

/// Fails with [`BackendError::DType`] unless `buf` holds `dtype`.
pub(crate) fn expect(buf: &DeviceBuffer, dtype: DType, what: &'static str) -> Result<()> {
    if buf.dtype() == dtype {
        Ok(())
    } else {
        Err(BackendError::DType { expected: dtype, got: buf.dtype(), what })
    }
}

/// `a · b`, or a shape error naming `what` when it overflows.
pub(crate) fn need(a: usize, b: usize, what: &str) -> Result<usize> {
    a.checked_mul(b).ok_or_else(|| BackendError::Shape(format!("{what}: {a}×{b} overflows")))
}

/// A size as the kernels' `u32`, or a shape error.
pub(crate) fn u32_of(v: usize, what: &str) -> Result<u32> {
    u32::try_from(v).map_err(|_| BackendError::Shape(format!("{what}: {v} exceeds the kernels' 32-bit sizes")))
}

/// Device memory for the small tables one op uploads (ids, rope angles, top-k results).
/// Used under its lock and only on the compute stream, so a table is overwritten only after
/// the kernels that read the previous one have run (stream order).
#[derive(Default)]
pub(crate) struct Arena {
    buf: Option<CudaStorage>,
}

impl Arena {
    /// Copies `parts` to the device (each 16-byte aligned) on `stream`; returns their
    /// addresses. The host slices may be dropped on return: pageable copies are staged by the
    /// driver before cuMemcpyHtoDAsync returns.
    pub(crate) fn put(&mut self, ctx: &Arc<CudaContext>, stream: &CudaStream, parts: &[&[u8]], extra: usize) -> Result<Vec<u64>> {
        ctx.bind_to_thread().map_err(|e| driver(e, "binding the CUDA context"))?;
        let mut offsets = Vec::with_capacity(parts.len() + 1);
        let mut total = 0usize;
        for p in parts.iter().map(|p| p.len()).chain([extra]) {
            offsets.push(total);
            total = total.checked_add(p.div_ceil(16) * 16).ok_or_else(|| BackendError::Shape("parameter tables overflow".into()))?;
        }
        if self.buf.as_ref().is_none_or(|b| b.bytes < total) {
            // Kernels queued earlier may still read the old tables.
            stream.synchronize().map_err(|e| driver(e, "arena"))?;
            self.buf = None;
            let cap = total.max(64 * 1024).next_power_of_two();
            self.buf = Some(CudaStorage::alloc(ctx, cap).map_err(|e| driver(e, "arena allocation"))?);
        }
        let base = self.buf.as_ref().map_or(0, |b| b.ptr);
        for (p, off) in parts.iter().zip(&offsets) {
            if !p.is_empty() {
                // SAFETY: the destination range lies inside the arena (sized above).
                unsafe { result::memcpy_htod_async(base + *off as u64, p, stream.cu_stream()) }
                    .map_err(|e| driver(e, "arena upload"))?;
            }
        }
        Ok(offsets.iter().map(|o| base + *o as u64).collect())
    }
}

/// How host bytes reach the device in `import_host`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostMemoryMode {
    /// Copied through a bounded ring of pinned staging buffers (the default).
    Staging,
    /// The host range is registered as pinned (cuMemHostRegister, read-only) for the copy;
    /// chosen with `FT_CUDA_HOST_MEMORY=register`. Falls back to staging where refused.
    Register,
}

impl HostMemoryMode {
    /// From `FT_CUDA_HOST_MEMORY` (`staging` or `register`).
    pub fn from_env() -> Self {
        match std::env::var("FT_CUDA_HOST_MEMORY").as_deref() {
            Ok("register") => HostMemoryMode::Register,
            _ => HostMemoryMode::Staging,
        }
    }
    /// The lower-case name used in messages.
    pub fn name(self) -> &'static str {
        match self {
            HostMemoryMode::Staging => "pinned staging ring",
            HostMemoryMode::Register => "registered host memory",
        }
    }
}

/// Pinned buffers in the staging ring.
const STAGING_SLOTS: usize = 4;
/// Bytes per staging buffer.
pub(crate) const STAGING_BYTES: usize = 8 << 20;

struct Slot {
    ptr: *mut u8,
    /// The copy last issued from this slot; the slot is reused after it completes.
    done: Option<CudaEvent>,
}

/// A bounded ring of pinned host buffers: host bytes are copied into one while the DMA
/// engine reads another, so large transfers run at full PCIe speed from pageable memory.
pub(crate) struct Staging {
    ctx: Arc<CudaContext>,
    slots: Vec<Slot>,
    next: usize,
    /// Pinned memory could not be allocated; copies go straight from pageable memory.
    unavailable: bool,
}

// SAFETY: the slot pointers are pinned host allocations owned by this struct and only used
// under the backend's lock.
unsafe impl Send for Staging {}

impl Staging {
    pub(crate) fn new(ctx: Arc<CudaContext>) -> Self {
        Self { ctx, slots: Vec::new(), next: 0, unavailable: false }
    }

    /// Copies `src` to device address `dst` on `stream`, through the ring.
    pub(crate) fn copy(&mut self, stream: &CudaStream, src: &[u8], dst: u64) -> Result<()> {
        if self.slots.is_empty() && !self.unavailable {
            for _ in 0..STAGING_SLOTS {
                // SAFETY: a plain pinned allocation, freed in Drop.
                match unsafe { result::malloc_host(STAGING_BYTES, 0) } {
                    Ok(p) => self.slots.push(Slot { ptr: p as *mut u8, done: None }),
                    Err(e) => {
                        tracing::warn!("no pinned staging memory ({e:?}); copying from pageable memory");
                        self.unavailable = true;
                        break;
                    }
                }
            }
        }
        if self.unavailable || self.slots.is_empty() {
            // SAFETY: the caller checked the destination range.
            return unsafe { result::memcpy_htod_async(dst, src, stream.cu_stream()) }.map_err(|e| driver(e, "upload"));
        }
        for (i, chunk) in src.chunks(STAGING_BYTES).enumerate() {
            let n = self.slots.len();
            let slot = &mut self.slots[self.next % n];
            self.next = self.next.wrapping_add(1);
            if let Some(ev) = slot.done.take() {
                ev.synchronize().map_err(|e| driver(e, "staging wait"))?;
            }
            // SAFETY: the slot holds STAGING_BYTES ≥ chunk.len() bytes and no copy reads it now.
            let pinned = unsafe {
                std::ptr::copy_nonoverlapping(chunk.as_ptr(), slot.ptr, chunk.len());
                std::slice::from_raw_parts(slot.ptr as *const u8, chunk.len())
            };
            let at = dst + (i * STAGING_BYTES) as u64;
            // SAFETY: pinned source stays valid until `done` completes; destination checked.
            unsafe { result::memcpy_htod_async(at, pinned, stream.cu_stream()) }.map_err(|e| driver(e, "staged upload"))?;
            let ev = self
                .ctx
                .new_event(Some(sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC))
                .and_then(|ev| ev.record(stream).map(|()| ev))
                .map_err(|e| driver(e, "staging event"))?;
            slot.done = Some(ev);
        }
        Ok(())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        for slot in self.slots.drain(..) {
            if let Some(ev) = slot.done {
                let _ = ev.synchronize();
            }
            // SAFETY: allocated by malloc_host; no copy reads it any more (waited above).
            let _ = unsafe { result::free_host(slot.ptr as *mut std::ffi::c_void) };
        }
    }
}

/// Copies `src` to `dst` with the host range registered as pinned for the duration; `Ok(false)`
/// when the driver refuses to register it (the caller then stages).
pub(crate) fn copy_registered(ctx: &Arc<CudaContext>, stream: &CudaStream, src: &[u8], dst: u64) -> Result<bool> {
    ctx.bind_to_thread().map_err(|e| driver(e, "bind"))?;
    let p = src.as_ptr() as *mut std::ffi::c_void;
    // SAFETY: registers memory we only read (READ_ONLY); unregistered below after the copy.
    let reg = unsafe { sys::cuMemHostRegister_v2(p, src.len(), sys::CU_MEMHOSTREGISTER_READ_ONLY) };
    if reg != sys::CUresult::CUDA_SUCCESS {
        tracing::debug!("cuMemHostRegister refused ({reg:?}); staging instead");
        return Ok(false);
    }
    // SAFETY: `src` is pinned and outlives the copy (we synchronise before returning).
    let copied = unsafe { result::memcpy_htod_async(dst, src, stream.cu_stream()) }.and_then(|()| stream.synchronize());
    // SAFETY: registered above.
    let _ = unsafe { sys::cuMemHostUnregister(p) };
    copied.map_err(|e| driver(e, "registered upload"))?;
    Ok(true)
}
