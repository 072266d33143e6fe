//! Attention in f32 by blocks of keys with the softmax carried from block to block (flash
//! attention), on AVX2 ([`crate::kernels::x86::flash`]).
//!
//! Split by (token, KV head) pair, each pair widened its head's keys and values for its own
//! query heads alone and scored them through the general product: 35 GFLOP/s a thread for 512
//! tokens over a 4,096-token cache, most of a long prompt's prefill. Here a task takes a few
//! tokens and one KV head, all [`TASK_ROWS`] of their query rows, and meets the head's keys
//! and values block by block while the block is in L1. When several tasks read a head, they
//! read an f32 copy made once per call ([`Widened`]); a decode step's one task a head reads
//! the cache itself, widening in registers. Keys with transposed copies scored faster (six
//! rows by sixteen keys, one chain per score: 50–53 GFLOP/s a thread against 36–41 here), but
//! the copy cost a decode step's few rows more than their arithmetic, and the two routes must
//! give the same numbers.
//!
//! Blocks start at whole multiples of [`KEYS`] positions and a row skips the blocks it sees
//! nothing of, and every score and sum is the same chain of operations from either source, so
//! each row's numbers are the same in any task: whatever the chunking of the prompt, the batch
//! or the thread count.

use super::{Inputs, Out};
use crate::kernels::shape_err;
use crate::kernels::x86::flash::{key_scores, pv, softmax_row, KEYS};
use crate::kernels::x86::{code, F32};
use crate::kernels::SimdLevel;
use ft_backend::{AttentionDesc, DType, Result};
use rayon::prelude::*;
use rayon::ThreadPool;
use std::ops::Range;

/// Query rows (tokens × the KV head's query heads) a task aims at: a block of keys and
/// values is read by this many rows (eight query heads: three tokens).
const TASK_ROWS: usize = 24;
/// Below this many score multiply-adds the calling thread does the work alone.
const PARALLEL_MIN: usize = 1 << 16;

/// Whether `d` runs here: AVX2 (or AVX-512) in use, caches of plain floats, key and value
/// heads of whole 8-value vectors.
pub(super) fn eligible(level: SimdLevel, k: DType, v: DType, d: &AttentionDesc) -> bool {
    let plain = |t: DType| matches!(t, DType::F32 | DType::F16 | DType::BF16);
    plain(k)
        && plain(v)
        && d.head_dim > 0
        && d.head_dim.is_multiple_of(8)
        && d.v_head_dim > 0
        && d.v_head_dim.is_multiple_of(8)
        && matches!(level.effective(), SimdLevel::Avx2 | SimdLevel::Avx512)
}

/// A task's rows and buffers, reused by the tasks one worker runs.
struct Scratch {
    /// Query rows, `hd` values each.
    q: Vec<f32>,
    /// A block's scores, then its weights, [`KEYS`] per row.
    s: Vec<f32>,
    /// Unnormalised weighted values, `vhd` per row.
    o: Vec<f32>,
    /// Per row: running maximum, running sum, the positions it sees, whether it sees any
    /// key of the current block.
    m: Vec<f32>,
    l: Vec<f32>,
    seen: Vec<(usize, usize)>,
    active: Vec<bool>,
}

impl Scratch {
    /// Room for `rows` query rows (one more where odd) of `hd`-value keys and `vhd`-value
    /// values.
    fn new(rows: usize, hd: usize, vhd: usize) -> Self {
        let rows = rows.next_multiple_of(2);
        Scratch {
            q: vec![0.0; rows * hd],
            s: vec![0.0; rows * KEYS],
            o: vec![0.0; rows * vhd],
            m: vec![0.0; rows],
            l: vec![0.0; rows],
            seen: vec![(0, 0); rows],
            active: vec![false; rows],
        }
    }
}

/// Most bytes of one call's [`Widened`] copies (a million positions of one KV head of 128,
/// twice that cache in f16); a call needing more is split by pairs.
const WIDE_MAX: usize = 1 << 30;

/// Whether a call of `d` fits [`WIDE_MAX`].
pub(super) fn fits(d: &AttentionDesc) -> bool {
    Widened::bytes(d, d.kv_len.div_ceil(KEYS) + 1) <= WIDE_MAX
}

