//! `impl Backend for WgpuBackend`: streams and events over the single queue, and the
//! kernels of [`crate::ops`] and [`crate::elementwise`].

use crate::memory::wbuf;
use crate::WgpuBackend;
use ft_backend::{
    AttentionDesc, Backend, BackendError, BackendKind, BinaryOp, BufferUsage, ConvDesc, CopyDesc,
    DType, DeltaRuleDesc, DeltaRuleInputs, DeviceBuffer, EventId, HostBytes, KvPages, MatmulDesc,
    MemoryInfo, Op, Result, RmsNormDesc, RopeDesc, StreamId, TopK,
};
use std::any::Any;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

impl WgpuBackend {
    fn check_stream(&self, s: StreamId) -> Result<()> {
        if s.0 < self.next_stream.load(Ordering::Relaxed) {
            Ok(())
        } else {
            Err(BackendError::Invalid(format!("unknown stream {}", s.0)))
        }
    }

    fn event_flag(&self, e: EventId) -> Result<Arc<AtomicBool>> {
        let events = self
            .events
            .lock()
            .map_err(|_| BackendError::Device("event list poisoned".into()))?;
        usize::try_from(e.0)
            .ok()
            .and_then(|i| events.get(i).cloned())
            .ok_or_else(|| BackendError::Invalid(format!("unknown event {}", e.0)))
    }
}

