//! Attention in f32 by blocks of keys with the softmax carried from block to block (flash
//! attention), on AVX2 ([`crate::kernels::x86::flash`]).
//!
//! Split by (token, KV head) pair, each pair widened its head's keys and values for its own
//! query heads alone and scored them through the general product: 35 GFLOP/s a thread for 512
//! tokens over a 4,096-token cache, most of a long prompt's prefill. Here a task takes a few
//! tokens and one KV head, all [`TASK_ROWS`] of their query rows, and meets the head's keys
//! and values block by block, each block in f32 (the keys transposed) and in L1 while the rows
//! score it and sum its values. The blocks are widened once per call ([`Widened`]) when
//! several tasks read a head, else by the one task that does.
//!
//! Blocks start at whole multiples of [`KEYS`] positions and a row skips the blocks it sees
//! nothing of, so each row's numbers are the same in any task: whatever the chunking of the
//! prompt, the batch or the thread count.

use super::{Inputs, Out};
use crate::kernels::elementwise::decode_row;
use crate::kernels::x86::flash::{pv, scores, softmax_row, transpose, KEYS};
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

/// Most bytes of one call's [`Widened`] copies (a million positions of one KV head of 128:
/// four times one layer's f16 cache); a call needing more is split by pairs.
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
    let wide = Widened::new(parallel.then_some(pool), inp, &rows, start / KEYS..end.div_ceil(KEYS).max(start / KEYS + 1))?;
    // The last tokens see the most keys: their tasks go first.
    let run = |s: &mut Scratch, i: usize| {
        let (tile, h) = (tiles - 1 - i / nkv, i % nkv);
        task(inp, &wide, s, tile * per..((tile + 1) * per).min(d.n_tokens), h, o)
    };
    if parallel {
        pool.install(|| (0..tiles * nkv).into_par_iter().with_max_len(1).try_for_each_init(scratch, run))
    } else {
        let mut s = scratch();
        (0..tiles * nkv).try_for_each(|i| run(&mut s, i))
    }
}

/// Blocks per task of [`Widened::new`].
const WIDEN: usize = 8;

/// The keys and values of blocks `first..` in f32, every KV head's: keys a block and head at a
/// time, transposed for [`scores`] (`[block][head][hd][KEYS]`), values as the cache holds
/// them (`[position][head][vhd]`), zeros past the cache's end. Made once per call, reading
/// the cache's rows whole, front to back: widened per head and block in every task, the
/// rows (1 KiB apart for four heads of 128 f16 values) came in as misses, 36 % of a 512-token
/// call's time on one thread.
struct Widened {
    k: Vec<f32>,
    v: Vec<f32>,
    first: usize,
    nkv: usize,
    hd: usize,
    vhd: usize,
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
        let n = blocks.len();
        let (mut k, mut v) = (vec![0f32; n * KEYS * ks], vec![0f32; n * KEYS * vs]);
        let part = |i: usize, kc: &mut [f32], vc: &mut [f32]| -> Result<()> {
            let p0 = (blocks.start + i * WIDEN) * KEYS;
            let (kk, vv) = (inp.k, inp.v);
            let mut kr = vec![0f32; KEYS * ks];
            for (b, (kt, vb)) in kc.chunks_exact_mut(KEYS * ks).zip(vc.chunks_exact_mut(KEYS * vs)).enumerate() {
                let here = rows.get(p0 + b * KEYS..).unwrap_or(&[]);
                let m = here.len().min(KEYS);
                for (j, &r) in here[..m].iter().enumerate() {
                    decode_row(inp.level, &kk.bytes[kk.dtype.row_bytes(r * ks)..], kk.dtype, &mut kr[j * ks..][..ks])?;
                    decode_row(inp.level, &vv.bytes[vv.dtype.row_bytes(r * vs)..], vv.dtype, &mut vb[j * vs..][..vs])?;
                }
                // Past the cache's end: zeros (masked, but finite).
                kr[m * ks..].fill(0.0);
                for (h, kt) in kt.chunks_exact_mut(hd * KEYS).enumerate() {
                    // SAFETY: `eligible` confirmed AVX2 and keys of whole vectors; `kr` holds
                    // a block of rows of `ks` values, `kt` one head's block.
                    unsafe { transpose(kr[h * hd..].as_ptr(), ks, hd, kt.as_mut_ptr()) };
                }
            }
            Ok(())
        };
        let (kw, vw) = (WIDEN * KEYS * ks, WIDEN * KEYS * vs);
        match pool {
            Some(pool) => pool.install(|| k.par_chunks_mut(kw).zip(v.par_chunks_mut(vw)).enumerate().try_for_each(|(i, (kc, vc))| part(i, kc, vc)))?,
            None => k.chunks_mut(kw).zip(v.chunks_mut(vw)).enumerate().try_for_each(|(i, (kc, vc))| part(i, kc, vc))?,
        }
        Ok(Widened { k, v, first: blocks.start, nkv, hd, vhd })
    }

    /// Head `h`'s transposed keys of block `b`, and its values from the block's first
    /// position on, a position every `nkv·vhd` values.
    fn block(&self, h: usize, b: usize) -> (&[f32], &[f32]) {
        let (hd, vhd, nkv) = (self.hd, self.vhd, self.nkv);
        let i = b - self.first;
        (&self.k[(i * nkv + h) * hd * KEYS..][..hd * KEYS], &self.v[i * KEYS * nkv * vhd + h * vhd..])
    }
}

