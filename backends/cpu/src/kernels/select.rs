//! Row selection: top-k, gathering table rows and scattering weighted rows back.

use super::elementwise::{axpy_row, decode_row};
use super::{need, shape_err, SimdLevel};
use ft_backend::{DType, HostRows, Result, TopK};
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

/// Fewest values a [`scatter_add_parts`] adds before it splits the rows over the pool: a
/// decode step's eight expert rows cost less than handing out the work.
const PARALLEL_VALUES: usize = 1 << 16;

/// [`scatter_add_rows`] of each of `parts` in turn, the rows of `acc` split over `pool` where
/// there is enough work: each row takes its additions in the order of `parts` (and of the rows
/// within one), through the same row kernel, so the bits are those of the parts added one
/// after another. Adding a prefill's expert outputs one expert after another on the calling
/// thread left the pool's other workers idle (a 512-token Q4_K_M prefill, 2 threads: ~1 % of
/// the samples, with as many of the other worker's spent waiting).
pub fn scatter_add_parts(pool: &rayon::ThreadPool, level: SimdLevel, acc: &mut [f32], parts: &[HostRows<'_>], cols: usize) -> Result<()> {
    use rayon::prelude::*;
    let total: usize = parts.iter().map(|p| p.rows.len()).sum();
    if cols == 0 || total == 0 {
        return Ok(());
    }
    HostRows::check(parts, acc.len(), cols)?;
    let acc_rows = acc.len() / cols;
    if total.saturating_mul(cols) < PARALLEL_VALUES || pool.current_num_threads() < 2 {
        for p in parts {
            scatter_add_rows(level, acc, p.x, p.rows, p.scales, cols)?;
        }
        return Ok(());
    }
    // Each destination row's sources (part, row within it), in order: counts, offsets, fill.
    let mut start = vec![0usize; acc_rows + 1];
    for &r in parts.iter().flat_map(|p| p.rows) {
        start[r as usize + 1] += 1;
    }
    for i in 0..acc_rows {
        start[i + 1] += start[i];
    }
    let mut next = start.clone();
    let mut src = vec![(0u32, 0u32); total];
    for (pi, p) in parts.iter().enumerate() {
        for (i, &r) in p.rows.iter().enumerate() {
            src[next[r as usize]] = (pi as u32, i as u32);
            next[r as usize] += 1;
        }
    }
    let per = acc_rows.div_ceil(4 * pool.current_num_threads()).max(1);
    pool.install(|| {
        acc[..acc_rows * cols].par_chunks_mut(per * cols).enumerate().try_for_each(|(c, chunk)| {
            for (j, row) in chunk.chunks_exact_mut(cols).enumerate() {
                let r = c * per + j;
                for &(pi, i) in &src[start[r]..start[r + 1]] {
                    let (p, i) = (&parts[pi as usize], i as usize);
                    axpy_row(level, p.scales[i], bytemuck::cast_slice(&p.x[i * cols..][..cols]), DType::F32, row)?;
                }
            }
            Ok(())
        })
    })
}
