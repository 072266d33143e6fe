//! Row gather (embeddings, expert inputs) and the scaled scatter-add of expert outputs.

use super::{by_dtype, BLOCK};
use crate::device::{Arg, CudaBackend};
use crate::memory::{f32_at, need, ptr_at, u32_of};
use ft_backend::{BackendError, DeviceBuffer, Result, StreamId};

/// Most rows one launch covers (the grid's y limit).
const MAX_GRID_Y: usize = 65_535;

pub(super) fn words(v: impl IntoIterator<Item = u32>) -> Vec<u8> {
    v.into_iter().flat_map(u32::to_le_bytes).collect()
}

/// Column blocks for rows of `cols` values.
fn col_blocks(cols: usize) -> Result<u32> {
    u32_of(cols.div_ceil(BLOCK as usize).clamp(1, 64), "columns")
}

/// See [`ft_backend::Backend::gather_rows`].
pub(crate) fn gather_rows(b: &CudaBackend, src: &DeviceBuffer, ids: &[u32], cols: usize, out: &mut DeviceBuffer) -> Result<()> {
    let op = f32_at(out, 0, need(ids.len(), cols, "gather")?, "gather out")?;
    let sp = ptr_at(src, 0, src.len(), "gather table")?;
    let table_rows = src.len().checked_div(cols).unwrap_or(usize::MAX);
    if let Some(bad) = ids.iter().find(|&&i| i as usize >= table_rows) {
        return Err(BackendError::Shape(format!("gather of row {bad} from a table of {table_rows} rows")));
    }
    if ids.is_empty() || cols == 0 {
        return Ok(());
    }
    let kernel = by_dtype(src.dtype(), ["gather_rows_f32", "gather_rows_f16", "gather_rows_bf16"]);
    let cols32 = u32_of(cols, "gather cols")?;
    let stream = b.stream(StreamId::COMPUTE)?;
    let mut arena = b.arena()?;
    let ptrs = arena.put(&b.ctx, &stream, &[&words(ids.iter().copied())], 0)?;
    for start in (0..ids.len()).step_by(MAX_GRID_Y) {
        let count = (ids.len() - start).min(MAX_GRID_Y);
        let args = [
            Arg::Ptr(sp),
            Arg::Ptr(ptrs[0] + 4 * start as u64),
            Arg::U32(cols32),
            Arg::Ptr(op + (start * cols * 4) as u64),
        ];
        b.launch(kernel, (col_blocks(cols)?, count as u32, 1), BLOCK, 0, &args)?;
    }
    Ok(())
}

/// See [`ft_backend::Backend::scatter_add_rows`]. Entries are grouped by destination row on
/// the host (keeping their order), so each output element is summed by one thread in the
/// reference's order, without atomics.
pub(crate) fn scatter_add_rows(
    b: &CudaBackend,
    acc: &mut DeviceBuffer,
    x: &DeviceBuffer,
    rows: &[u32],
    scales: &[f32],
    cols: usize,
) -> Result<()> {
    if rows.len() != scales.len() {
        return Err(BackendError::Shape(format!("{} rows but {} scales", rows.len(), scales.len())));
    }
    let xp = f32_at(x, 0, need(rows.len(), cols, "scatter")?, "scatter x")?;
    let acc_len = acc.len();
    let ap = f32_at(acc, 0, acc_len, "scatter acc")?;
    let acc_rows = acc_len.checked_div(cols).unwrap_or(usize::MAX);
    if let Some(bad) = rows.iter().find(|&&r| r as usize >= acc_rows) {
        return Err(BackendError::Shape(format!("scatter into row {bad} of {acc_rows}")));
    }
    if rows.is_empty() || cols == 0 {
        return Ok(());
    }
    let (dest, start, order) = group_by_row(rows);
    let scale_bytes: Vec<u8> = scales.iter().flat_map(|s| s.to_le_bytes()).collect();
    let cols32 = u32_of(cols, "scatter cols")?;
    let stream = b.stream(StreamId::COMPUTE)?;
    let mut arena = b.arena()?;
    let p = arena.put(&b.ctx, &stream, &[&words(dest.iter().copied()), &words(start), &words(order), &scale_bytes], 0)?;
    for g0 in (0..dest.len()).step_by(MAX_GRID_Y) {
        let groups = (dest.len() - g0).min(MAX_GRID_Y);
        let args = [
            Arg::Ptr(ap),
            Arg::Ptr(xp),
            Arg::Ptr(p[0] + 4 * g0 as u64),
            Arg::Ptr(p[1] + 4 * g0 as u64),
            Arg::Ptr(p[2]),
            Arg::Ptr(p[3]),
            Arg::U32(cols32),
        ];
        b.launch("scatter_add_rows_f32", (col_blocks(cols)?, groups as u32, 1), BLOCK, 0, &args)?;
    }
    Ok(())
}

/// Entries grouped by destination row, keeping their order within a row: group `g` writes
/// row `dest[g]` from entries `order[start[g] .. start[g + 1]]`.
pub(crate) fn group_by_row(rows: &[u32]) -> (Vec<u32>, Vec<u32>, Vec<u32>) {
    let mut order: Vec<u32> = (0..rows.len() as u32).collect();
    order.sort_by_key(|&i| rows[i as usize]); // stable: equal rows keep their order
    let mut dest = Vec::new();
    let mut start = Vec::new();
    for (pos, &i) in order.iter().enumerate() {
        let r = rows[i as usize];
        if dest.last() != Some(&r) {
            dest.push(r);
            start.push(pos as u32);
        }
    }
    start.push(order.len() as u32);
    (dest, start, order)
}

#[cfg(test)]
mod tests {
    #[test]
    fn groups_keep_entry_order_per_row() {
        let (dest, start, order) = super::group_by_row(&[3, 0, 9, 3, 5, 3, 1]);
        assert_eq!(dest, [0, 1, 3, 5, 9]);
        assert_eq!(start, [0, 1, 2, 5, 6, 7]);
        assert_eq!(order, [1, 6, 0, 3, 5, 4, 2]);
        assert_eq!(super::group_by_row(&[]), (vec![], vec![0], vec![]));
    }
}