/// [`super::attention`] by blocks; the caller checked [`eligible`] and [`fits`].
pub(super) fn attention(pool: &ThreadPool, inp: &Inputs<'_>, out: &mut [f32]) -> Result<()> {
    let d = inp.d;
    let (nkv, hd, vhd) = (d.n_kv_heads, d.head_dim, d.v_head_dim);
    let group = d.n_heads / nkv;
    let per = (TASK_ROWS / group).max(1);
    let tiles = d.n_tokens.div_ceil(per);
    let rows = inp.cache_rows();
    let o = Out(out.as_mut_ptr());
    let scratch = || Scratch::new(per * group, hd, vhd);
    let work = d.n_tokens * d.n_heads * d.kv_len * hd;
    let parallel = pool.current_num_threads() > 1 && tiles * nkv > 1 && work >= PARALLEL_MIN;
    // The first token's window starts earliest; the last token sees the cache's end.
    let (start, end) = (inp.seen(0).0, inp.seen(d.n_tokens - 1).1);
    // Several tasks to a KV head read one f32 copy; one task to a head (a decode step) reads
    // the cache where it lies, widening in registers: the same values either way. A copy for
    // one task cost a decode step over 512 cached tokens more than its arithmetic.
    let wide = if tiles > 1 { Some(Widened::new(parallel.then_some(pool), inp, &rows, start / KEYS..end.div_ceil(KEYS).max(start / KEYS + 1))?) } else { None };
    let src = match &wide {
        Some(w) => Source::Wide(w),
        None => Source::Cache(&rows),
    };
    // The last tokens see the most keys: their tasks go first.
    let run = |s: &mut Scratch, i: usize| {
        let (tile, h) = (tiles - 1 - i / nkv, i % nkv);
        task(inp, src, s, tile * per..((tile + 1) * per).min(d.n_tokens), h, o)
    };
    if parallel {
        pool.install(|| (0..tiles * nkv).into_par_iter().with_max_len(1).try_for_each_init(scratch, run))
    } else {
        let mut s = scratch();
        (0..tiles * nkv).try_for_each(|i| run(&mut s, i))
    }
}

/// Where a task reads keys and values.
#[derive(Clone, Copy)]
enum Source<'a> {
    /// The call's f32 copy.
    Wide(&'a Widened),
    /// The cache itself; the cache row of every position.
    Cache(&'a [usize]),
}

/// `out.len()` values of cache `c` from value `at` on, in f32: a row at a time, so the
/// checks and the dispatch of `decode_row` per call would cost as much as the widening.
fn widen(c: &super::KvCache<'_>, at: usize, out: &mut [f32]) -> Result<()> {
    let (a, n) = (c.dtype.row_bytes(at), c.dtype.row_bytes(out.len()));
    match c.bytes.get(a..a + n) {
        // SAFETY: `eligible` confirmed AVX2 and a plain-float cache; `src` holds the values.
        Some(src) => unsafe { crate::kernels::x86::avx2::decode(crate::kernels::x86::code(c.dtype), src.as_ptr(), out.as_mut_ptr(), out.len()) },
        None => return Err(shape_err(format!("a {} cache of {} bytes ends before value {}", c.dtype, c.bytes.len(), at + out.len()))),
    }
    Ok(())
}

/// One [`Widened::new`] task's share: every KV head's keys, then every head's values.
type HeadParts<'a> = (Vec<&'a mut [f32]>, Vec<&'a mut [f32]>);

/// Positions per task of [`Widened::new`].
const WIDEN: usize = 8 * KEYS;

/// The keys and values of positions from block `first` on in f32, head by head (each KV
/// head's rows one after another), zeros past the cache's end. Made once per call on the
/// pool, reading the cache's rows whole, front to back: widened per head and block in every
/// task, the rows (1 KiB apart for four heads of 128 f16 values) came in as misses, 36 % of a
/// 512-token call's time on one thread. Head by head, a task's block of keys or values is one
/// run of 16 KiB the prefetchers follow; with the rows as the cache lays them out (every head's,
/// 2 KiB apart in f32) the blocks' loads waited on memory for most of the scores' and weighted
/// values' time (512 tokens over 4,096 on one thread, the two builds at once on the two
/// cores, six runs: 35–39 → 45–52 GFLOP/s).
struct Widened {
    /// Per KV head, `rows × head_dim` keys.
    k: Vec<Vec<f32>>,
    /// Per KV head, `rows × v_head_dim` values.
    v: Vec<Vec<f32>>,
    first: usize,
}

impl Widened {
    /// Bytes of the copies of `blocks` blocks of a call of `d`.
    fn bytes(d: &AttentionDesc, blocks: usize) -> usize {
        4 * blocks * KEYS * d.n_kv_heads * (d.head_dim + d.v_head_dim)
    }

    /// Widens `blocks` of the positions whose cache rows are `rows`, on `pool` where given.
    fn new(pool: Option<&ThreadPool>, inp: &Inputs<'_>, rows: &[usize], blocks: Range<usize>) -> Result<Self> {
        let d = inp.d;
        let (nkv, hd, vhd) = (d.n_kv_heads, d.head_dim, d.v_head_dim);
        let (ks, vs) = (nkv * hd, nkv * vhd);
        let n = blocks.len() * KEYS;
        let (mut k, mut v) = (vec![vec![0f32; n * hd]; nkv], vec![vec![0f32; n * vhd]; nkv]);
        let p0 = blocks.start * KEYS;
        // Per task of WIDEN positions, every head's part of them.
        let mut parts: Vec<HeadParts<'_>> = (0..n.div_ceil(WIDEN)).map(|_| (Vec::with_capacity(nkv), Vec::with_capacity(nkv))).collect();
        for (kh, vh) in k.iter_mut().zip(v.iter_mut()) {
            for (part, (kc, vc)) in parts.iter_mut().zip(kh.chunks_mut(WIDEN * hd).zip(vh.chunks_mut(WIDEN * vhd))) {
                part.0.push(kc);
                part.1.push(vc);
            }
        }
        let part = |i: usize, (kc, vc): &mut HeadParts<'_>| -> Result<()> {
            let here = rows.get(p0 + i * WIDEN..).unwrap_or(&[]);
            for (p, &r) in here.iter().take(WIDEN).enumerate() {
                for (h, (kh, vh)) in kc.iter_mut().zip(vc.iter_mut()).enumerate() {
                    // Positions past the copy's last block are not widened (the cache may hold more).
                    let (Some(kr), Some(vr)) = (kh.get_mut(p * hd..(p + 1) * hd), vh.get_mut(p * vhd..(p + 1) * vhd)) else { return Ok(()) };
                    widen(&inp.k, r * ks + h * hd, kr)?;
                    widen(&inp.v, r * vs + h * vhd, vr)?;
                }
            }
            Ok(())
        };
        match pool {
            Some(pool) => pool.install(|| parts.par_iter_mut().enumerate().try_for_each(|(i, p)| part(i, p)))?,
            None => parts.iter_mut().enumerate().try_for_each(|(i, p)| part(i, p))?,
        }
        drop(parts);
        Ok(Widened { k, v, first: blocks.start })
    }
}

