//! `impl Backend for CpuBackend`: buffer checks around the [`crate::kernels`].

use crate::kernels::{self, attention::KvCache, need};
use crate::storage::{bytes, bytes_mut, expect_dtype, f32s, f32s_mut, range, CpuStorage, Owned};
use crate::{cpu_model, CpuBackend};
use ft_backend::{
    AttentionDesc, Backend, BackendError, BackendKind, BinaryOp, BufferUsage, ConvDesc, CopyDesc, KvPages,
    DType, DeltaRuleDesc, DeltaRuleInputs, DeviceBuffer, EventId, HostBytes, HostRows, MatmulDesc, MatmulPart,
    MemoryInfo, Op, Result, RmsNormDesc, RopeDesc, StreamId, TopK,
};
use rayon::prelude::*;
use std::any::Any;
use std::sync::atomic::Ordering;

/// Element-wise work below this many values stays on the calling thread.
const PARALLEL_MIN: usize = 1 << 16;

/// One product's checked operands (see [`operands`]).
struct Operands<'a> {
    /// `[n, k]` activations.
    x: std::borrow::Cow<'a, [f32]>,
    /// `[m, k]` weight bytes.
    w: &'a [u8],
    /// `[m]` bias.
    bias: Option<std::borrow::Cow<'a, [f32]>>,
    /// `[n, m]` output.
    out: &'a mut [f32],
}

impl Operands<'_> {
    /// Adds the bias, if any, to every `m`-value row of the output.
    fn add_bias(self, m: usize) {
        if let (Some(b), true) = (self.bias, m > 0) {
            self.out.chunks_exact_mut(m).for_each(|row| row.iter_mut().zip(b.iter()).for_each(|(o, b)| *o += b));
        }
    }
}

/// The slices of a product `desc` names, each checked against its buffer: a wrong length,
/// type or offset is an error here, before any kernel reads.
fn operands<'a>(
    x: &'a DeviceBuffer,
    w: &'a DeviceBuffer,
    bias: Option<&'a DeviceBuffer>,
    out: &'a mut DeviceBuffer,
    desc: &MatmulDesc,
) -> Result<Operands<'a>> {
    let MatmulDesc { n, k, m, .. } = *desc;
    let x = f32s(x, desc.x_offset, need(n, k, "x")?, "matmul x")?;
    // Weights are rows of whole blocks (a block is one element of a plain dtype): the
    // offset and the length count blocks.
    let (dt, be) = (w.dtype(), w.dtype().block_elems());
    if !desc.w_offset.is_multiple_of(be) {
        return Err(BackendError::Shape(format!("{dt} weight offset {} is not on a block boundary", desc.w_offset)));
    }
    let w = range(bytes(w, "matmul w")?, desc.w_offset / be, need(m, k.div_ceil(be), "w")?, dt.size(), "matmul w")?;
    let bias = bias.map(|b| f32s(b, desc.bias_offset, m, "matmul bias")).transpose()?;
    let out = f32s_mut(out, desc.out_offset, need(n, m, "out")?, "matmul out")?;
    Ok(Operands { x, w, bias, out })
}

impl CpuBackend {
    /// Attention over contiguous caches, or over the pages `pages` names in pools.
    #[allow(clippy::too_many_arguments)]
    fn attend(
        &self,
        q: &DeviceBuffer,
        k: &DeviceBuffer,
        v: &DeviceBuffer,
        pages: Option<&KvPages<'_>>,
        sinks: Option<&DeviceBuffer>,
        out: &mut DeviceBuffer,
        desc: &AttentionDesc,
    ) -> Result<()> {
        let qs = f32s(q, 0, q.len(), "attention q")?;
        let kc = KvCache { bytes: bytes(k, "attention k cache")?, dtype: k.dtype() };
        let vc = KvCache { bytes: bytes(v, "attention v cache")?, dtype: v.dtype() };
        let sinks = sinks.map(|s| f32s(s, 0, s.len(), "attention sinks")).transpose()?;
        let len = out.len();
        let o = f32s_mut(out, 0, len, "attention out")?;
        kernels::attention(&self.pool, self.simd, &qs, kc, vc, pages, sinks.as_deref(), o, desc)
    }

    fn check_stream(&self, s: StreamId) -> Result<()> {
        if s.0 < self.next_stream.load(Ordering::Relaxed) {
            Ok(())
        } else {
            Err(BackendError::Invalid(format!("unknown stream {}", s.0)))
        }
    }

