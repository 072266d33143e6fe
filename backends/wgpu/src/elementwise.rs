//! Host side of the element-wise, softmax, top-k and row gather/scatter kernels.

use crate::memory::{check_range, expect_dtype, need, u32_of, wbuf};
use crate::pipelines::{dtype_code, Bind, Kernel};
use crate::WgpuBackend;
use ft_backend::{BackendError, BinaryOp, DType, DeviceBuffer, Result, TopK};

/// Invocations per workgroup of the 1-D kernels (elementwise.wgsl, rows.wgsl).
const WG: u64 = 256;

impl WgpuBackend {
    pub(crate) fn run_binary(
        &self,
        op: BinaryOp,
        a: &mut DeviceBuffer,
        b: &DeviceBuffer,
        n: usize,
    ) -> Result<()> {
        expect_dtype(a, DType::F32, "binary a")?;
        expect_dtype(b, DType::F32, "binary b")?;
        let av = self.window(a, 0, n, "binary a")?;
        let bv = self.window(b, 0, n, "binary b")?;
        let (code, f0, f1) = match op {
            BinaryOp::Add => (0, 0.0, 0.0),
            BinaryOp::Mul => (1, 0.0, 0.0),
            BinaryOp::MulSigmoid => (2, 0.0, 0.0),
            BinaryOp::SwiGlu => (3, 0.0, 0.0),
            BinaryOp::ClampedSwiGlu { alpha, limit } => (4, alpha, limit),
            BinaryOp::LimitedSwiGlu { limit } => (5, 0.0, limit),
        };
        let params = [
            u32_of(n, "binary n")?,
            code,
            f32::to_bits(f0),
            f32::to_bits(f1),
            0,
        ];
        self.dispatch(
            Kernel::Binary,
            &[],
            &params,
            &[(1, av.bind), (2, bv.bind)],
            (n as u64).div_ceil(WG),
        )
    }

    pub(crate) fn run_scale(&self, x: &mut DeviceBuffer, s: f32, n: usize) -> Result<()> {
        expect_dtype(x, DType::F32, "scale x")?;
        let xv = self.window(x, 0, n, "scale x")?;
        let params = [u32_of(n, "scale n")?, 0, s.to_bits(), 0, 0];
        self.dispatch(
            Kernel::Scale,
            &[],
            &params,
            &[(1, xv.bind)],
            (n as u64).div_ceil(WG),
        )
    }

    pub(crate) fn run_softmax(&self, x: &mut DeviceBuffer, rows: usize, cols: usize) -> Result<()> {
        expect_dtype(x, DType::F32, "softmax x")?;
        let total = need(rows, cols, "softmax")?;
        let xv = self.window(x, 0, total, "softmax x")?;
        if total == 0 {
            return Ok(());
        }
        let params = [
            u32_of(rows, "softmax rows")?,
            0,
            0,
            0,
            u32_of(cols, "softmax cols")?,
        ];
        self.dispatch(Kernel::Softmax, &[], &params, &[(1, xv.bind)], rows as u64)
    }

    /// Router logits are a few values per token and the result is host data anyway, so the
    /// rows are read back and ranked on the host (exact, with the reference's tie order).
    pub(crate) fn run_top_k(
        &self,
        x: &DeviceBuffer,
        rows: usize,
        cols: usize,
        k: usize,
    ) -> Result<TopK> {
        expect_dtype(x, DType::F32, "top_k x")?;
        if k > cols {
            return Err(BackendError::Shape(format!(
                "top_k: k = {k} > {cols} columns"
            )));
        }
        let total = need(rows, cols, "top_k")?;
        check_range(x, 0, total, "top_k x")?;
        let mut bytes = vec![0u8; total * 4];
        self.read_bytes(wbuf(x, "top_k x")?, 0, &mut bytes)?;
        let vals: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let mut out = TopK {
            indices: Vec::with_capacity(rows * k),
            values: Vec::with_capacity(rows * k),
        };
        let mut idx: Vec<u32> = Vec::with_capacity(cols);
        for row in vals.chunks_exact(cols.max(1)).take(rows) {
            idx.clear();
            idx.extend(0..cols as u32);
            idx.sort_by(|a, b| row[*b as usize].total_cmp(&row[*a as usize]).then(a.cmp(b)));
            for &i in &idx[..k] {
                out.indices.push(i);
                out.values.push(row[i as usize]);
            }
        }
        Ok(out)
    }

