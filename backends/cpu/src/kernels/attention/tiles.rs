//! Prefill attention on AMX tiles ([`crate::kernels::x86::amx_attention`]).
//!
//! Split by (token, KV head) pair, every new token re-read its head's whole slice of the
//! cache and multiplied it one query row at a time: a 4,096-token prefill spent more than half
//! its time there, at ~14 GFLOP/s a core (12-layer Qwen3-30B-A3B shape, 2 threads). Here the
//! sequence's cached rows are first copied once per KV head as bf16 hi and lo parts, keys and
//! transposed values in 1 KiB tiles, then one task takes 16 tokens and one KV head, all the query
//! heads sharing it, over the key blocks those tokens see, the softmax carried from block to
//! block. Each task owns its outputs, so the result does not depend on the thread count.

use super::{Inputs, Out};
use crate::kernels::elementwise::decode_row;
use crate::kernels::x86::amx;
use crate::kernels::x86::amx_attention::{finish, run, split_keys, split_values, Task, KEYS};
use crate::kernels::SimdLevel;
use ft_backend::{AttentionDesc, DType, Result};
use rayon::prelude::*;
use rayon::ThreadPool;

/// Fewest new tokens that take the tiles: one whole query tile.
pub(super) const MIN_TOKENS: usize = 16;
/// Queries per tile.
const TILE: usize = 16;
/// Query tiles per task: the tiles of a task meet each block of the cache copies together,
/// so it streams from memory once for 64 tokens rather than for each 16.
const GROUP: usize = 4;

/// Whether `d` runs on the tiles: AMX and AVX-512 BF16 are there (AMX granted), at least
/// [`MIN_TOKENS`] new tokens, key heads of whole 32-value steps and value heads of whole
/// 64-value groups (every supported family's: 64, 128, 512), caches of plain floats.
pub(super) fn eligible(level: SimdLevel, k: DType, v: DType, d: &AttentionDesc) -> bool {
    let plain = |t: DType| matches!(t, DType::F32 | DType::F16 | DType::BF16);
    d.n_tokens >= MIN_TOKENS
        && d.head_dim > 0
        && d.head_dim.is_multiple_of(32)
        && d.v_head_dim > 0
        && d.v_head_dim.is_multiple_of(64)
        && i32::try_from(d.kv_len).is_ok()
        && plain(k)
        && plain(v)
        && level.effective() == SimdLevel::Avx512
        && crate::kernels::x86::dpbf16::available()
        && amx::available()
}

/// `x` as two bf16 parts, `x ≈ hi + lo`, each rounded to nearest (an f16 or bf16 value
/// exactly), as bits.
fn halves(x: f32) -> (u16, u16) {
    let hi = half::bf16::from_f32(x);
    (hi.to_bits(), half::bf16::from_f32(x - hi.to_f32()).to_bits())
}

/// Keys per task of the copy (a multiple of 32: whole value tiles).
const COPY_KEYS: usize = 1024;

/// Part of one KV head's copies, keys and transposed values in the tile layouts of
/// [`Task`], hi and lo parts: keys `first ..` (a multiple of 32) on.
struct CopyPart<'a> {
    first: usize,
    kh: &'a mut [u16],
    kl: &'a mut [u16],
    vh: &'a mut [u16],
    vl: &'a mut [u16],
}

/// Copies KV head `h`'s keys `c.first ..` (as far as `c` reaches, within `rows`; `rows[j]`
/// is the cache row of position `j`) into `c`, 32 keys at a time. The tiles are 1 KiB each,
/// so a tile row is one cache line and a block's tiles lie together.
fn copy_head(inp: &Inputs<'_>, rows: &[usize], h: usize, c: CopyPart<'_>) -> Result<()> {
    let d = inp.d;
    let (hd, vhd) = (d.head_dim, d.v_head_dim);
    let (ks, vs) = (d.n_kv_heads * hd, d.n_kv_heads * vhd);
    let (mut kb, mut vb) = (vec![0f32; 32 * hd], vec![0f32; 32 * vhd]);
    let rows = &rows[c.first.min(rows.len())..];
    let parts = c.kh.chunks_exact_mut(32 * hd).zip(c.kl.chunks_exact_mut(32 * hd));
    let parts = parts.zip(c.vh.chunks_exact_mut(32 * vhd).zip(c.vl.chunks_exact_mut(32 * vhd)));
    for (j, ((kh, kl), (vh, vl))) in parts.enumerate() {
        let group = rows.get(32 * j..).unwrap_or(&[]);
        if group.is_empty() {
            break;
        }
        // Past the sequence's end the rows stay zero (the copies were zeroed).
        for (i, &r) in group.iter().take(32).enumerate() {
            decode_row(inp.level, &inp.k.bytes[inp.k.dtype.row_bytes(r * ks + h * hd)..], inp.k.dtype, &mut kb[i * hd..][..hd])?;
            decode_row(inp.level, &inp.v.bytes[inp.v.dtype.row_bytes(r * vs + h * vhd)..], inp.v.dtype, &mut vb[i * vhd..][..vhd])?;
        }
        if group.len() < 32 {
            kb[group.len() * hd..].fill(0.0);
            vb[group.len() * vhd..].fill(0.0);
        }
        // SAFETY: `eligible` confirmed AVX-512 BF16 and the head dims; the slices hold
        // 32 rows each.
        unsafe {
            split_keys(&kb, hd, kh, kl);
            split_values(&vb, vhd, vh, vl);
        }
    }
    Ok(())
}

