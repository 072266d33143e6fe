//! [`Backend::scatter_add_rows_host`]: the parts added one after another, and its shape errors.

use super::*;
use crate::{BackendError, HostRows};

/// Parts with destination rows repeated across them (and once within one), small enough for
/// one thread and large enough for a pool: the same bits as [`Backend::scatter_add_rows`] of
/// each part in turn; a bad part anywhere is an error that leaves the accumulator as it was.
pub fn scatter_add_rows_host(b: &dyn Backend) {
    if !supported(b, Op::ScatterAddRows, DType::F32) {
        return;
    }
    let mut rng = Rng::new(0x686f_7374);
    let acc_rows = 97usize;
    for cols in [1usize, 33, 2048] {
        let acc_v = rng.vec(acc_rows * cols, 1.0);
        let mut rows: Vec<Vec<u32>> = (0..9u32).map(|p| (0..40).map(|i| (i * 7 + p * 13) % acc_rows as u32).collect()).collect();
        rows[4][5] = rows[4][0];
        let scales: Vec<Vec<f32>> = rows.iter().map(|r| rng.vec(r.len(), 1.0)).collect();
        let xs: Vec<Vec<f32>> = rows.iter().map(|r| rng.vec(r.len() * cols, 2.0)).collect();
        let parts: Vec<HostRows<'_>> = (0..rows.len()).map(|p| HostRows { x: &xs[p], rows: &rows[p], scales: &scales[p] }).collect();
        let mut acc = upload_f32(b, &acc_v);
        b.scatter_add_rows_host(&mut acc, &parts, cols).expect("scatter_add_rows_host");
        let mut one_by_one = upload_f32(b, &acc_v);
        for p in &parts {
            b.scatter_add_rows(&mut one_by_one, &upload_f32(b, p.x), p.rows, p.scales, cols).expect("scatter_add_rows");
        }
        assert_eq!(download(b, &acc), download(b, &one_by_one), "scatter_add_rows_host cols={cols}: not the parts added in turn");

        let short = &xs[2][..xs[2].len() - 1];
        let out_of_range = [acc_rows as u32];
        let bad = [
            ("x too short", HostRows { x: short, ..parts[2] }),
            ("rows vs scales", HostRows { scales: &scales[3][1..], ..parts[3] }),
            ("row out of range", HostRows { x: &xs[1][..cols], rows: &out_of_range, scales: &scales[1][..1] }),
        ];
        for (what, part) in bad {
            let mut with_bad = parts.clone();
            with_bad.push(part);
            let mut acc = upload_f32(b, &acc_v);
            let e = b.scatter_add_rows_host(&mut acc, &with_bad, cols);
            assert!(matches!(e, Err(BackendError::Shape(_))), "scatter_add_rows_host, {what}: {e:?}");
            assert_eq!(download(b, &acc), acc_v, "scatter_add_rows_host, {what}: the accumulator changed");
        }
    }
}