/// Tokens `toks` with KV head `h`'s query heads, into their rows of `o`.
fn task(inp: &Inputs<'_>, wide: &Widened, s: &mut Scratch, toks: Range<usize>, h: usize, o: Out) -> Result<()> {
    let d = inp.d;
    let (hd, vhd) = (d.head_dim, d.v_head_dim);
    let group = d.n_heads / d.n_kv_heads;
    let real = toks.len() * group;
    for r in 0..real {
        let (t, g) = (toks.start + r / group, r % group);
        let head = h * group + g;
        s.set_row(r, &inp.q[(t * d.n_heads + head) * hd..][..hd], inp.seen(t), inp.sinks.map(|x| x[head]));
    }
    run_rows(inp, wide, s, real, h);
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
/// see (all inside `wide`), each carrying its maximum, sum and weighted values from block to
/// block.
fn run_rows(inp: &Inputs<'_>, wide: &Widened, s: &mut Scratch, real: usize, h: usize) {
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
    for b in blocks {
        let p0 = b * KEYS;
        let (kt, vb) = wide.block(h, b);
        // SAFETY: `eligible` confirmed AVX2/FMA/F16C and heads of whole vectors; the buffers
        // hold `padded` rows (an even count) and the block.
        unsafe { scores(s.q.as_ptr(), padded, kt.as_ptr(), hd, s.s.as_mut_ptr()) };
        for r in 0..padded {
            let (a, z) = s.seen[r];
            let (lo, hi) = (a.saturating_sub(p0).min(KEYS), z.saturating_sub(p0).min(KEYS));
            // SAFETY: as above; row `r`'s scores are `KEYS` values at `r·KEYS`.
            let step = unsafe { softmax_row(s.s.as_mut_ptr().add(r * KEYS), d.scale, lo, hi, &mut s.m[r], &mut s.l[r]) };
            s.active[r] = step.is_some();
            if let Some(alpha) = step.filter(|&a| a != 1.0) {
                s.o[r * vhd..][..vhd].iter_mut().for_each(|x| *x *= alpha);
            }
        }
        // SAFETY: as above; `vb` holds the block's `KEYS` positions of every head.
        unsafe { pv(s.s.as_ptr(), padded, vb.as_ptr(), d.n_kv_heads * vhd, vhd, s.o.as_mut_ptr(), &s.active[..padded]) };
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
            worst = worst.max(case.against_pairs(attention, TOL));
        }
        println!("largest difference from the pair split: {worst:e}");
    }

    #[test]
    fn a_window_of_nothing_gives_zeros() {
        if !avx2() {
            return;
        }
        shape(DType::F16, 2, 1, 64, 64, 40, 20, Some(0), true, false).against_pairs(attention, TOL);
        shape(DType::F16, 2, 1, 64, 64, 40, 20, Some(0), false, true).against_pairs(attention, TOL);
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