/// `n` zeroed values from a cache line on: a tile row of 64 bytes across two lines costs two
/// loads (with the buffers where the allocator put them, a call of the kernel bench's part 4
/// took 352 ms instead of 259 on one thread).
struct Lines<T> {
    buf: Vec<T>,
    at: usize,
    n: usize,
}

impl<T: Copy + Default> Lines<T> {
    fn new(n: usize) -> Self {
        let buf = vec![T::default(); n + 64 / std::mem::size_of::<T>()];
        let at = buf.as_ptr().align_offset(64);
        Self { buf, at, n }
    }

    fn get(&self) -> &[T] {
        &self.buf[self.at..][..self.n]
    }

    fn get_mut(&mut self) -> &mut [T] {
        &mut self.buf[self.at..][..self.n]
    }
}

/// One query tile's buffers: query pairs (hi, lo), unnormalised values, maxima and sums.
struct TileState {
    qh: Lines<u32>,
    ql: Lines<u32>,
    ot: Lines<f32>,
    m: Vec<f32>,
    l: Vec<f32>,
}

/// A task's buffers, reused by the tasks one worker runs: its tiles' and the block scratch
/// they share (scores, weight pairs).
struct Scratch {
    tiles: Vec<TileState>,
    st: Lines<f32>,
    pt: Lines<u32>,
}

/// [`super::attention`] on the tiles; the caller checked [`eligible`].
pub(super) fn attention(pool: &ThreadPool, inp: &Inputs<'_>, out: &mut [f32]) -> Result<()> {
    let d = inp.d;
    let (nkv, hd, vhd) = (d.n_kv_heads, d.head_dim, d.v_head_dim);
    let kp = d.kv_len.div_ceil(KEYS) * KEYS;
    let mut rows = Vec::with_capacity(d.kv_len);
    for (_, r, n) in inp.runs_in(0, d.kv_len) {
        rows.extend(r..r + n);
    }
    let (per_k, per_v) = (kp * hd, vhd * kp);
    let (mut kh, mut kl) = (Lines::<u16>::new(nkv * per_k), Lines::<u16>::new(nkv * per_k));
    let (mut vh, mut vl) = (Lines::<u16>::new(nkv * per_v), Lines::<u16>::new(nkv * per_v));
    let (ck, cv) = (COPY_KEYS * hd, COPY_KEYS * vhd);
    pool.install(|| {
        kh.get_mut()
            .par_chunks_mut(per_k)
            .zip(kl.get_mut().par_chunks_mut(per_k))
            .zip(vh.get_mut().par_chunks_mut(per_v).zip(vl.get_mut().par_chunks_mut(per_v)))
            .enumerate()
            .try_for_each(|(h, ((kh, kl), (vh, vl)))| {
                kh.par_chunks_mut(ck)
                    .zip(kl.par_chunks_mut(ck))
                    .zip(vh.par_chunks_mut(cv).zip(vl.par_chunks_mut(cv)))
                    .enumerate()
                    .try_for_each(|(i, ((kh, kl), (vh, vl)))| copy_head(inp, &rows, h, CopyPart { first: i * COPY_KEYS, kh, kl, vh, vl }))
            })
    })?;
    let group = d.n_heads / nkv;
    let steps = hd / 32;
    let tiles = d.n_tokens.div_ceil(TILE);
    let o = Out(out.as_mut_ptr());
    let (kh, kl, vh, vl) = (kh.get(), kl.get(), vh.get(), vl.get());
    let scratch = || Scratch {
        tiles: (0..GROUP)
            .map(|_| TileState {
                qh: Lines::new(group * steps * TILE * TILE),
                ql: Lines::new(group * steps * TILE * TILE),
                ot: Lines::new(group * vhd * TILE),
                m: vec![0.0; group * TILE],
                l: vec![0.0; group * TILE],
            })
            .collect(),
        st: Lines::new(KEYS * TILE),
        pt: Lines::new(4 * TILE * TILE),
    };
    let groups = tiles.div_ceil(GROUP);
    pool.install(|| {
        // The last tiles see the most keys: they go first.
        (0..groups * nkv).into_par_iter().with_max_len(1).for_each_init(scratch, |s, i| {
            let (first, h) = ((groups - 1 - i / nkv) * GROUP, i % nkv);
            let heads = HeadCopies { kh: &kh[h * per_k..][..per_k], kl: &kl[h * per_k..][..per_k], vh: &vh[h * per_v..][..per_v], vl: &vl[h * per_v..][..per_v], kp };
            run_tiles(inp, &heads, s, first..(first + GROUP).min(tiles), h, o);
        })
    });
    Ok(())
}

