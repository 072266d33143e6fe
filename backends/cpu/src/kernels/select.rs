//! Row selection: top-k, gathering table rows and scattering weighted rows back.

use super::elementwise::{axpy_row, decode_row};
use super::{need, shape_err, SimdLevel};
use ft_backend::{DType, Result, TopK};
use std::cmp::Ordering;

/// Per row of `x[rows, cols]`, the `k` largest values, best first; ties go to the lower
/// column, and NaN orders as `f32::total_cmp` does (like the reference).
pub fn top_k(x: &[f32], rows: usize, cols: usize, k: usize) -> Result<TopK> {
    if k > cols {
        return Err(shape_err(format!("top-{k} of {cols} columns")));
    }
    if x.len() < need(rows, cols, "top_k input")? {
        return Err(shape_err(format!(
            "top_k over {rows}×{cols} but only {} values",
            x.len()
        )));
    }
    let mut out = TopK {
        indices: Vec::with_capacity(rows * k),
        values: Vec::with_capacity(rows * k),
    };
    if k == 0 {
        return Ok(out);
    }
    let mut best: Vec<u32> = Vec::with_capacity(cols);
    for row in x.chunks_exact(cols).take(rows) {
        // Larger value first, then lower index: a strict total order, so the result is unique.
        let better = |a: &u32, b: &u32| -> Ordering {
            row[*b as usize].total_cmp(&row[*a as usize]).then(a.cmp(b))
        };
        best.clear();
        if k * 8 <= cols {
            // Router-sized k: keep a sorted list of k and insert the rare newcomer.
            for c in 0..cols as u32 {
                if best.len() == k && better(&c, &best[k - 1]) != Ordering::Less {
                    continue;
                }
                let at = best.partition_point(|b| better(b, &c) == Ordering::Less);
                if best.len() == k {
                    best.pop();
                }
                best.insert(at, c);
            }
        } else {
            best.extend(0..cols as u32);
            best.select_nth_unstable_by(k - 1, better);
            best.truncate(k);
            best.sort_unstable_by(better);
        }
        out.values.extend(best.iter().map(|&i| row[i as usize]));
        out.indices.extend_from_slice(&best);
    }
    Ok(out)
}

/// `out[i, :] = table[ids[i], :]` as f32, for a table of `cols`-wide rows of `dtype` in
/// `table` (any alignment); `out` holds at least `ids.len() × cols` values.
pub fn gather_rows(
    level: SimdLevel,
    table: &[u8],
    dtype: DType,
    ids: &[u32],
    cols: usize,
    out: &mut [f32],
) -> Result<()> {
    if cols == 0 || ids.is_empty() {
        return Ok(());
    }
    let row_bytes = need(cols, dtype.size(), "table row")?;
    let table_rows = table.len() / row_bytes;
    if out.len() < need(ids.len(), cols, "gather output")? {
        return Err(shape_err(format!(
            "gather of {} rows × {cols} into {} values",
            ids.len(),
            out.len()
        )));
    }
    if let Some(bad) = ids.iter().find(|&&i| i as usize >= table_rows) {
        return Err(shape_err(format!(
            "row id {bad} out of a {table_rows}-row table"
        )));
    }
    for (&id, o) in ids.iter().zip(out.chunks_exact_mut(cols)) {
        decode_row(
            level,
            &table[id as usize * row_bytes..][..row_bytes],
            dtype,
            o,
        )?;
    }
    Ok(())
}

/// `acc[rows[i], :] += scales[i] · x[i, :]` over rows of `cols` values, in order (repeated
/// rows accumulate).
pub fn scatter_add_rows(
    level: SimdLevel,
    acc: &mut [f32],
    x: &[f32],
    rows: &[u32],
    scales: &[f32],
    cols: usize,
) -> Result<()> {
    if rows.len() != scales.len() {
        return Err(shape_err(format!(
            "{} rows but {} scales",
            rows.len(),
            scales.len()
        )));
    }
    if cols == 0 || rows.is_empty() {
        return Ok(());
    }
    if x.len() < need(rows.len(), cols, "scatter input")? {
        return Err(shape_err(format!(
            "scatter of {} rows × {cols} from {} values",
            rows.len(),
            x.len()
        )));
    }
    let acc_rows = acc.len() / cols;
    if let Some(bad) = rows.iter().find(|&&r| r as usize >= acc_rows) {
        return Err(shape_err(format!(
            "row {bad} out of a {acc_rows}-row accumulator"
        )));
    }
    for ((&r, &s), xr) in rows.iter().zip(scales).zip(x.chunks_exact(cols)) {
        axpy_row(
            level,
            s,
            bytemuck::cast_slice(xr),
            DType::F32,
            &mut acc[r as usize * cols..][..cols],
        )?;
    }
    Ok(())
}
