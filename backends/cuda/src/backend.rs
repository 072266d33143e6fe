//! `impl Backend for CudaBackend`: memory, transfers, streams and events here; the kernels
//! in [`crate::ops`].

use crate::device::{poisoned, CudaBackend, COPY_STREAM};
use crate::error::driver;
use crate::memory::{byte_range, copy_registered, expect, free_all, storage, CudaStorage, HostMemoryMode, STAGING_BYTES};
use crate::ops;
use cudarc::driver::{result, sys, DriverError};
use ft_backend::{
    AttentionDesc, Backend, BackendError, BackendKind, BinaryOp, BufferUsage, ConvDesc, CopyDesc, DType, DeltaRuleDesc,
    DeltaRuleInputs, DeviceBuffer, EventId, HostBytes, KvPages, MatmulDesc, MemoryInfo, Op, Result, RmsNormDesc, RopeDesc, StreamId,
    TopK,
};
use std::any::Any;

/// Uploads at least this large go through the pinned staging ring.
const STAGE_MIN: usize = 1 << 20;

impl CudaBackend {
    fn oom(&self, requested: usize) -> BackendError {
        let free = self.memory_info().map_or(0, |m| m.free);
        BackendError::OutOfMemory { requested: requested as u64, free }
    }

    /// Uninitialised device memory: scratch from the pool, anything else fresh. When the
    /// driver runs out, the pool's cached memory is released and the allocation tried again.
    fn alloc_raw(&self, dtype: DType, len: usize, usage: BufferUsage) -> Result<DeviceBuffer> {
        if dtype.is_quantized() && !self.quant_matmul {
            // Only the opt-in quantized matmul reads block types (see `ops::quant`); without
            // it their buffers are refused, as `supports` says.
            return Err(ops::quant::not_enabled(dtype));
        }
        let size = dtype
            .bytes_for(len)
            .filter(|s| *s <= isize::MAX as usize)
            .ok_or_else(|| BackendError::Shape(format!("allocation of {len} {dtype} values: not whole blocks, or overflows")))?;
        let try_alloc = || {
            if usage == BufferUsage::Scratch && size > 0 {
                CudaStorage::scratch(&self.ctx, &self.pool, size)
            } else {
                CudaStorage::alloc(&self.ctx, size)
            }
        };
        let oom = DriverError(sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        let s = match try_alloc() {
            Err(e) if e == oom && self.pool.cached_bytes() > 0 => {
                free_all(&self.ctx, self.pool.drain());
                try_alloc()
            }
            r => r,
        }
        .map_err(|e| if e == oom { self.oom(size) } else { driver(e, "cuMemAlloc") })?;
        Ok(DeviceBuffer::new(Box::new(s), dtype, len, usage))
    }

    /// Host bytes to device address `dst` on `stream`, staged when large.
    fn host_to_device(&self, stream: StreamId, src: &[u8], dst: u64) -> Result<()> {
        let s = self.stream(stream)?;
        self.bind()?;
        if src.len() >= STAGE_MIN {
            return self.staging.lock().map_err(|_| poisoned())?.copy(&s, src, dst);
        }
        // SAFETY: the caller checked that the destination range lies in a live buffer;
        // pageable sources are staged by the driver before this returns.
        unsafe { result::memcpy_htod_async(dst, src, s.cu_stream()) }.map_err(|e| driver(e, "upload"))
    }
}

impl Backend for CudaBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }

    fn device_name(&self) -> String {
        let total = self.memory_info().map_or(0, |m| m.total);
        format!(
            "{} (sm_{}{}, {:.1} GiB, host transfers: {})",
            self.name,
            self.arch.major,
            self.arch.minor,
            total as f64 / (1u64 << 30) as f64,
            self.host_mode.name()
        )
    }

    fn memory_info(&self) -> Result<MemoryInfo> {
        self.bind()?;
        let (free, total) = result::mem_get_info().map_err(|e| driver(e, "cuMemGetInfo"))?;
        // Pooled scratch is free for any allocation: it is released when the driver runs out.
        let free = (free + self.pool.cached_bytes()).min(total);
        Ok(MemoryInfo { free: free as u64, total: total as u64 })
    }

    fn supports(&self, op: Op, dtype: DType) -> bool {
        // Every op in the plain dtypes. Matmul with the block-quantized weight types has
        // kernels (kernels/matmul_quant.cu, a port of the wgpu backend's lavapipe-tested
        // WGSL), but they have only been compiled, never run on a GPU, so they are not
        // claimed unless FT_CUDA_QUANT=1 opts in (scripts/gpu-check.sh does, to test them).
        if dtype.is_quantized() && self.quant_matmul {
            return op == Op::Matmul;
        }
        op.supported_unquantized(dtype)
    }

    fn supports_attention(&self, desc: &AttentionDesc, kv_dtype: DType) -> bool {
        self.supports(Op::Attention, kv_dtype) && crate::ops::attn::attention_fits(desc)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn alloc(&self, dtype: DType, len: usize, usage: BufferUsage) -> Result<DeviceBuffer> {
        let buf = self.alloc_raw(dtype, len, usage)?;
        let s = storage(&buf, "alloc")?;
        if s.bytes > 0 {
            let compute = self.stream(StreamId::COMPUTE)?;
            self.bind()?;
            // Zeroed on the compute stream, after any kernel still reading a reused scratch
            // allocation; other streams are made to wait for the zeroing (on the device, not
            // the host), since the first user may be a copy on another stream.
            // SAFETY: the range lies inside the allocation.
            unsafe { result::memset_d8_async(s.ptr, 0, s.bytes, compute.cu_stream()) }.map_err(|e| driver(e, "zero-fill"))?;
            let others: Vec<_> = self.streams.read().map_err(|_| poisoned())?.iter().skip(1).cloned().collect();
            if !others.is_empty() {
                let ev = compute.record_event(None).map_err(|e| driver(e, "zero-fill event"))?;
                for s in others {
                    s.wait(&ev).map_err(|e| driver(e, "zero-fill wait"))?;
                }
            }
        }
        Ok(buf)
    }

    fn import_host(&self, data: HostBytes, dtype: DType, usage: BufferUsage) -> Result<DeviceBuffer> {
        let Some(len) = dtype.elems_in(data.len()) else {
            return Err(BackendError::Shape(format!("{} bytes are not whole {dtype} values", data.len())));
        };
        let buf = self.alloc_raw(dtype, len, usage)?;
        let dst = storage(&buf, "import")?.ptr;
        if data.is_empty() {
            return Ok(buf);
        }
        let copy = self.stream(COPY_STREAM)?;
        if usage == BufferUsage::Scratch {
            // Reused scratch memory may still be read by queued kernels.
            let ev = self.stream(StreamId::COMPUTE)?.record_event(None).map_err(|e| driver(e, "import event"))?;
            copy.wait(&ev).map_err(|e| driver(e, "import wait"))?;
        }
        let registered = self.host_mode == HostMemoryMode::Register
            && data.len() >= STAGING_BYTES
            && copy_registered(&self.ctx, &copy, data.as_slice(), dst)?;
        if !registered {
            self.bind()?;
            self.staging.lock().map_err(|_| poisoned())?.copy(&copy, data.as_slice(), dst)?;
        }
        // Kernels on the compute stream may use the buffer as soon as this returns.
        let compute = self.stream(StreamId::COMPUTE)?;
        let ev = copy.record_event(None).map_err(|e| driver(e, "import event"))?;
        compute.wait(&ev).map_err(|e| driver(e, "import wait"))?;
        Ok(buf)
    }

    fn upload(&self, stream: StreamId, src: &[u8], dst: &mut DeviceBuffer, dst_offset: usize) -> Result<()> {
        self.stream(stream)?;
        let s = storage(dst, "upload destination")?;
        if dst_offset.checked_add(src.len()).is_none_or(|end| end > s.bytes) {
            return Err(BackendError::Shape(format!("upload of {} bytes at {dst_offset} into {}", src.len(), s.bytes)));
        }
        if src.is_empty() {
            return Ok(());
        }
        self.host_to_device(stream, src, s.ptr + dst_offset as u64)
    }

    fn download(&self, stream: StreamId, src: &DeviceBuffer, src_offset: usize, dst: &mut [u8]) -> Result<()> {
        let st = self.stream(stream)?;
        let s = storage(src, "download source")?;
        if src_offset.checked_add(dst.len()).is_none_or(|end| end > s.bytes) {
            return Err(BackendError::Shape(format!("download of {} bytes at {src_offset} from {}", dst.len(), s.bytes)));
        }
        if dst.is_empty() {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: source range checked; the stream is synchronised before `dst` is released.
        unsafe { result::memcpy_dtoh_async(dst, s.ptr + src_offset as u64, st.cu_stream()) }
            .and_then(|()| st.synchronize())
            .map_err(|e| driver(e, "download"))
    }

    fn copy(&self, stream: StreamId, src: &DeviceBuffer, dst: &mut DeviceBuffer, desc: &CopyDesc) -> Result<()> {
        let st = self.stream(stream)?;
        expect(dst, src.dtype(), "copy destination")?;
        // Block types copy whole blocks, as bytes.
        let (from, bytes) = byte_range(src, desc.src_offset, desc.len, "copy source")?;
        let (to, _) = byte_range(dst, desc.dst_offset, desc.len, "copy destination")?;
        if desc.len == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: both ranges checked above.
        unsafe { result::memcpy_dtod_async(to, from, bytes, st.cu_stream()) }
            .map_err(|e| driver(e, "device copy"))
    }

    fn store(&self, src: &DeviceBuffer, dst: &mut DeviceBuffer, desc: &CopyDesc) -> Result<()> {
        if dst.dtype() == DType::F32 {
            return self.copy(StreamId::COMPUTE, src, dst, desc);
        }
        ops::linear::store(self, src, dst, desc)
    }

    fn supports_store(&self, dtype: DType) -> bool {
        matches!(dtype, DType::F32 | DType::F16 | DType::BF16)
    }

    fn create_stream(&self) -> Result<StreamId> {
        let s = self.ctx.new_stream().map_err(|e| driver(e, "cuStreamCreate"))?;
        let mut streams = self.streams.write().map_err(|_| poisoned())?;
        streams.push(s);
        Ok(StreamId((streams.len() - 1) as u32))
    }

    fn record_event(&self, stream: StreamId) -> Result<EventId> {
        let s = self.stream(stream)?;
        let ev = s.record_event(None).map_err(|e| driver(e, "cuEventRecord"))?;
        self.add_event(ev)
    }

    fn wait_event(&self, stream: StreamId, event: EventId) -> Result<()> {
        let s = self.stream(stream)?;
        self.with_event(event, |ev| match ev {
            Some(ev) => s.wait(ev).map_err(|e| driver(e, "cuStreamWaitEvent")),
            None => Ok(()),
        })
    }

    fn event_done(&self, event: EventId) -> Result<bool> {
        self.with_event(event, |ev| match ev {
            Some(ev) => ev.try_is_complete().map_err(|e| driver(e, "cuEventQuery")),
            None => Ok(true),
        })
    }

    fn synchronize(&self, stream: StreamId) -> Result<()> {
        self.stream(stream)?.synchronize().map_err(|e| driver(e, "cuStreamSynchronize"))
    }

    fn matmul(&self, x: &DeviceBuffer, w: &DeviceBuffer, bias: Option<&DeviceBuffer>, out: &mut DeviceBuffer, desc: &MatmulDesc) -> Result<()> {
        ops::linear::matmul(self, x, w, bias, out, desc)
    }

    fn rms_norm(&self, x: &DeviceBuffer, w: &DeviceBuffer, out: &mut DeviceBuffer, desc: &RmsNormDesc) -> Result<()> {
        ops::linear::rms_norm(self, x, w, out, desc)
    }

    fn rope(&self, x: &mut DeviceBuffer, desc: &RopeDesc) -> Result<()> {
        ops::linear::rope(self, x, desc)
    }

    fn attention(
        &self,
        q: &DeviceBuffer,
        k_cache: &DeviceBuffer,
        v_cache: &DeviceBuffer,
        sinks: Option<&DeviceBuffer>,
        out: &mut DeviceBuffer,
        desc: &AttentionDesc,
    ) -> Result<()> {
        ops::attn::attention(self, q, k_cache, v_cache, None, sinks, out, desc)
    }

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
        ops::attn::attention(self, q, k_pool, v_pool, Some(pages), sinks, out, desc)
    }

    fn binary(&self, op: BinaryOp, a: &mut DeviceBuffer, b: &DeviceBuffer, n: usize) -> Result<()> {
        ops::linear::binary(self, op, a, b, n)
    }

    fn scale(&self, x: &mut DeviceBuffer, s: f32, n: usize) -> Result<()> {
        ops::linear::scale(self, x, s, n)
    }

    fn softmax(&self, x: &mut DeviceBuffer, rows: usize, cols: usize) -> Result<()> {
        ops::linear::softmax(self, x, rows, cols)
    }

    fn top_k(&self, x: &DeviceBuffer, rows: usize, cols: usize, k: usize) -> Result<TopK> {
        ops::linear::top_k(self, x, rows, cols, k)
    }

    fn gather_rows(&self, src: &DeviceBuffer, ids: &[u32], cols: usize, out: &mut DeviceBuffer) -> Result<()> {
        ops::rows::gather_rows(self, src, ids, cols, out)
    }

    fn scatter_add_rows(&self, acc: &mut DeviceBuffer, x: &DeviceBuffer, rows: &[u32], scales: &[f32], cols: usize) -> Result<()> {
        ops::rows::scatter_add_rows(self, acc, x, rows, scales, cols)
    }

    fn causal_conv1d(&self, x: &DeviceBuffer, w: &DeviceBuffer, state: &mut DeviceBuffer, out: &mut DeviceBuffer, desc: &ConvDesc) -> Result<()> {
        ops::attn::causal_conv1d(self, x, w, state, out, desc)
    }

    fn gated_delta_rule(&self, inputs: &DeltaRuleInputs<'_>, state: &mut DeviceBuffer, out: &mut DeviceBuffer, desc: &DeltaRuleDesc) -> Result<()> {
        ops::attn::gated_delta_rule(self, inputs, state, out, desc)
    }
}