    pub(crate) fn run_gather(
        &self,
        src: &DeviceBuffer,
        ids: &[u32],
        cols: usize,
        out: &mut DeviceBuffer,
    ) -> Result<()> {
        expect_dtype(out, DType::F32, "gather out")?;
        let total = need(ids.len(), cols, "gather")?;
        let os = self.window(out, 0, total, "gather out")?;
        if cols == 0 && !ids.is_empty() {
            return Ok(());
        }
        let rows = src.len() / cols.max(1);
        if let Some(bad) = ids.iter().find(|&&i| i as usize >= rows) {
            return Err(BackendError::Shape(format!(
                "gather: id {bad} outside a table of {rows} rows"
            )));
        }
        if total == 0 {
            return Ok(());
        }
        u32_of(total, "gather")?;
        let tdt = [("TDT", dtype_code(src.dtype()))];
        let whole = self.window(src, 0, src.len(), "gather table");
        match whole {
            Ok(t) => {
                u32_of(src.len(), "gather table")?;
                let idb = self.temp_buffer(bytemuck::cast_slice(ids));
                let params = [total as u32, cols as u32, 0, t.base, os.base, 0];
                self.dispatch(
                    Kernel::Gather,
                    &tdt,
                    &params,
                    &[(1, t.bind), (2, Bind::all(&idb)), (3, os.bind)],
                    (total as u64).div_ceil(WG),
                )
            }
            // A table larger than one binding (a big embedding): one window per row.
            Err(_) => {
                let zero = self.temp_buffer(&[0; 4]);
                for (i, &id) in ids.iter().enumerate() {
                    let t = self.window(src, id as usize * cols, cols, "gather table")?;
                    let o = self.window(out, i * cols, cols, "gather out")?;
                    let params = [cols as u32, cols as u32, 0, t.base, o.base, 0];
                    self.dispatch(
                        Kernel::Gather,
                        &tdt,
                        &params,
                        &[(1, t.bind), (2, Bind::all(&zero)), (3, o.bind)],
                        (cols as u64).div_ceil(WG),
                    )?;
                }
                Ok(())
            }
        }
    }

    pub(crate) fn run_scatter_add(
        &self,
        acc: &mut DeviceBuffer,
        x: &DeviceBuffer,
        rows: &[u32],
        scales: &[f32],
        cols: usize,
    ) -> Result<()> {
        expect_dtype(acc, DType::F32, "scatter acc")?;
        expect_dtype(x, DType::F32, "scatter x")?;
        if rows.len() != scales.len() {
            return Err(BackendError::Shape(format!(
                "scatter: {} rows but {} scales",
                rows.len(),
                scales.len()
            )));
        }
        let xv = self.window(x, 0, need(rows.len(), cols, "scatter x")?, "scatter x")?;
        let acc_rows = acc.len() / cols.max(1);
        if let Some(bad) = rows.iter().find(|&&r| r as usize >= acc_rows) {
            return Err(BackendError::Shape(format!(
                "scatter: row {bad} outside an accumulator of {acc_rows} rows"
            )));
        }
        let av = self.window(acc, 0, need(acc_rows, cols, "scatter acc")?, "scatter acc")?;
        if rows.is_empty() || cols == 0 {
            return Ok(());
        }
        u32_of(acc.len(), "scatter acc")?;
        let rb = self.temp_buffer(bytemuck::cast_slice(rows));
        let sb = self.temp_buffer(bytemuck::cast_slice(scales));
        let params = [
            0,
            u32_of(cols, "scatter cols")?,
            u32_of(rows.len(), "scatter rows")?,
            0,
            0,
            0,
        ];
        self.dispatch(
            Kernel::ScatterAdd,
            &[],
            &params,
            &[
                (4, av.bind),
                (5, xv.bind),
                (6, Bind::all(&rb)),
                (7, Bind::all(&sb)),
            ],
            (cols as u64).div_ceil(WG),
        )
    }
}