/// Tokens `toks` with KV head `h`'s query heads, into their rows of `o`.
fn task(inp: &Inputs<'_>, src: Source<'_>, s: &mut Scratch, toks: Range<usize>, h: usize, o: Out) -> Result<()> {
    let d = inp.d;
    let (hd, vhd) = (d.head_dim, d.v_head_dim);
    let group = d.n_heads / d.n_kv_heads;
    let real = toks.len() * group;
    for r in 0..real {
        let (t, g) = (toks.start + r / group, r % group);
        let head = h * group + g;
        s.set_row(r, &inp.q[(t * d.n_heads + head) * hd..][..hd], inp.seen(t), inp.sinks.map(|x| x[head]));
    }
    run_rows(inp, src, s, real, h);
    let os = d.n_heads * vhd;
    for r in 0..real {
        let (t, g) = (toks.start + r / group, r % group);
        let (_, l, sums) = s.row(r);
        let inv = if l > 0.0 { 1.0 / l } else { 0.0 };
        // SAFETY: token `t`'s query head `h·group + g` row lies inside `out` (checked by the
        // caller) and belongs to this task alone.
        let dst = unsafe { std::slice::from_raw_parts_mut(o.0.add(t * os + (h * group + g) * vhd), vhd) };
        dst.iter_mut().zip(sums).for_each(|(d, x)| *d = x * inv);
    }
    Ok(())
}

impl Scratch {
    /// Row `r`: its query, the positions `seen` of it, and a fresh state (a sink joins the
    /// softmax as a score of its own with no value: the sum starts at exp(sink − sink)).
    fn set_row(&mut self, r: usize, q: &[f32], seen: (usize, usize), sink: Option<f32>) {
        let hd = q.len();
        self.q[r * hd..][..hd].copy_from_slice(q);
        self.seen[r] = seen;
        self.m[r] = sink.unwrap_or(f32::NEG_INFINITY);
        self.l[r] = if sink.is_some() { 1.0 } else { 0.0 };
    }

    /// Row `r`'s maximum, sum and unnormalised weighted values after [`run_rows`].
    fn row(&self, r: usize) -> (f32, f32, &[f32]) {
        let vhd = self.o.len() / self.m.len();
        (self.m[r], self.l[r], &self.o[r * vhd..][..vhd])
    }
}

