//! Ops the device has no kernel for run on the CPU backend instead: the device says so
//! through `supports` / `supports_attention`, and the model moves that op's inputs to host
//! memory, runs the CPU kernel and puts the result back. Weights of a linear layer whose
//! block type the device cannot multiply stay in host memory for good (a CPU-backend buffer
//! over the mapped file), so only activations cross.

use super::ModelError;
use ft_backend::{AttentionDesc, Backend, BufferUsage, DType, DeviceBuffer, HostBytes, MatmulDesc, StreamId};
use std::sync::{Arc, OnceLock};

/// The CPU backend that runs what the device cannot; made on first need.
#[derive(Default)]
pub struct HostCpu(OnceLock<Arc<dyn Backend>>);

impl HostCpu {
    /// The CPU backend (a pool of its own: it only runs when the device cannot).
    pub fn get(&self) -> Result<Arc<dyn Backend>, ModelError> {
        if let Some(b) = self.0.get() {
            return Ok(b.clone());
        }
        let b: Arc<dyn Backend> = Arc::new(ft_backend_cpu::CpuBackend::new(ft_backend_cpu::CpuOptions::default())?);
        Ok(self.0.get_or_init(|| b).clone())
    }
}

/// The first `len` f32 values of a device buffer, as a buffer of `cpu`.
fn to_host(be: &dyn Backend, cpu: &dyn Backend, buf: &DeviceBuffer, elems: usize) -> Result<DeviceBuffer, ModelError> {
    let bytes = buf.dtype().row_bytes(elems).min(buf.size_bytes());
    let mut host = vec![0u8; bytes];
    be.download(StreamId::COMPUTE, buf, 0, &mut host)?;
    be.synchronize(StreamId::COMPUTE)?;
    Ok(cpu.import_host(HostBytes::from_vec(host), buf.dtype(), BufferUsage::Scratch)?)
}

/// Copies `len` f32 values from `cpu`'s `src` into the device buffer `dst` at element `at`.
pub fn to_device(be: &dyn Backend, cpu: &dyn Backend, src: &DeviceBuffer, dst: &mut DeviceBuffer, at: usize, len: usize) -> Result<(), ModelError> {
    let mut host = vec![0u8; len * 4];
    cpu.download(StreamId::COMPUTE, src, at * 4, &mut host)?;
    be.upload(StreamId::COMPUTE, &host, dst, at * 4)?;
    Ok(())
}

/// `out = x · wᵀ (+ b)` where `w` and `bias` are `cpu` buffers and `x`, `out` the device's.
pub fn matmul(
    be: &dyn Backend,
    cpu: &dyn Backend,
    x: &DeviceBuffer,
    w: &DeviceBuffer,
    bias: Option<&DeviceBuffer>,
    out: &mut DeviceBuffer,
    desc: &MatmulDesc,
) -> Result<(), ModelError> {
    let xs = to_host(be, cpu, x, desc.x_offset + desc.n * desc.k)?;
    let mut ys = cpu.alloc(DType::F32, desc.out_offset + desc.n * desc.m, BufferUsage::Scratch)?;
    super::reads::matmul(cpu, &xs, w, bias, &mut ys, desc)?;
    to_device(be, cpu, &ys, out, desc.out_offset, desc.n * desc.m)
}

/// Attention on the CPU, for head sizes the device's kernels do not take. The caches come
/// down whole: slow, but it runs, where the device alone would fail.
pub fn attention(
    be: &dyn Backend,
    cpu: &dyn Backend,
    q: &DeviceBuffer,
    k_cache: &DeviceBuffer,
    v_cache: &DeviceBuffer,
    sinks: Option<&DeviceBuffer>,
    out: &mut DeviceBuffer,
    desc: &AttentionDesc,
) -> Result<(), ModelError> {
    let qs = to_host(be, cpu, q, desc.n_tokens * desc.n_heads * desc.head_dim)?;
    let ks = to_host(be, cpu, k_cache, desc.kv_len * desc.n_kv_heads * desc.head_dim)?;
    let vs = to_host(be, cpu, v_cache, desc.kv_len * desc.n_kv_heads * desc.v_head_dim)?;
    let ss = sinks.map(|s| to_host(be, cpu, s, desc.n_heads)).transpose()?;
    let len = desc.n_tokens * desc.n_heads * desc.v_head_dim;
    let mut os = cpu.alloc(DType::F32, len, BufferUsage::Scratch)?;
    cpu.attention(&qs, &ks, &vs, ss.as_ref(), &mut os, desc)?;
    to_device(be, cpu, &os, out, 0, len)
}

/// A whole device buffer copied into a `cpu` buffer (e.g. the bias of a host linear layer).
pub fn move_to(be: &dyn Backend, cpu: &dyn Backend, buf: &DeviceBuffer) -> Result<DeviceBuffer, ModelError> {
    to_host(be, cpu, buf, buf.len())
}
