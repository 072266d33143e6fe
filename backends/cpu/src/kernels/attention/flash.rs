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
use crate::kernels::x86::flash::{pv, scores, softmax_row, transpose, KEYS, ROWS};
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

/// A task's buffers, reused by the tasks one worker runs.
struct Scratch {
    /// Query rows, `hd` values each.
    q: Vec<f32>,
    /// A block's scores, then its weights, [`KEYS`] per row.
    s: Vec<f32>,
    /// Unnormalised weighted values, `vhd` per row.
    o: Vec<f32>,
    /// The block's keys (transposed, `hd × KEYS`) and values (`KEYS × vhd`) in f32, and its
    /// keys as read (`KEYS × hd`).
    kb: Vec<f32>,
    vb: Vec<f32>,
    kr: Vec<f32>,
    /// Per row: running maximum, running sum, the positions it sees, whether it sees any
    /// key of the current block.
    m: Vec<f32>,
    l: Vec<f32>,
    seen: Vec<(usize, usize)>,
    active: Vec<bool>,
}

impl Scratch {
    fn new(rows: usize, hd: usize, vhd: usize) -> Self {
        Scratch {
            q: vec![0.0; rows * hd],
            s: vec![0.0; rows * KEYS],
            o: vec![0.0; rows * vhd],
            kb: vec![0.0; KEYS * hd],
            vb: vec![0.0; KEYS * vhd],
            kr: vec![0.0; KEYS * hd],
            m: vec![0.0; rows],
            l: vec![0.0; rows],
            seen: vec![(0, 0); rows],
            active: vec![false; rows],
        }
    }
}

/// [`super::attention`] by blocks; the caller checked [`eligible`].
pub(super) fn attention(pool: &ThreadPool, inp: &Inputs<'_>, out: &mut [f32]) -> Result<()> {
    let d = inp.d;
    let (nkv, hd, vhd) = (d.n_kv_heads, d.head_dim, d.v_head_dim);
    let group = d.n_heads / nkv;
    let per = (TASK_ROWS / group).max(1);
    let tiles = d.n_tokens.div_ceil(per);
    // Cache row of every position.
    let mut rows = Vec::with_capacity(d.kv_len);
    for (_, r, n) in inp.runs_in(0, d.kv_len) {
        rows.extend(r..r + n);
    }
    let o = Out(out.as_mut_ptr());
    let padded = (per * group).next_multiple_of(ROWS);
    let scratch = || Scratch::new(padded, hd, vhd);
    let work = d.n_tokens * d.n_heads * d.kv_len * hd;
    let parallel = pool.current_num_threads() > 1 && tiles * nkv > 1 && work >= PARALLEL_MIN;
    let wide_bytes = 4 * nkv * (hd + vhd) * (d.kv_len + WIDEN);
    let wide = if tiles > 1 && wide_bytes <= WIDE_MAX { Some(Widened::new(pool, inp, &rows, parallel)?) } else { None };
    // The last tokens see the most keys: their tasks go first.
    let run = |s: &mut Scratch, i: usize| {
        let (tile, h) = (tiles - 1 - i / nkv, i % nkv);
        task(inp, &rows, wide.as_ref(), s, tile * per..((tile + 1) * per).min(d.n_tokens), h, o)
    };
    if parallel {
        pool.install(|| (0..tiles * nkv).into_par_iter().with_max_len(1).try_for_each_init(scratch, run))
    } else {
        let mut s = scratch();
        (0..tiles * nkv).try_for_each(|i| run(&mut s, i))
    }
}

/// Most bytes of one call's [`Widened`] copies: 128k positions of four KV heads of 128.
const WIDE_MAX: usize = 512 << 20;

/// Positions per task of [`Widened::new`] (whole blocks).
const WIDEN: usize = 8 * KEYS;

/// Every KV head's keys (each block transposed, [`transpose`]) and values in f32 from block
/// `first` on, `kp` positions a head (zeros past the cache's end): made once per call when
/// several tasks read a head. Widening each block in every task read the cache's rows, 1 KiB
/// apart for four heads of 128 f16 values, as misses: 36 % of a 512-token call's time on one
/// thread. Past [`WIDE_MAX`] bytes (very long caches) the tasks widen their own blocks again:
/// the same values, so the same bits.
struct Widened {
    k: Vec<f32>,
    v: Vec<f32>,
    first: usize,
    kp: usize,
}

impl Widened {
    fn new(pool: &ThreadPool, inp: &Inputs<'_>, rows: &[usize], parallel: bool) -> Result<Self> {
        let d = inp.d;
        let (nkv, hd, vhd) = (d.n_kv_heads, d.head_dim, d.v_head_dim);
        // The first token's window starts earliest.
        let first = inp.seen(0).0.min(d.kv_len) / KEYS;
        let kp = (d.kv_len - first * KEYS).next_multiple_of(WIDEN);
        let (mut k, mut v) = (vec![0f32; nkv * kp * hd], vec![0f32; nkv * kp * vhd]);
        let (ks, vs) = (nkv * hd, nkv * vhd);
        let part = |i: usize, kc: &mut [f32], vc: &mut [f32]| -> Result<()> {
            let (h, p0) = (i / (kp / WIDEN), first * KEYS + i % (kp / WIDEN) * WIDEN);
            let (kk, vv) = (inp.k, inp.v);
            let mut kr = vec![0f32; WIDEN * hd];
            for (j, &r) in rows.get(p0..).unwrap_or(&[]).iter().take(WIDEN).enumerate() {
                decode_row(inp.level, &kk.bytes[kk.dtype.row_bytes(r * ks + h * hd)..], kk.dtype, &mut kr[j * hd..][..hd])?;
                decode_row(inp.level, &vv.bytes[vv.dtype.row_bytes(r * vs + h * vhd)..], vv.dtype, &mut vc[j * vhd..][..vhd])?;
            }
            for (src, dst) in kr.chunks_exact(KEYS * hd).zip(kc.chunks_exact_mut(KEYS * hd)) {
                // SAFETY: `eligible` confirmed AVX2 and keys of whole vectors; both hold one
                // block.
                unsafe { transpose(src.as_ptr(), hd, dst.as_mut_ptr()) };
            }
            Ok(())
        };
        if parallel {
            pool.install(|| {
                k.par_chunks_mut(WIDEN * hd).zip(v.par_chunks_mut(WIDEN * vhd)).enumerate().try_for_each(|(i, (kc, vc))| part(i, kc, vc))
            })?;
        } else {
            k.chunks_mut(WIDEN * hd).zip(v.chunks_mut(WIDEN * vhd)).enumerate().try_for_each(|(i, (kc, vc))| part(i, kc, vc))?;
        }
        Ok(Widened { k, v, first, kp })
    }

