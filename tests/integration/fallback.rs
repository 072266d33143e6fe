//! What a device has no kernel for runs on the CPU instead of failing. A device that says
//! (through `supports` / `supports_attention`) it has no quantized matmul and no attention
//! past head size 16, and refuses such calls, still runs the quantized fixtures (FP8 with
//! MLA, NVFP4, MXFP4 with sinks): logits equal the plain CPU run's (the same kernels, so
//! within 1e-5), and the refused ops are never asked of it.

use crate::common::*;
use ft_actor::kv::SequenceState;
use ft_actor::model::{Logits, Model};
use ft_actor::quantize::{quantize_checkpoint, QuantFormat, QuantizeOptions};
use ft_backend::*;
use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A CPU backend that claims less than it has, and refuses what it does not claim.
struct Restricted {
    inner: Arc<dyn Backend>,
    refused: AtomicU64,
    attention_calls: AtomicU64,
}

const MAX_HEAD: usize = 16;

impl Restricted {
    fn refuse(&self, op: Op, dtype: DType) -> BackendError {
        self.refused.fetch_add(1, Ordering::Relaxed);
        BackendError::Unsupported { backend: "restricted".into(), op, dtype }
    }
}

impl Backend for Restricted {
    fn kind(&self) -> BackendKind {
        self.inner.kind()
    }
    fn device_name(&self) -> String {
        "restricted CPU".into()
    }
    fn memory_info(&self) -> Result<MemoryInfo> {
        self.inner.memory_info()
    }
    fn supports(&self, op: Op, dtype: DType) -> bool {
        !(op == Op::Matmul && dtype.is_quantized()) && self.inner.supports(op, dtype)
    }
    fn supports_attention(&self, desc: &AttentionDesc, kv_dtype: DType) -> bool {
        desc.head_dim <= MAX_HEAD && desc.v_head_dim <= MAX_HEAD && self.supports(Op::Attention, kv_dtype)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn alloc(&self, dtype: DType, len: usize, usage: BufferUsage) -> Result<DeviceBuffer> {
        self.inner.alloc(dtype, len, usage)
    }
    fn import_host(&self, data: HostBytes, dtype: DType, usage: BufferUsage) -> Result<DeviceBuffer> {
        self.inner.import_host(data, dtype, usage)
    }
    fn upload(&self, stream: StreamId, src: &[u8], dst: &mut DeviceBuffer, dst_offset: usize) -> Result<()> {
        self.inner.upload(stream, src, dst, dst_offset)
    }
    fn download(&self, stream: StreamId, src: &DeviceBuffer, src_offset: usize, dst: &mut [u8]) -> Result<()> {
        self.inner.download(stream, src, src_offset, dst)
    }
    fn copy(&self, stream: StreamId, src: &DeviceBuffer, dst: &mut DeviceBuffer, desc: &CopyDesc) -> Result<()> {
        self.inner.copy(stream, src, dst, desc)
    }
    fn create_stream(&self) -> Result<StreamId> {
        self.inner.create_stream()
    }
    fn record_event(&self, stream: StreamId) -> Result<EventId> {
        self.inner.record_event(stream)
    }
    fn wait_event(&self, stream: StreamId, event: EventId) -> Result<()> {
        self.inner.wait_event(stream, event)
    }
    fn event_done(&self, event: EventId) -> Result<bool> {
        self.inner.event_done(event)
    }
    fn synchronize(&self, stream: StreamId) -> Result<()> {
        self.inner.synchronize(stream)
    }
    fn matmul(&self, x: &DeviceBuffer, w: &DeviceBuffer, bias: Option<&DeviceBuffer>, out: &mut DeviceBuffer, desc: &MatmulDesc) -> Result<()> {
        if !self.supports(Op::Matmul, w.dtype()) {
            return Err(self.refuse(Op::Matmul, w.dtype()));
        }
        self.inner.matmul(x, w, bias, out, desc)
    }
    fn rms_norm(&self, x: &DeviceBuffer, w: &DeviceBuffer, out: &mut DeviceBuffer, desc: &RmsNormDesc) -> Result<()> {
        self.inner.rms_norm(x, w, out, desc)
    }
    fn rope(&self, x: &mut DeviceBuffer, desc: &RopeDesc) -> Result<()> {
        self.inner.rope(x, desc)
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
        if !self.supports_attention(desc, k_cache.dtype()) {
            return Err(self.refuse(Op::Attention, k_cache.dtype()));
        }
        self.attention_calls.fetch_add(1, Ordering::Relaxed);
        self.inner.attention(q, k_cache, v_cache, sinks, out, desc)
    }
    fn binary(&self, op: BinaryOp, a: &mut DeviceBuffer, b: &DeviceBuffer, n: usize) -> Result<()> {
        self.inner.binary(op, a, b, n)
    }
    fn scale(&self, x: &mut DeviceBuffer, s: f32, n: usize) -> Result<()> {
        self.inner.scale(x, s, n)
    }
    fn softmax(&self, x: &mut DeviceBuffer, rows: usize, cols: usize) -> Result<()> {
        self.inner.softmax(x, rows, cols)
    }
    fn top_k(&self, x: &DeviceBuffer, rows: usize, cols: usize, k: usize) -> Result<TopK> {
        self.inner.top_k(x, rows, cols, k)
    }
    fn gather_rows(&self, src: &DeviceBuffer, ids: &[u32], cols: usize, out: &mut DeviceBuffer) -> Result<()> {
        self.inner.gather_rows(src, ids, cols, out)
    }
    fn scatter_add_rows(&self, acc: &mut DeviceBuffer, x: &DeviceBuffer, rows: &[u32], scales: &[f32], cols: usize) -> Result<()> {
        self.inner.scatter_add_rows(acc, x, rows, scales, cols)
    }
    fn causal_conv1d(&self, x: &DeviceBuffer, w: &DeviceBuffer, state: &mut DeviceBuffer, out: &mut DeviceBuffer, desc: &ConvDesc) -> Result<()> {
        self.inner.causal_conv1d(x, w, state, out, desc)
    }
    fn gated_delta_rule(&self, inputs: &DeltaRuleInputs<'_>, state: &mut DeviceBuffer, out: &mut DeviceBuffer, desc: &DeltaRuleDesc) -> Result<()> {
        self.inner.gated_delta_rule(inputs, state, out, desc)
    }
}

#[test]
fn ops_the_device_refuses_run_on_the_cpu_with_the_same_logits() {
    // (fixture, format, whether its attention fits the device: gpt-oss's heads of 16 do,
    // Qwen3.5's 32 and DeepSeek's latent 40 run on the CPU)
    let cases = [("deepseek_v3", QuantFormat::Fp8, false), ("qwen3_5_moe", QuantFormat::Nvfp4, false), ("gpt_oss", QuantFormat::Mxfp4, true)];
    for (name, format, on_device) in cases {
        let out = scratch_dir("ft-actor-fallback-", &format!("{name}-{format:?}"));
        let opts = QuantizeOptions { model: fixture(name).join("checkpoint"), out: out.clone(), format, overwrite: true, twin: None };
        quantize_checkpoint(&opts, |_, _| {}).unwrap_or_else(|e| panic!("{name}: {e}"));
        let restricted = Arc::new(Restricted { inner: cpu_backend(), refused: AtomicU64::new(0), attention_calls: AtomicU64::new(0) });
        let mr = Model::load(&out, restricted.clone(), &mut |_, _| {}).unwrap_or_else(|e| panic!("{name} {format:?} on a restricted device: {e}"));
        let mc = load_path(&out);
        for (p, ids) in prompts(&reference_json(name)).iter().enumerate() {
            let run = |m: &Model| {
                let mut s = SequenceState::new(m, ids.len() + 1).unwrap();
                let mut l = m.forward(&mut s, ids, Logits::All).unwrap_or_else(|e| panic!("{name} p{p}: {e}"));
                // One decode step too: attention against a cache.
                l.extend(m.forward(&mut s, &[ids[0]], Logits::Last).unwrap());
                l
            };
            let (lr, lc) = (run(&mr), run(&mc));
            let d = max_abs_diff(&lr, &lc);
            assert!(d <= 1e-5, "{name} {format:?} p{p}: logits differ by {d}");
        }
        assert_eq!(restricted.refused.load(Ordering::Relaxed), 0, "{name}: an op the device refuses was asked of it");
        let attn = restricted.attention_calls.load(Ordering::Relaxed);
        assert_eq!(attn > 0, on_device, "{name}: {attn} attention calls on the device");
    }
}