/// One KV head's copies, read-only.
struct HeadCopies<'a> {
    kh: &'a [u16],
    kl: &'a [u16],
    vh: &'a [u16],
    vl: &'a [u16],
    kp: usize,
}

/// Query tiles `tiles` (tokens `16·tau ..` each) of KV head `h`'s query heads into `o`.
fn run_tiles(inp: &Inputs<'_>, c: &HeadCopies<'_>, s: &mut Scratch, tiles: std::ops::Range<usize>, h: usize, o: Out) {
    let d = inp.d;
    let group = d.n_heads / d.n_kv_heads;
    let (st, pt) = (s.st.get_mut().as_mut_ptr(), s.pt.get_mut().as_mut_ptr());
    let tasks: Vec<Task> = tiles.clone().zip(&mut s.tiles).map(|(tau, ts)| task(inp, c, ts, tau, h, st, pt)).collect();
    let os = d.n_heads * d.v_head_dim;
    // SAFETY: `eligible` confirmed AMX, AVX-512 (BF16) and the head dims; the copies hold
    // `kp ≥ b1·KEYS` keys of this head and the scratch the sizes `Task` states; the output
    // rows of each tile's tokens, heads h·group..(h + 1)·group, lie inside `out` (checked by
    // the caller) and belong to this task alone.
    unsafe {
        run(&tasks);
        for (tau, t) in tiles.zip(&tasks) {
            let t0 = tau * TILE;
            let valid = (d.n_tokens - t0).min(TILE);
            for g in 0..group {
                let sink = inp.sinks.map(|x| x[h * group + g]);
                finish(t, g, sink, o.0.add((t0 * d.n_heads + h * group + g) * d.v_head_dim), os, valid);
            }
        }
    }
}

