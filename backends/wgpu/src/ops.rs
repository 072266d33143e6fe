//! Host side of the matmul, normalisation, rotary and attention kernels: shape checks,
//! bindings and parameters.

use crate::memory::{check_range, expect_dtype, need, u32_of, wbuf, Window};
use crate::pipelines::{dtype_code, Bind, Kernel};
use crate::WgpuBackend;
use ft_backend::{
    AttentionDesc, BackendError, DType, DeviceBuffer, KvPages, MatmulDesc, Op, Result, RmsNormDesc, RopeDesc,
};

/// Tokens per matmul workgroup (`TB` in matmul.wgsl).
const MATMUL_TOKENS: usize = 4;
/// Largest head sizes attention.wgsl holds in workgroup memory / per-thread accumulators.
const MAX_HEAD_DIM: usize = 1024;
const MAX_V_HEAD_DIM: usize = 64 * 16;

/// Whether the attention shader's workgroup arrays hold these head sizes.
pub(crate) fn attention_fits(d: &AttentionDesc) -> bool {
    d.head_dim <= MAX_HEAD_DIM && d.v_head_dim <= MAX_V_HEAD_DIM
}

impl WgpuBackend {
    /// The f32 bias (`m` values) and output (`n × m`) windows of a matmul, for every
    /// weight type.
    pub(crate) fn matmul_bias_out<'a>(
        &self,
        bias: Option<&'a DeviceBuffer>,
        out: &'a DeviceBuffer,
        d: &MatmulDesc,
    ) -> Result<(Option<Window<'a>>, Window<'a>)> {
        let bs = match bias {
            Some(b) => {
                expect_dtype(b, DType::F32, "matmul bias")?;
                Some(self.window(b, d.bias_offset, d.m, "matmul bias")?)
            }
            None => None,
        };
        let os = self.window(out, d.out_offset, need(d.n, d.m, "matmul out")?, "matmul out")?;
        Ok((bs, os))
    }

    pub(crate) fn run_matmul(
        &self,
        x: &DeviceBuffer,
        w: &DeviceBuffer,
        bias: Option<&DeviceBuffer>,
        out: &mut DeviceBuffer,
        d: &MatmulDesc,
    ) -> Result<()> {
        if w.dtype().is_quantized() {
            return self.run_matmul_quant(x, w, bias, out, d);
        }
        expect_dtype(x, DType::F32, "matmul x")?;
        expect_dtype(out, DType::F32, "matmul out")?;
        let xs = self.window(x, d.x_offset, need(d.n, d.k, "matmul x")?, "matmul x")?;
        let ws = self.window(w, d.w_offset, need(d.m, d.k, "matmul w")?, "matmul w")?;
        let (bs, os) = self.matmul_bias_out(bias, out, d)?;
        if d.n == 0 || d.m == 0 {
            return Ok(());
        }
        let blocks = d.n.div_ceil(MATMUL_TOKENS);
        let groups = need(blocks, d.m, "matmul grid")?;
        let params = [
            u32_of(d.n, "matmul n")?,
            u32_of(d.k, "matmul k")?,
            u32_of(d.m, "matmul m")?,
            xs.base,
            ws.base,
            bs.as_ref().map_or(0, |b| b.base),
            os.base,
            bias.is_some() as u32,
            u32_of(blocks, "matmul blocks")?,
        ];
        // Without a bias the shader still declares the binding; any buffer satisfies it.
        let bias_bind = bs.map_or(xs.bind, |b| b.bind);
        self.dispatch(
            Kernel::Matmul,
            &[("WDT", dtype_code(w.dtype()))],
            &params,
            &[(1, xs.bind), (2, ws.bind), (3, bias_bind), (4, os.bind)],
            groups as u64,
        )
    }

    pub(crate) fn run_rms_norm(
        &self,
        x: &DeviceBuffer,
        w: &DeviceBuffer,
        out: &mut DeviceBuffer,
        d: &RmsNormDesc,
    ) -> Result<()> {
        expect_dtype(x, DType::F32, "rms_norm x")?;
        expect_dtype(out, DType::F32, "rms_norm out")?;
        let total = need(d.rows, d.dim, "rms_norm")?;
        let xs = self.window(x, 0, total, "rms_norm x")?;
        let ws = self.window(w, 0, d.dim, "rms_norm w")?;
        let os = self.window(out, 0, total, "rms_norm out")?;
        if total == 0 {
            return Ok(());
        }
        u32_of(total, "rms_norm")?;
        let params = [
            d.rows as u32,
            d.dim as u32,
            d.eps.to_bits(),
            d.unit_offset as u32,
        ];
        self.dispatch(
            Kernel::RmsNorm,
            &[("WDT", dtype_code(w.dtype()))],
            &params,
            &[(1, xs.bind), (2, ws.bind), (3, os.bind)],
            d.rows as u64,
        )
    }

    pub(crate) fn run_rope(&self, x: &mut DeviceBuffer, d: &RopeDesc) -> Result<()> {
        expect_dtype(x, DType::F32, "rope x")?;
        if !d.rotary_dim.is_multiple_of(2) {
            return Err(BackendError::Shape(format!(
                "rope: rotary_dim {} is odd",
                d.rotary_dim
            )));
        }
        let half = d.rotary_dim / 2;
        if d.positions.len() < d.n_tokens {
            return Err(BackendError::Shape(format!(
                "rope: {} positions for {} tokens",
                d.positions.len(),
                d.n_tokens
            )));
        }
        if d.inv_freq.len() < half {
            return Err(BackendError::Shape(format!(
                "rope: {} frequencies for rotary_dim {}",
                d.inv_freq.len(),
                d.rotary_dim
            )));
        }
        if d.n_tokens == 0 || d.n_heads == 0 || half == 0 {
            return Ok(());
        }
        // The last element touched must lie inside the buffer.
        let last = (d.n_tokens - 1)
            .checked_mul(d.row_stride)
            .and_then(|a| a.checked_add((d.n_heads - 1).checked_mul(d.head_stride)?))
            .and_then(|a| a.checked_add(d.rot_offset)?.checked_add(d.rotary_dim))
            .ok_or_else(|| BackendError::Shape("rope: strides overflow".into()))?;
        check_range(x, 0, last, "rope x")?;
        let total = need(need(d.n_tokens, d.n_heads, "rope")?, half, "rope")?;
        // cos/sin in f64, rounded to f32 and scaled in f32, exactly as the reference does.
        let mut table = Vec::with_capacity(d.n_tokens * half * 2);
        for &pos in &d.positions[..d.n_tokens] {
            for &f in &d.inv_freq[..half] {
                let angle = pos as f64 * f as f64;
                table.push((angle.cos() as f32) * d.scaling);
                table.push((angle.sin() as f32) * d.scaling);
            }
        }
        let cs = self.temp_buffer(bytemuck::cast_slice(&table));
        let params = [
            d.n_tokens as u32,
            d.n_heads as u32,
            u32_of(d.head_stride, "rope head_stride")?,
            u32_of(d.row_stride, "rope row_stride")?,
            u32_of(d.rot_offset, "rope rot_offset")?,
            half as u32,
            d.interleaved as u32,
            u32_of(total, "rope")?,
        ];
        let xs = Bind::all(wbuf(x, "rope x")?);
        u32_of(x.len(), "rope x")?;
        self.dispatch(
            Kernel::Rope,
            &[],
            &params,
            &[(1, xs), (2, Bind::all(&cs))],
            (total as u64).div_ceil(64),
        )
    }

    /// Attention over contiguous caches, or over the pages `pages` names in pools.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn run_attention(
        &self,
        q: &DeviceBuffer,
        k: &DeviceBuffer,
        v: &DeviceBuffer,
        pages: Option<&KvPages<'_>>,
        sinks: Option<&DeviceBuffer>,
        out: &mut DeviceBuffer,
        d: &AttentionDesc,
    ) -> Result<()> {
        expect_dtype(q, DType::F32, "attention q")?;
        expect_dtype(out, DType::F32, "attention out")?;
        if d.n_kv_heads == 0 || !d.n_heads.is_multiple_of(d.n_kv_heads) {
            return Err(BackendError::Shape(format!(
                "attention: {} heads over {} KV heads",
                d.n_heads, d.n_kv_heads
            )));
        }
        if d.kv_len < d.n_tokens {
            return Err(BackendError::Shape(format!(
                "attention: kv_len {} < n_tokens {}",
                d.kv_len, d.n_tokens
            )));
        }
        if !attention_fits(d) {
            return Err(BackendError::Unsupported { backend: "wgpu".into(), op: Op::Attention, dtype: k.dtype() });
        }
        let rows = need(d.n_tokens, d.n_heads, "attention")?;
        let cache_rows = KvPages::cache_rows(pages, d.kv_len)?;
        let page_rows = u32_of(pages.map_or(0, |pg| pg.page_rows), "attention page rows")?;
        let qs = self.window(q, 0, need(rows, d.head_dim, "attention q")?, "attention q")?;
        let ks = self.window(
            k,
            0,
            need(
                need(cache_rows, d.n_kv_heads, "attention k")?,
                d.head_dim,
                "attention k",
            )?,
            "attention k cache",
        )?;
        let vs = self.window(
            v,
            0,
            need(
                need(cache_rows, d.n_kv_heads, "attention v")?,
                d.v_head_dim,
                "attention v",
            )?,
            "attention v cache",
        )?;
        let ss = match sinks {
            Some(s) => {
                expect_dtype(s, DType::F32, "attention sinks")?;
                Some(self.window(s, 0, d.n_heads, "attention sinks")?)
            }
            None => None,
        };
        let os = self.window(
            out,
            0,
            need(rows, d.v_head_dim, "attention out")?,
            "attention out",
        )?;
        if rows == 0 {
            return Ok(());
        }
        let params = [
            d.n_tokens as u32,
            d.n_heads as u32,
            d.n_kv_heads as u32,
            d.head_dim as u32,
            d.v_head_dim as u32,
            u32_of(d.kv_len, "attention kv_len")?,
            d.scale.to_bits(),
            u32_of(d.window.unwrap_or(0), "attention window")?,
            sinks.is_some() as u32,
            ks.base,
            vs.base,
            page_rows,
        ];
        let sink_bind = ss.map_or(qs.bind, |s| s.bind);
        // Without pages the shader still declares the table; any buffer satisfies it.
        let table = pages.map(|pg| self.temp_buffer(bytemuck::cast_slice(pg.table)));
        let table_bind = table.as_ref().map_or(qs.bind, Bind::all);
        self.dispatch(
            Kernel::Attention,
            &[
                ("KDT", dtype_code(k.dtype())),
                ("VDT", dtype_code(v.dtype())),
            ],
            &params,
            &[
                (1, qs.bind),
                (2, ks.bind),
                (3, vs.bind),
                (4, sink_bind),
                (5, os.bind),
                (6, table_bind),
            ],
            rows as u64,
        )
    }
}
