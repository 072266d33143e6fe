//! Host side of the block-quantized matmul (`shaders/matmul_quant.wgsl`): the byte window of
//! the weight rows, the block type code and the launch.
//!
//! A quantized buffer's elements are values, stored as whole blocks (`DType::block_elems`
//! values in `DType::size` bytes); a matrix of `m` rows of `k` values takes
//! `m · dtype.row_bytes(k)` bytes and `MatmulDesc::w_offset` (in values) must fall on a block
//! boundary, as on the CPU backend.

use crate::memory::{expect_dtype, need, u32_of, wbuf, Window};
use crate::pipelines::{Bind, Kernel};
use crate::WgpuBackend;
use ft_backend::{BackendError, DType, DeviceBuffer, MatmulDesc, Result};

/// Tokens per workgroup (`TB` in matmul_quant.wgsl).
const TOKENS: usize = 4;

/// The code of a block type in matmul_quant.wgsl's `Q_*` constants (`None` for plain types).
pub(crate) fn quant_code(dtype: DType) -> Option<u32> {
    Some(match dtype {
        DType::F8E4M3 => 0,
        DType::Nvfp4 => 1,
        DType::Mxfp4 => 2,
        DType::Q8_0 => 3,
        DType::Q4_0 => 4,
        DType::Q4K => 5,
        DType::Q5K => 6,
        DType::Q6K => 7,
        DType::F32 | DType::F16 | DType::BF16 => return None,
    })
}

impl WgpuBackend {
    /// Binds bytes `start..start + len` of `buf` (checked against its size): the whole buffer
    /// when the adapter allows, else an aligned window; `base` is the byte where the range
    /// starts inside the binding.
    pub(crate) fn byte_window<'a>(
        &self,
        buf: &'a DeviceBuffer,
        start: usize,
        len: usize,
        what: &str,
    ) -> Result<Window<'a>> {
        let size = buf.size_bytes();
        if start.checked_add(len).is_none_or(|end| end > size) {
            return Err(BackendError::Shape(format!(
                "{what}: bytes {start}..+{len} of a buffer of {size}"
            )));
        }
        let b = wbuf(buf, what)?;
        if b.size() <= self.max_binding {
            return Ok(Window {
                bind: Bind::all(b),
                base: u32_of(start, what)?,
            });
        }
        let align = u64::from(self.limits.min_storage_buffer_offset_alignment.max(4));
        let offset = start as u64 / align * align;
        // The buffer's size is a whole number of words, so the rounded end stays inside it.
        let end = ((start + len) as u64)
            .next_multiple_of(4)
            .max(offset + 4)
            .min(b.size());
        let bytes = end - offset;
        if bytes > self.max_binding {
            return Err(BackendError::Shape(format!(
                "{what}: {bytes} bytes in one binding exceed the adapter's limit of {}",
                self.max_binding
            )));
        }
        Ok(Window {
            bind: Bind {
                buffer: b,
                offset,
                size: bytes,
            },
            base: u32_of((start as u64 - offset) as usize, what)?,
        })
    }

    /// `matmul` with weights of a block-quantized dtype.
    pub(crate) fn run_matmul_quant(
        &self,
        x: &DeviceBuffer,
        w: &DeviceBuffer,
        bias: Option<&DeviceBuffer>,
        out: &mut DeviceBuffer,
        d: &MatmulDesc,
    ) -> Result<()> {
        let dt = w.dtype();
        let code = quant_code(dt)
            .ok_or_else(|| BackendError::Invalid(format!("{dt} is not a block type")))?;
        expect_dtype(x, DType::F32, "matmul x")?;
        expect_dtype(out, DType::F32, "matmul out")?;
        let be = dt.block_elems();
        if !d.w_offset.is_multiple_of(be) {
            return Err(BackendError::Shape(format!(
                "{dt} weight offset {} is not on a block boundary",
                d.w_offset
            )));
        }
        let row_bytes = dt.row_bytes(d.k);
        let start = need(d.w_offset / be, dt.size(), "matmul w")?;
        let xs = self.window(x, d.x_offset, need(d.n, d.k, "matmul x")?, "matmul x")?;
        let ws = self.byte_window(w, start, need(d.m, row_bytes, "matmul w")?, "matmul w")?;
        let (bs, os) = self.matmul_bias_out(bias, out, d)?;
        if d.n == 0 || d.m == 0 {
            return Ok(());
        }
        // Byte addresses of the last row must fit the shader's u32 arithmetic.
        u32_of(
            ws.base as usize + need(d.m, row_bytes, "matmul w")?,
            "matmul w bytes",
        )?;
        let blocks = d.n.div_ceil(TOKENS);
        let groups = need(blocks, d.m, "matmul grid")?;
        u32_of(groups, "matmul grid")?;
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
            u32_of(row_bytes, "matmul row bytes")?,
        ];
        // Without a bias the shader still declares the binding; any buffer satisfies it.
        let bias_bind = bs.map_or(xs.bind, |b| b.bind);
        self.dispatch(
            Kernel::MatmulQuant,
            &[("QDT", code)],
            &params,
            &[(1, xs.bind), (2, ws.bind), (3, bias_bind), (4, os.bind)],
            groups as u64,
        )
    }
}