/// Query tile `tau` of KV head `h`: its query pairs and fresh state in `ts`, its positions
/// and key blocks, as a [`Task`] sharing the block scratch `st`, `pt`.
fn task(inp: &Inputs<'_>, c: &HeadCopies<'_>, ts: &mut TileState, tau: usize, h: usize, st: *mut f32, pt: *mut u32) -> Task {
    let d = inp.d;
    let (hd, vhd) = (d.head_dim, d.v_head_dim);
    let group = d.n_heads / d.n_kv_heads;
    let steps = hd / 32;
    let t0 = tau * TILE;
    let valid = (d.n_tokens - t0).min(TILE);
    // Lanes past the last token repeat its positions (their results are not written).
    let (mut pos, mut start) = ([0i32; TILE], [0i32; TILE]);
    for n in 0..TILE {
        let (a, b) = inp.seen(t0 + n.min(valid - 1));
        (start[n], pos[n]) = (a as i32, b as i32 - 1);
    }
    let (qh, ql) = (ts.qh.get_mut(), ts.ql.get_mut());
    if valid < TILE {
        qh.fill(0);
        ql.fill(0);
    }
    for g in 0..group {
        for n in 0..valid {
            let q = &inp.q[((t0 + n) * d.n_heads + h * group + g) * hd..][..hd];
            for (p, pair) in q.chunks_exact(2).enumerate() {
                let ((a0, b0), (a1, b1)) = (halves(pair[0]), halves(pair[1]));
                let at = ((g * steps + p / TILE) * TILE + p % TILE) * TILE + n;
                qh[at] = a0 as u32 | (a1 as u32) << 16;
                ql[at] = b0 as u32 | (b1 as u32) << 16;
            }
        }
    }
    ts.ot.get_mut().fill(0.0);
    ts.m.fill(f32::NEG_INFINITY);
    ts.l.fill(0.0);
    // Lane 0 sees the earliest key, the last lane the latest; a window may start past its
    // end (nothing seen: one block, all masked).
    let b0 = (start[0].max(0) as usize / KEYS).min(c.kp / KEYS - 1);
    let b1 = (pos[TILE - 1].max(0) as usize / KEYS + 1).max(b0 + 1);
    Task {
        qh: ts.qh.get().as_ptr(),
        ql: ts.ql.get().as_ptr(),
        kh: c.kh.as_ptr(),
        kl: c.kl.as_ptr(),
        vh: c.vh.as_ptr(),
        vl: c.vl.as_ptr(),
        hd,
        vhd,
        heads: group,
        pos,
        start,
        b0,
        b1,
        scale: d.scale,
        ot: ts.ot.get_mut().as_mut_ptr(),
        m: ts.m.as_mut_ptr(),
        l: ts.l.as_mut_ptr(),
        st,
        pt,
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{Case, Shape};
    use super::*;

    /// One shape on the tiles against the pair split (f32 sums of f32 products, pages in
    /// order): equal within `TOL`, and the same bits on one thread and on three.
    #[allow(clippy::too_many_arguments)]
    fn check(dtype: DType, heads: usize, kv_heads: usize, hd: usize, vhd: usize, kv_len: usize, tokens: usize, window: Option<usize>, sinks: bool, paged: bool) -> f32 {
        let shape = Shape { dtype, heads, kv_heads, hd, vhd, kv_len, tokens, window, sinks, paged };
        let case = Case::new(shape, (kv_len * 31 + tokens) as u64, 16, 2.0, 3.0, 1.0);
        assert!(eligible(SimdLevel::Auto, dtype, dtype, &case.d), "{}: eligible", case.what());
        case.against_pairs(attention, "AMX tiles", TOL)
    }

    /// Values are in ±1 and scores reach ±6: the hi + lo parts keep queries, weights and f32
    /// caches within 2⁻¹⁷ (f16 and bf16 caches exactly), so a result differs from the f32 one
    /// by a few 1e-6.
    const TOL: f32 = 2e-5;

    fn amx() -> bool {
        let d = AttentionDesc { n_tokens: 16, n_heads: 1, n_kv_heads: 1, head_dim: 32, v_head_dim: 64, kv_len: 16, scale: 1.0, window: None };
        let ok = eligible(SimdLevel::Auto, DType::F16, DType::F16, &d);
        if !ok {
            println!("skipped: no AMX tiles on this CPU (or FT_NO_AMX): the pair split runs instead");
        }
        ok
    }

    #[test]
    fn tiles_equal_the_pair_split() {
        if !amx() {
            return;
        }
        let mut worst = 0f32;
        // Partial tiles and blocks, a prefill continuing a cache, GQA groups of 1 to 8.
        worst = worst.max(check(DType::F16, 8, 2, 64, 64, 100, 37, None, false, false));
        worst = worst.max(check(DType::BF16, 8, 1, 128, 128, 300, 300, None, true, true));
        worst = worst.max(check(DType::F32, 4, 4, 64, 64, 80, 16, Some(20), false, true));
        // Keys wider than values (DeepSeek's 192 / 128), sinks, a window of one.
        worst = worst.max(check(DType::F16, 4, 2, 192, 128, 130, 40, None, true, false));
        worst = worst.max(check(DType::F16, 2, 1, 64, 64, 70, 33, Some(1), true, true));
        // Keys of 96 (three steps) over values of 64, an f32 cache.
        worst = worst.max(check(DType::F32, 8, 2, 96, 64, 64, 64, None, false, false));
        // A window shorter than a block, far into a long cache.
        worst = worst.max(check(DType::F16, 4, 1, 128, 128, 1000, 48, Some(100), false, true));
        println!("largest difference from the pair split: {worst:e}");
    }

    #[test]
    fn a_window_of_nothing_gives_zeros() {
        if !amx() {
            return;
        }
        check(DType::F16, 2, 1, 64, 64, 40, 20, Some(0), true, false);
    }

    #[test]
    fn the_choice_of_the_tiles() {
        let d = |n_tokens, head_dim, v_head_dim| AttentionDesc { n_tokens, n_heads: 8, n_kv_heads: 2, head_dim, v_head_dim, kv_len: 4096, scale: 1.0, window: None };
        let on = amx::available() && SimdLevel::Auto.effective() == SimdLevel::Avx512;
        assert_eq!(eligible(SimdLevel::Auto, DType::F16, DType::F16, &d(16, 128, 128)), on);
        assert!(!eligible(SimdLevel::Auto, DType::F16, DType::F16, &d(15, 128, 128)));
        assert!(!eligible(SimdLevel::Auto, DType::F16, DType::F16, &d(64, 48, 64)));
        assert!(!eligible(SimdLevel::Auto, DType::F16, DType::F16, &d(64, 64, 96)));
        assert!(!eligible(SimdLevel::Auto, DType::Q8_0, DType::F16, &d(64, 128, 128)));
        assert!(!eligible(SimdLevel::Avx2, DType::F16, DType::F16, &d(64, 128, 128)));
    }
}