/// Rows `0..real` of `s` (set by [`Scratch::set_row`]) against KV head `h`'s blocks they
/// see, from `src`, each carrying its maximum, sum and weighted values from block to block.
fn run_rows(inp: &Inputs<'_>, src: Source<'_>, s: &mut Scratch, real: usize, h: usize) {
    let d = inp.d;
    let (hd, vhd) = (d.head_dim, d.v_head_dim);
    // A last odd row is repeated (computed, not used): the kernels take rows in twos.
    let padded = real.next_multiple_of(2);
    if padded > real {
        s.q.copy_within((real - 1) * hd..real * hd, real * hd);
        (s.seen[real], s.m[real], s.l[real]) = (s.seen[real - 1], s.m[real - 1], s.l[real - 1]);
    }
    s.o[..padded * vhd].fill(0.0);
    let first = s.seen[..padded].iter().map(|p| p.0).min().unwrap_or(0);
    let end = s.seen[..padded].iter().map(|p| p.1).max().unwrap_or(0);
    let blocks = if end > first { first / KEYS..(end - 1) / KEYS + 1 } else { 0..0 };
    let (ks, vs) = (d.n_kv_heads * hd, d.n_kv_heads * vhd);
    let (kc, vc) = (inp.k, inp.v);
    for b in blocks {
        let p0 = b * KEYS;
        let n = (d.kv_len - p0).min(KEYS);
        // The block's keys and values as runs of consecutive rows: (first key, rows, key and
        // value of the first, code, bytes between rows).
        let mut runs: [(usize, usize, *const u8, *const u8); KEYS] = [(0, 0, std::ptr::null(), std::ptr::null()); KEYS];
        let mut nr = 0;
        let (code_k, code_v, kstep, vstep) = match src {
            Source::Wide(w) => {
                let at = p0 - w.first * KEYS;
                runs[0] = (0, n, w.k[h][at * hd..].as_ptr() as *const u8, w.v[h][at * vhd..].as_ptr() as *const u8);
                // The next block's keys and values are asked for while this one is scored:
                // 512 tokens over 4,096 on one thread, ~12 % faster than the prefetchers alone
                // in three of four paired runs.
                for (c, width) in [(&w.k[h], hd), (&w.v[h], vhd)] {
                    for line in c.get((at + KEYS) * width..(at + 2 * KEYS) * width).unwrap_or(&[]).chunks(16) {
                        // SAFETY: a prefetch of an address inside the copy; it reads nothing
                        // architecturally.
                        unsafe { crate::kernels::x86::prefetch(line.as_ptr() as *const u8) };
                    }
                }
                nr = 1;
                (F32, F32, 4 * hd, 4 * vhd)
            }
            Source::Cache(rows) => {
                let mut j = 0;
                while j < n {
                    let r = rows[p0 + j];
                    let mut len = 1;
                    while j + len < n && rows[p0 + j + len] == r + len {
                        len += 1;
                    }
                    runs[nr] = (j, len, kc.bytes[kc.dtype.row_bytes(r * ks + h * hd)..].as_ptr(), vc.bytes[vc.dtype.row_bytes(r * vs + h * vhd)..].as_ptr());
                    nr += 1;
                    j += len;
                }
                (code(kc.dtype), code(vc.dtype), kc.dtype.row_bytes(ks), vc.dtype.row_bytes(vs))
            }
        };
        for &(j, len, kp, _) in &runs[..nr] {
            // SAFETY: `eligible` confirmed AVX2/FMA/F16C and heads of whole vectors; the run's
            // keys lie in the copy or the cache (checked by the caller), `s` holds `padded`
            // rows of `KEYS` scores.
            unsafe { key_scores(code_k, s.q.as_ptr(), padded, hd, kp, kstep, len, s.s.as_mut_ptr().add(j), KEYS) };
        }
        for r in 0..padded {
            let (a, z) = s.seen[r];
            let (lo, hi) = (a.saturating_sub(p0).min(n), z.saturating_sub(p0).min(n));
            // SAFETY: as above; row `r`'s scores are `KEYS` values at `r·KEYS`.
            let step = unsafe { softmax_row(s.s.as_mut_ptr().add(r * KEYS), d.scale, lo, hi, &mut s.m[r], &mut s.l[r]) };
            s.active[r] = step.is_some();
            if let Some(alpha) = step.filter(|&a| a != 1.0) {
                s.o[r * vhd..][..vhd].iter_mut().for_each(|x| *x *= alpha);
            }
        }
        for &(j, len, _, vp) in &runs[..nr] {
            // SAFETY: as above, for the run's values and `padded` rows of `vhd` sums.
            unsafe { pv(code_v, s.s.as_ptr().add(j), padded, vp, vstep, len, vhd, s.o.as_mut_ptr(), &s.active[..padded]) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{pool, Case, Shape};
    use super::*;

    /// Values are in ±1 and scores reach ±6; every product and sum is f32, in another order
    /// than the pair split's.
    const TOL: f32 = 2e-5;

    #[allow(clippy::too_many_arguments)]
    fn shape(dtype: DType, heads: usize, kv_heads: usize, hd: usize, vhd: usize, kv_len: usize, tokens: usize, window: Option<usize>, sinks: bool, paged: bool) -> Case {
        let s = Shape { dtype, heads, kv_heads, hd, vhd, kv_len, tokens, window, sinks, paged };
        Case::new(s, (kv_len * 31 + tokens) as u64, 16, 2.0, 3.0, 1.0)
    }

    fn avx2() -> bool {
        let d = AttentionDesc { n_tokens: 1, n_heads: 1, n_kv_heads: 1, head_dim: 8, v_head_dim: 8, kv_len: 1, scale: 1.0, window: None };
        let ok = eligible(SimdLevel::Auto, DType::F16, DType::F16, &d);
        if !ok {
            println!("skipped: this CPU has no AVX2, the pair split runs instead");
        }
        ok
    }

    #[test]
    fn blocks_equal_the_pair_split() {
        if !avx2() {
            return;
        }
        let mut worst = 0f32;
        let cases = [
            // Partial blocks and tiles, a prefill continuing a cache, GQA groups of 1 to 8.
            shape(DType::F16, 8, 2, 64, 64, 100, 37, None, false, false),
            shape(DType::BF16, 8, 1, 128, 128, 300, 300, None, true, true),
            shape(DType::F32, 4, 4, 64, 64, 80, 16, Some(20), false, true),
            // Keys wider than values (DeepSeek's 192 / 128), sinks, a window of one.
            shape(DType::F16, 4, 2, 192, 128, 130, 40, None, true, false),
            shape(DType::F16, 2, 1, 64, 64, 70, 33, Some(1), true, true),
            // Heads of 8 and 24 (a last group of 8 columns), one token, three tokens.
            shape(DType::F32, 6, 3, 24, 8, 45, 1, None, false, false),
            shape(DType::F16, 12, 1, 40, 24, 77, 3, None, true, true),
            // A window shorter than a block, far into a long cache.
            shape(DType::F16, 4, 1, 128, 128, 1000, 48, Some(100), false, true),
        ];
        for case in &cases {
            assert!(eligible(SimdLevel::Auto, case.dtype(), case.dtype(), &case.d), "{}: eligible", case.what());
            worst = worst.max(case.against_pairs(attention, "flash blocks", TOL));
        }
        println!("largest difference from the pair split: {worst:e}");
    }

    #[test]
    fn a_window_of_nothing_gives_zeros() {
        if !avx2() {
            return;
        }
        shape(DType::F16, 2, 1, 64, 64, 40, 20, Some(0), true, false).against_pairs(attention, "flash blocks", TOL);
        shape(DType::F16, 2, 1, 64, 64, 40, 20, Some(0), false, true).against_pairs(attention, "flash blocks", TOL);
    }

    /// A prompt cut into chunks (each chunk's tokens against the cache up to its end) gives
    /// every token the bits it gets in one call: prefix reuse and batching must not move a
    /// token's numbers.
    #[test]
    fn chunks_of_a_prompt_give_the_same_bits() {
        if !avx2() {
            return;
        }
        for (window, sinks) in [(None, false), (Some(45), true)] {
            let case = shape(DType::F16, 8, 2, 32, 32, 130, 130, window, sinks, true);
            let whole = case.run(&pool(2), 0..130);
            for cuts in [&[0, 1, 17, 64, 65, 130][..], &[0, 3, 100, 129, 130], &[0, 130]] {
                for w in cuts.windows(2) {
                    let part = case.run(&pool(3), w[0]..w[1]);
                    let at = |t: usize| &whole[t * case.row_len()..][..case.row_len()];
                    for (i, t) in (w[0]..w[1]).enumerate() {
                        let same = part[i * case.row_len()..][..case.row_len()].iter().zip(at(t)).all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(same, "{}: token {t} in chunk {w:?}", case.what());
                    }
                }
            }
        }
    }
}