    /// Head `h`'s keys and values of block `b`.
    fn block(&self, h: usize, b: usize, hd: usize, vhd: usize) -> (&[f32], &[f32]) {
        let at = h * self.kp + (b - self.first) * KEYS;
        (&self.k[at * hd..][..KEYS * hd], &self.v[at * vhd..][..KEYS * vhd])
    }
}

/// Tokens `toks` with KV head `h`'s query heads, into their rows of `o`.
fn task(inp: &Inputs<'_>, rows: &[usize], wide: Option<&Widened>, s: &mut Scratch, toks: Range<usize>, h: usize, o: Out) -> Result<()> {
    let d = inp.d;
    let (hd, vhd) = (d.head_dim, d.v_head_dim);
    let group = d.n_heads / d.n_kv_heads;
    let real = toks.len() * group;
    // Rows past the last repeat it (computed, not written): the kernels take rows in sixes.
    let padded = real.next_multiple_of(ROWS);
    for r in 0..padded {
        let x = r.min(real - 1);
        let (t, g) = (toks.start + x / group, x % group);
        s.q[r * hd..][..hd].copy_from_slice(&inp.q[(t * d.n_heads + h * group + g) * hd..][..hd]);
        s.seen[r] = inp.seen(t);
        // A sink joins the softmax as a score of its own with no value: the sum starts at
        // exp(sink − sink).
        let sink = inp.sinks.map(|x| x[h * group + g]);
        s.m[r] = sink.unwrap_or(f32::NEG_INFINITY);
        s.l[r] = if sink.is_some() { 1.0 } else { 0.0 };
    }
    s.o[..padded * vhd].fill(0.0);
    let first = s.seen[..padded].iter().map(|p| p.0).min().unwrap_or(0);
    let end = s.seen[..padded].iter().map(|p| p.1).max().unwrap_or(0);
    let blocks = if end > first { first / KEYS..(end - 1) / KEYS + 1 } else { 0..0 };
    let (ks, vs) = (d.n_kv_heads * hd, d.n_kv_heads * vhd);
    let (kc, vc) = (inp.k, inp.v);
    for b in blocks {
        let p0 = b * KEYS;
        let (kb, vb) = match wide {
            Some(w) => w.block(h, b, hd, vhd),
            None => {
                let n = (d.kv_len - p0).min(KEYS);
                for (i, &r) in rows[p0..p0 + n].iter().enumerate() {
                    decode_row(inp.level, &kc.bytes[kc.dtype.row_bytes(r * ks + h * hd)..], kc.dtype, &mut s.kr[i * hd..][..hd])?;
                    decode_row(inp.level, &vc.bytes[vc.dtype.row_bytes(r * vs + h * vhd)..], vc.dtype, &mut s.vb[i * vhd..][..vhd])?;
                }
                // Keys past the cache's end: masked, but finite.
                s.kr[n * hd..].fill(0.0);
                s.vb[n * vhd..].fill(0.0);
                // SAFETY: `eligible` confirmed AVX2 and keys of whole vectors; `kr` and `kb`
                // hold one block.
                unsafe { transpose(s.kr.as_ptr(), hd, s.kb.as_mut_ptr()) };
                (&s.kb[..], &s.vb[..])
            }
        };
        // SAFETY: `eligible` confirmed AVX2/FMA/F16C and heads of whole vectors; the buffers
        // hold `padded` rows (a multiple of `ROWS`) and one block.
        unsafe { scores(s.q.as_ptr(), padded, kb.as_ptr(), hd, s.s.as_mut_ptr()) };
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
        // SAFETY: as above.
        unsafe { pv(s.s.as_ptr(), padded, vb.as_ptr(), vhd, s.o.as_mut_ptr(), &s.active[..padded]) };
    }
    let os = d.n_heads * vhd;
    for r in 0..real {
        let (t, g) = (toks.start + r / group, r % group);
        let inv = if s.l[r] > 0.0 { 1.0 / s.l[r] } else { 0.0 };
        // SAFETY: token `t`'s query head `h·group + g` row lies inside `out` (checked by the
        // caller) and belongs to this task alone.
        let dst = unsafe { std::slice::from_raw_parts_mut(o.0.add(t * os + (h * group + g) * vhd), vhd) };
        dst.iter_mut().zip(&s.o[r * vhd..][..vhd]).for_each(|(d, x)| *d = x * inv);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::testing::{pool, Case, Shape};
    use super::*;

    /// Values are in ±1 and scores reach ±6; every product and sum is f32, in another order
    /// than the pair split's.
    const TOL: f32 = 2e-5;

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