    fn check_event(&self, e: EventId) -> Result<()> {
        if e.0 < self.next_event.load(Ordering::Relaxed) {
            Ok(())
        } else {
            Err(BackendError::Invalid(format!("unknown event {}", e.0)))
        }
    }

    /// Chunk length for splitting `n` values over the pool, or `None` to stay inline.
    fn split(&self, n: usize, unit: usize) -> Option<usize> {
        (self.threads > 1 && n >= PARALLEL_MIN && unit > 0)
            .then(|| (n / unit).div_ceil(self.threads * 4).max(1) * unit)
    }
}

impl Backend for CpuBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Cpu
    }

    fn device_name(&self) -> String {
        let model = cpu_model().unwrap_or_else(|| "CPU".to_string());
        // The tiles take the reduced-precision (int8-mode) prefill products only.
        let amx = if self.quant_dot == crate::QuantDot::Int8 && self.simd.effective() == crate::SimdLevel::Avx512 && crate::kernels::amx_tiles() { ", AMX tiles" } else { "" };
        format!("{model} ({} threads, {}{amx})", self.threads, self.simd)
    }

    fn memory_info(&self) -> Result<MemoryInfo> {
        Ok(self.memory())
    }

    fn supports(&self, op: Op, dtype: DType) -> bool {
        // Every op is implemented, for every dtype the trait allows; and Q8_0 as a KV cache
        // (stored, copied in whole blocks, attended over).
        op.fully_supported(dtype) || (dtype == DType::Q8_0 && matches!(op, Op::Attention | Op::Copy))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn alloc(&self, dtype: DType, len: usize, usage: BufferUsage) -> Result<DeviceBuffer> {
        let size = dtype.bytes_for(len).ok_or_else(|| {
            BackendError::Shape(format!(
                "allocation of {len} {dtype} values: not whole blocks of {}, or overflows",
                dtype.block_elems()
            ))
        })?;
        // A soft limit: concurrent allocations may overshoot by one buffer each, which is fine
        // for capacity planning and avoids a lock on this path.
        let free = self
            .total
            .saturating_sub(self.allocated.load(Ordering::Relaxed));
        let oom = || BackendError::OutOfMemory {
            requested: size as u64,
            free,
        };
        if size as u64 > free {
            return Err(oom());
        }
        let owned = Owned::zeroed(size, self.allocated.clone()).ok_or_else(oom)?;
        Ok(DeviceBuffer::new(
            Box::new(CpuStorage::Owned(owned)),
            dtype,
            len,
            usage,
        ))
    }

    fn import_host(
        &self,
        data: HostBytes,
        dtype: DType,
        usage: BufferUsage,
    ) -> Result<DeviceBuffer> {
        let len = dtype.elems_in(data.len()).ok_or_else(|| {
            BackendError::Shape(format!("{} bytes are not whole {dtype} values", data.len()))
        })?;
        // Zero-copy: kernels read the caller's bytes where they are, at any alignment.
        Ok(DeviceBuffer::new(
            Box::new(CpuStorage::Imported(data)),
            dtype,
            len,
            usage,
        ))
    }

    fn upload(
        &self,
        stream: StreamId,
        src: &[u8],
        dst: &mut DeviceBuffer,
        dst_offset: usize,
    ) -> Result<()> {
        self.check_stream(stream)?;
        let d = bytes_mut(dst, "upload destination")?;
        let have = d.len();
        let to = dst_offset
            .checked_add(src.len())
            .and_then(|end| d.get_mut(dst_offset..end))
            .ok_or_else(|| {
                BackendError::Shape(format!(
                    "upload of {} bytes at {dst_offset} into {have}",
                    src.len()
                ))
            })?;
        to.copy_from_slice(src);
        Ok(())
    }

    fn download(
        &self,
        stream: StreamId,
        src: &DeviceBuffer,
        src_offset: usize,
        dst: &mut [u8],
    ) -> Result<()> {
        self.check_stream(stream)?;
        let s = bytes(src, "download source")?;
        let from = src_offset
            .checked_add(dst.len())
            .and_then(|end| s.get(src_offset..end))
            .ok_or_else(|| {
                BackendError::Shape(format!(
                    "download of {} bytes at {src_offset} from {}",
                    dst.len(),
                    s.len()
                ))
            })?;
        dst.copy_from_slice(from);
        Ok(())
    }

    fn copy(
        &self,
        stream: StreamId,
        src: &DeviceBuffer,
        dst: &mut DeviceBuffer,
        desc: &CopyDesc,
    ) -> Result<()> {
        self.check_stream(stream)?;
        expect_dtype(dst, src.dtype(), "copy destination")?;
        if src.dtype().is_quantized() && !self.supports(Op::Copy, src.dtype()) {
            return Err(BackendError::Unsupported {
                backend: "cpu".into(),
                op: Op::Copy,
                dtype: src.dtype(),
            });
        }
        // In units of whole blocks (one element for the plain types).
        let desc = &block_units(src.dtype(), desc)?;
        let es = src.dtype().size();
        let from = range(
            bytes(src, "copy source")?,
            desc.src_offset,
            desc.len,
            es,
            "copy source",
        )?;
        let to = bytes_mut(dst, "copy destination")?;
        let to_len = to.len();
        let to = range_mut_bytes(to, desc.dst_offset, desc.len, es).ok_or_else(|| {
            BackendError::Shape(format!(
                "copy of {} at {} into {} elements",
                desc.len,
                desc.dst_offset,
                to_len / es
            ))
        })?;
        to.copy_from_slice(from);
        Ok(())
    }

    fn store(&self, src: &DeviceBuffer, dst: &mut DeviceBuffer, desc: &CopyDesc) -> Result<()> {
        let dtype = dst.dtype();
        if dtype == DType::F32 {
            return self.copy(StreamId::COMPUTE, src, dst, desc);
        }
        if !self.supports_store(dtype) {
            return Err(BackendError::Unsupported { backend: "cpu".into(), op: Op::Copy, dtype });
        }
        let from = f32s(src, desc.src_offset, desc.len, "store source")?;
        if dtype.is_quantized() {
            let blocks = block_units(dtype, &CopyDesc { src_offset: 0, ..*desc })?;
            let to = crate::storage::range_mut(bytes_mut(dst, "store destination")?, blocks.dst_offset, blocks.len, dtype.size(), "store destination")?;
            let mut packed = Vec::with_capacity(to.len());
            ft_backend::quant::quantize_row(dtype, &from, &mut packed);
            to.copy_from_slice(&packed);
            return Ok(());
        }
        let to = crate::storage::range_mut(bytes_mut(dst, "store destination")?, desc.dst_offset, desc.len, 2, "store destination")?;
        for (o, &v) in to.chunks_exact_mut(2).zip(from.iter()) {
            let bits = if dtype == DType::BF16 {
                half::bf16::from_f32(v).to_bits()
            } else {
                half::f16::from_f32(v.clamp(-65504.0, 65504.0)).to_bits()
            };
            o.copy_from_slice(&bits.to_le_bytes());
        }
        Ok(())
    }

    fn supports_store(&self, dtype: DType) -> bool {
        matches!(dtype, DType::F32 | DType::BF16 | DType::F16 | DType::Q8_0)
    }

    fn create_stream(&self) -> Result<StreamId> {
        Ok(StreamId(self.next_stream.fetch_add(1, Ordering::Relaxed)))
    }

    fn record_event(&self, stream: StreamId) -> Result<EventId> {
        self.check_stream(stream)?;
        Ok(EventId(self.next_event.fetch_add(1, Ordering::Relaxed)))
    }

    fn wait_event(&self, stream: StreamId, event: EventId) -> Result<()> {
        self.check_stream(stream)?;
        self.check_event(event)
    }

    fn event_done(&self, event: EventId) -> Result<bool> {
        // Every call finished before it returned, so any issued event is complete.
        self.check_event(event).map(|()| true)
    }

    fn synchronize(&self, stream: StreamId) -> Result<()> {
        self.check_stream(stream)
    }

    fn matmul(
        &self,
        x: &DeviceBuffer,
        w: &DeviceBuffer,
        bias: Option<&DeviceBuffer>,
        out: &mut DeviceBuffer,
        desc: &MatmulDesc,
    ) -> Result<()> {
        let MatmulDesc { n, k, m, .. } = *desc;
        let op = operands(x, w, bias, out, desc)?;
        kernels::matmul(Some(&self.pool), self.simd, self.quant_dot, &op.x, n, k, op.w, w.dtype(), m, op.out)?;
        op.add_bias(m);
        Ok(())
    }

    /// Parts over the same rows of `x` run as one [`kernels::matmul_same_x`] call (one list of
    /// row chunks over the pool for decode-sized parts, one activation preparation for larger
    /// ones); parts over different rows one [`kernels::matmul`] after another. Each part gets
    /// the bits [`Backend::matmul`] gives it.
    fn matmul_same_x(&self, x: &DeviceBuffer, parts: &mut [MatmulPart<'_>]) -> Result<()> {
        let mut ops = Vec::with_capacity(parts.len());
        for p in parts.iter_mut() {
            ops.push((operands(x, p.w, p.bias, p.out, &p.desc)?, p.desc, p.w.dtype()));
        }
        let rows = |d: &MatmulDesc| (d.n, d.k, d.x_offset);
        match ops.first().map(|(_, d, _)| *d) {
            Some(first) if ops.iter().all(|(_, d, _)| rows(d) == rows(&first)) => {
                // The operands hold the same checked rows of `x`; these are borrowed apart
                // from the outputs the items take.
                let xs = f32s(x, first.x_offset, need(first.n, first.k, "x")?, "matmul x")?;
                let mut items: Vec<kernels::SameX<'_>> =
                    ops.iter_mut().map(|(o, d, dtype)| kernels::SameX { w: o.w, dtype: *dtype, m: d.m, out: &mut *o.out }).collect();
                kernels::matmul_same_x(Some(&self.pool), self.simd, self.quant_dot, &xs, first.n, first.k, &mut items)?;
            }
            _ => {
                for (o, d, dtype) in ops.iter_mut() {
                    kernels::matmul(Some(&self.pool), self.simd, self.quant_dot, &o.x, d.n, d.k, o.w, *dtype, d.m, o.out)?;
                }
            }
        }
        for (o, d, _) in ops {
            o.add_bias(d.m);
        }
        Ok(())
    }

    fn rms_norm(
        &self,
        x: &DeviceBuffer,
        w: &DeviceBuffer,
        out: &mut DeviceBuffer,
        desc: &RmsNormDesc,
    ) -> Result<()> {
        let total = need(desc.rows, desc.dim, "rms_norm")?;
        let xs = f32s(x, 0, total, "rms_norm x")?;
        let mut g = vec![0f32; desc.dim];
        let wb = range(
            bytes(w, "rms_norm w")?,
            0,
            desc.dim,
            w.dtype().size(),
            "rms_norm w",
        )?;
        kernels::decode_row(self.simd, wb, w.dtype(), &mut g)?;
        let o = f32s_mut(out, 0, total, "rms_norm out")?;
        let run =
            |x: &[f32], o: &mut [f32]| kernels::rms_norm_rows(x, &g, desc.eps, desc.unit_offset, o);
        match self.split(total, desc.dim) {
            Some(chunk) => self.pool.install(|| {
                o.par_chunks_mut(chunk)
                    .zip(xs.par_chunks(chunk))
                    .try_for_each(|(o, x)| run(x, o))
            }),
            None => run(&xs, o),
        }
    }

    fn rope(&self, x: &mut DeviceBuffer, desc: &RopeDesc) -> Result<()> {
        let len = x.len();
        kernels::rope(&self.pool, f32s_mut(x, 0, len, "rope x")?, desc)
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
        self.attend(q, k_cache, v_cache, None, sinks, out, desc)
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
        self.attend(q, k_pool, v_pool, Some(pages), sinks, out, desc)
    }

    fn binary(&self, op: BinaryOp, a: &mut DeviceBuffer, b: &DeviceBuffer, n: usize) -> Result<()> {
        let bs = f32s(b, 0, n, "binary b")?;
        let a = f32s_mut(a, 0, n, "binary a")?;
        match self.split(n, 1) {
            Some(chunk) => self.pool.install(|| {
                a.par_chunks_mut(chunk)
                    .zip(bs.par_chunks(chunk))
                    .try_for_each(|(a, b)| kernels::binary(self.simd, op, a, b))
            }),
            None => kernels::binary(self.simd, op, a, &bs),
        }
    }

    fn scale(&self, x: &mut DeviceBuffer, s: f32, n: usize) -> Result<()> {
        kernels::scale(f32s_mut(x, 0, n, "scale x")?, s);
        Ok(())
    }

    fn softmax(&self, x: &mut DeviceBuffer, rows: usize, cols: usize) -> Result<()> {
        let x = f32s_mut(x, 0, need(rows, cols, "softmax")?, "softmax x")?;
        match self.split(x.len(), cols) {
            Some(chunk) => self.pool.install(|| {
                x.par_chunks_mut(chunk)
                    .try_for_each(|r| kernels::softmax_rows(self.simd, r, cols))
            }),
            None => kernels::softmax_rows(self.simd, x, cols),
        }
    }

    fn top_k(&self, x: &DeviceBuffer, rows: usize, cols: usize, k: usize) -> Result<TopK> {
        kernels::top_k(
            &f32s(x, 0, need(rows, cols, "top_k")?, "top_k x")?,
            rows,
            cols,
            k,
        )
    }

    fn gather_rows(
        &self,
        src: &DeviceBuffer,
        ids: &[u32],
        cols: usize,
        out: &mut DeviceBuffer,
    ) -> Result<()> {
        let table = bytes(src, "gather table")?;
        let o = f32s_mut(out, 0, need(ids.len(), cols, "gather")?, "gather out")?;
        kernels::gather_rows(self.simd, table, src.dtype(), ids, cols, o)
    }

    fn scatter_add_rows(
        &self,
        acc: &mut DeviceBuffer,
        x: &DeviceBuffer,
        rows: &[u32],
        scales: &[f32],
        cols: usize,
    ) -> Result<()> {
        let xs = f32s(x, 0, need(rows.len(), cols, "scatter")?, "scatter x")?;
        let len = acc.len();
        let a = f32s_mut(acc, 0, len, "scatter acc")?;
        kernels::scatter_add_rows(self.simd, a, &xs, rows, scales, cols)
    }

    fn scatter_add_rows_host(&self, acc: &mut DeviceBuffer, parts: &[HostRows<'_>], cols: usize) -> Result<()> {
        let len = acc.len();
        let a = f32s_mut(acc, 0, len, "scatter acc")?;
        kernels::scatter_add_parts(&self.pool, self.simd, a, parts, cols)
    }

    fn causal_conv1d(
        &self,
        x: &DeviceBuffer,
        w: &DeviceBuffer,
        state: &mut DeviceBuffer,
        out: &mut DeviceBuffer,
        desc: &ConvDesc,
    ) -> Result<()> {
        let len = need(desc.n_tokens, desc.channels, "conv")?;
        let taps = need(desc.channels, desc.kernel, "conv filter")?;
        let xs = f32s(x, 0, len, "conv x")?;
        let wb = range(bytes(w, "conv w")?, 0, taps, w.dtype().size(), "conv w")?;
        let mut wf = vec![0f32; taps];
        kernels::decode_row(self.simd, wb, w.dtype(), &mut wf)?;
        let hist = need(desc.kernel.saturating_sub(1), desc.channels, "conv state")?;
        let st = f32s_mut(state, 0, hist, "conv state")?;
        let o = f32s_mut(out, 0, len, "conv out")?;
        kernels::causal_conv1d(&self.pool, &xs, &wf, st, o, desc)
    }

    fn gated_delta_rule(
        &self,
        inputs: &DeltaRuleInputs<'_>,
        state: &mut DeviceBuffer,
        out: &mut DeviceBuffer,
        desc: &DeltaRuleDesc,
    ) -> Result<()> {
        fn all<'a>(b: &'a DeviceBuffer, what: &'static str) -> Result<std::borrow::Cow<'a, [f32]>> {
            f32s(b, 0, b.len(), what)
        }
        let qkv = all(inputs.qkv, "delta rule qkv")?;
        let beta = all(inputs.beta_logits, "delta rule beta")?;
        let decay = all(inputs.decay_in, "delta rule decay")?;
        let a_log = all(inputs.a_log, "delta rule a_log")?;
        let dt_bias = all(inputs.dt_bias, "delta rule dt_bias")?;
        let len = state.len();
        let st = f32s_mut(state, 0, len, "delta rule state")?;
        let len = out.len();
        let o = f32s_mut(out, 0, len, "delta rule out")?;
        kernels::gated_delta_rule(
            &self.pool, &qkv, &beta, &decay, &a_log, &dt_bias, st, o, desc,
        )
    }
}

fn range_mut_bytes(b: &mut [u8], offset: usize, len: usize, es: usize) -> Option<&mut [u8]> {
    let start = offset.checked_mul(es)?;
    let end = offset.checked_add(len)?.checked_mul(es)?;
    b.get_mut(start..end)
}

/// `desc` in units of `dtype`'s blocks (unchanged for the plain types); offsets and length
/// must be whole blocks.
fn block_units(dtype: DType, desc: &CopyDesc) -> Result<CopyDesc> {
    let be = dtype.block_elems();
    if be == 1 {
        return Ok(*desc);
    }
    if [desc.src_offset, desc.dst_offset, desc.len].iter().any(|v| v % be != 0) {
        return Err(BackendError::Shape(format!(
            "{dtype} is copied in whole blocks of {be}: {} values from {} to {}",
            desc.len, desc.src_offset, desc.dst_offset
        )));
    }
    Ok(CopyDesc { src_offset: desc.src_offset / be, dst_offset: desc.dst_offset / be, len: desc.len / be })
}