impl Backend for WgpuBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Wgpu
    }

    fn device_name(&self) -> String {
        self.describe()
    }

    fn memory_info(&self) -> Result<MemoryInfo> {
        Ok(self.memory())
    }

    fn supports(&self, op: Op, dtype: DType) -> bool {
        // Every op in the plain dtypes, and matmul with every block-quantized weight type
        // (matmul_quant.wgsl, checked by the conformance suite on lavapipe).
        op.fully_supported(dtype)
    }

    fn supports_attention(&self, desc: &AttentionDesc, kv_dtype: DType) -> bool {
        self.supports(Op::Attention, kv_dtype) && crate::ops::attention_fits(desc)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn alloc(&self, dtype: DType, len: usize, usage: BufferUsage) -> Result<DeviceBuffer> {
        self.alloc_buffer(dtype, len, usage)
    }

    fn import_host(
        &self,
        data: HostBytes,
        dtype: DType,
        usage: BufferUsage,
    ) -> Result<DeviceBuffer> {
        self.import(data, dtype, usage)
    }

    fn upload(
        &self,
        stream: StreamId,
        src: &[u8],
        dst: &mut DeviceBuffer,
        dst_offset: usize,
    ) -> Result<()> {
        self.check_stream(stream)?;
        self.write_bytes(dst, dst_offset, src)
    }

    fn download(
        &self,
        stream: StreamId,
        src: &DeviceBuffer,
        src_offset: usize,
        dst: &mut [u8],
    ) -> Result<()> {
        self.check_stream(stream)?;
        let b = wbuf(src, "download source")?;
        if src_offset
            .checked_add(dst.len())
            .is_none_or(|end| end > src.size_bytes())
        {
            return Err(BackendError::Shape(format!(
                "download of {} bytes at {src_offset} from {}",
                dst.len(),
                src.size_bytes()
            )));
        }
        self.read_bytes(b, src_offset as u64, dst)
    }

    fn copy(
        &self,
        stream: StreamId,
        src: &DeviceBuffer,
        dst: &mut DeviceBuffer,
        desc: &CopyDesc,
    ) -> Result<()> {
        self.check_stream(stream)?;
        self.copy_elements(src, dst, desc)
    }

    fn store(&self, src: &DeviceBuffer, dst: &mut DeviceBuffer, desc: &CopyDesc) -> Result<()> {
        self.store_elements(src, dst, desc)
    }

    fn supports_store(&self, dtype: DType) -> bool {
        matches!(dtype, DType::F32 | DType::F16 | DType::BF16)
    }

    fn create_stream(&self) -> Result<StreamId> {
        Ok(StreamId(self.next_stream.fetch_add(1, Ordering::Relaxed)))
    }

    fn record_event(&self, stream: StreamId) -> Result<EventId> {
        self.check_stream(stream)?;
        let flag = Arc::new(AtomicBool::new(false));
        let f = flag.clone();
        // Fires once everything submitted so far (on any stream: there is one queue) is done.
        self.queue
            .on_submitted_work_done(move || f.store(true, Ordering::Release));
        let mut events = self
            .events
            .lock()
            .map_err(|_| BackendError::Device("event list poisoned".into()))?;
        events.push(flag);
        Ok(EventId(events.len() as u64 - 1))
    }

    fn wait_event(&self, stream: StreamId, event: EventId) -> Result<()> {
        // The single queue already runs later work after everything recorded before it.
        self.check_stream(stream)?;
        self.event_flag(event).map(|_| ())
    }

    fn event_done(&self, event: EventId) -> Result<bool> {
        let flag = self.event_flag(event)?;
        if !flag.load(Ordering::Acquire) {
            self.device
                .poll(wgpu::PollType::Poll)
                .map_err(|e| BackendError::Device(format!("wgpu poll: {e}")))?;
        }
        Ok(flag.load(Ordering::Acquire))
    }

    fn synchronize(&self, stream: StreamId) -> Result<()> {
        self.check_stream(stream)?;
        self.wait_idle()
    }

    fn matmul(
        &self,
        x: &DeviceBuffer,
        w: &DeviceBuffer,
        bias: Option<&DeviceBuffer>,
        out: &mut DeviceBuffer,
        desc: &MatmulDesc,
    ) -> Result<()> {
        self.run_matmul(x, w, bias, out, desc)
    }

    fn rms_norm(
        &self,
        x: &DeviceBuffer,
        w: &DeviceBuffer,
        out: &mut DeviceBuffer,
        desc: &RmsNormDesc,
    ) -> Result<()> {
        self.run_rms_norm(x, w, out, desc)
    }

    fn rope(&self, x: &mut DeviceBuffer, desc: &RopeDesc) -> Result<()> {
        self.run_rope(x, desc)
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
        self.run_attention(q, k_cache, v_cache, None, sinks, out, desc)
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
        self.run_attention(q, k_pool, v_pool, Some(pages), sinks, out, desc)
    }

    fn binary(&self, op: BinaryOp, a: &mut DeviceBuffer, b: &DeviceBuffer, n: usize) -> Result<()> {
        self.run_binary(op, a, b, n)
    }

    fn scale(&self, x: &mut DeviceBuffer, s: f32, n: usize) -> Result<()> {
        self.run_scale(x, s, n)
    }

    fn softmax(&self, x: &mut DeviceBuffer, rows: usize, cols: usize) -> Result<()> {
        self.run_softmax(x, rows, cols)
    }

    fn top_k(&self, x: &DeviceBuffer, rows: usize, cols: usize, k: usize) -> Result<TopK> {
        self.run_top_k(x, rows, cols, k)
    }

    fn gather_rows(
        &self,
        src: &DeviceBuffer,
        ids: &[u32],
        cols: usize,
        out: &mut DeviceBuffer,
    ) -> Result<()> {
        self.run_gather(src, ids, cols, out)
    }

    fn scatter_add_rows(
        &self,
        acc: &mut DeviceBuffer,
        x: &DeviceBuffer,
        rows: &[u32],
        scales: &[f32],
        cols: usize,
    ) -> Result<()> {
        self.run_scatter_add(acc, x, rows, scales, cols)
    }

    fn causal_conv1d(
        &self,
        x: &DeviceBuffer,
        w: &DeviceBuffer,
        state: &mut DeviceBuffer,
        out: &mut DeviceBuffer,
        desc: &ConvDesc,
    ) -> Result<()> {
        self.run_conv(x, w, state, out, desc)
    }

    fn gated_delta_rule(
        &self,
        inputs: &DeltaRuleInputs<'_>,
        state: &mut DeviceBuffer,
        out: &mut DeviceBuffer,
        desc: &DeltaRuleDesc,
    ) -> Result<()> {
        self.run_delta_rule(inputs, state, out, desc)
    }
}
