//! Attention of a few tokens over a long cache, split by positions (flash-decoding).
//!
//! Split by (token, KV head) pair, each task reads its head's slice of every cached row: 256
//! bytes of a 1 KiB row for 4 KV heads of 128 f16 values, so the rows come in as scattered
//! misses the prefetchers do not follow, and one token's four pairs leave each thread the
//! memory parallelism of one core on a strided walk. At 3,072 cached tokens the weighted sum of
//! values alone, waiting on those loads, was an eighth of a decode step (12-layer Q4_K_M, 2
//! threads). Here a task takes a segment of about [`SEGMENT`] positions and all heads,
//! reading each block of rows whole, front to back (the kernels ask for the next block's rows
//! of their head as they read this block's); each segment keeps its own running maximum and
//! sum, and the segments are merged in position order. The segments depend on the positions
//! a token sees alone ([`segment_len`]), so the result depends on neither the thread count nor
//! where the pages lie.

use super::{exp_sub_sum, max, weighted_values, Inputs, PvRows};
use crate::kernels::gemv::block;
use ft_backend::Result;
use rayon::prelude::*;
use rayon::ThreadPool;

/// Most new tokens a split call takes (decode steps; a prefill has pairs enough to share).
pub(super) const MAX_TOKENS: usize = 4;
/// Fewest rows every token must see for the split (below, the pairs' strided reads are
/// cheap). From 256 rather than 1,024 since segments come in even counts: 12-layer Q4_K_M
/// decode after a 512-token prompt, 2 threads, two runs each, the attention of a step took
/// 1.64–1.67 / 1.90–1.95 / 1.95–1.96 ms against 1.87–1.96 / 2.09–2.10 / 2.29–2.32 by pairs, over
/// its first, second and third 64 tokens.
pub(super) const MIN_ROWS: usize = 256;
/// Positions per segment: one task's share.
const SEGMENT: usize = 256;
/// Rows read as one block, all KV heads before the next block (32 rows of 1 KiB: L1-sized).
const BLOCK: usize = 32;

/// Positions per segment of a token that sees `len`: whole blocks, at most [`SEGMENT`], an
/// even count of them up to 1,536 positions (beyond, the rounding to blocks may save one),
/// so two workers get equal shares. Segments of [`SEGMENT`] from the front left 640 positions
/// as 256 + 256 + 128, one worker with twice the other's rows.
fn segment_len(len: usize) -> usize {
    let count = 2 * len.div_ceil(2 * SEGMENT);
    len.div_ceil(count.max(1)).next_multiple_of(BLOCK).max(BLOCK)
}

/// One segment's unnormalised result: per head the maximum scaled score, the sum of
/// `exp(score − max)`, and the values weighted by those exponentials.
struct Partial {
    max: Vec<f32>,
    sum: Vec<f32>,
    out: Vec<f32>,
}

/// [`super::attention`] split by positions; the caller checked [`super::split_positions`].
pub(super) fn attention(pool: &ThreadPool, inp: &Inputs<'_>, out: &mut [f32]) -> Result<()> {
    let d = inp.d;
    // Every (token, segment) task, tokens in order, segments in position order.
    let tasks: Vec<(usize, usize, usize)> = (0..d.n_tokens)
        .flat_map(|t| {
            let (start, end) = inp.seen(t);
            let seg = segment_len(end - start);
            (start..end).step_by(seg).map(move |a| (t, a, (a + seg).min(end)))
        })
        .collect();
    let parts: Vec<Partial> =
        pool.install(|| tasks.par_iter().with_max_len(1).map(|&(t, a, b)| segment(inp, t, a, b)).collect::<Result<_>>())?;
    let vhd = d.v_head_dim;
    for (t, o) in out.chunks_exact_mut(d.n_heads * vhd).enumerate().take(d.n_tokens) {
        let mine: Vec<&Partial> = tasks.iter().zip(&parts).filter(|((tt, _, _), _)| *tt == t).map(|(_, p)| p).collect();
        for (h, oh) in o.chunks_exact_mut(vhd).enumerate() {
            let sink = inp.sinks.map(|s| s[h]);
            let m = mine.iter().map(|p| p.max[h]).fold(sink.unwrap_or(f32::NEG_INFINITY), f32::max);
            let mut denom = sink.map_or(0.0, |x| (x - m).exp());
            oh.fill(0.0);
            for p in &mine {
                let w = (p.max[h] - m).exp();
                denom += w * p.sum[h];
                oh.iter_mut().zip(&p.out[h * vhd..][..vhd]).for_each(|(o, x)| *o += w * x);
            }
            let inv = 1.0 / denom;
            oh.iter_mut().for_each(|o| *o *= inv);
        }
    }
    Ok(())
}

/// Positions `a..b` of token `t`, all heads.
fn segment(inp: &Inputs<'_>, t: usize, a: usize, b: usize) -> Result<Partial> {
    let Inputs { level, q, k, v, d, .. } = *inp;
    let (hd, vhd, heads, kvh_n) = (d.head_dim, d.v_head_dim, d.n_heads, d.n_kv_heads);
    let group = heads / kvh_n;
    let rows = b - a;
    // The runs' parts inside `a..b`, cut into blocks: (first logical row, its cache row, rows).
    let blocks: Vec<(usize, usize, usize)> =
        inp.runs_in(a, b).flat_map(|(j, r, n)| (0..n).step_by(BLOCK).map(move |i| (j + i, r + i, BLOCK.min(n - i)))).collect();
    let q_tok = &q[t * heads * hd..][..heads * hd];
    let k_stride = kvh_n * hd;
    let mut scores = vec![0f32; heads * rows];
    let k_row = k.dtype.row_bytes(k_stride);
    #[cfg(target_arch = "x86_64")]
    let direct = super::flash::eligible(level, k.dtype, v.dtype, d);
    for &(j, r, n) in &blocks {
        for kvh in 0..kvh_n {
            let k_rows = &k.bytes[k.dtype.row_bytes(r * k_stride + kvh * hd)..];
            let s = &mut scores[kvh * group * rows + (j - a)..];
            let qg = &q_tok[kvh * group * hd..];
            #[cfg(target_arch = "x86_64")]
            if direct && k_rows.len() >= k.dtype.row_bytes((n - 1) * k_stride + hd) && s.len() > (group - 1) * rows + n - 1 {
                // SAFETY: AVX2 confirmed by `effective`; the checks above cover the `n` keys
                // and the `group` rows of scores, and `qg` holds `group` query rows.
                unsafe { crate::kernels::x86::flash::key_scores(crate::kernels::x86::code(k.dtype), qg.as_ptr(), group, hd, k_rows.as_ptr(), k_row, n, s.as_mut_ptr(), rows) };
                continue;
            }
            block(level, qg, hd, group, hd, k_rows, k.dtype, k_stride, n, s, rows)?;
        }
    }
    let (mut mx, mut sum) = (vec![0f32; heads], vec![0f32; heads]);
    for (h, s) in scores.chunks_exact_mut(rows).enumerate() {
        s.iter_mut().for_each(|x| *x *= d.scale);
        mx[h] = max(s);
        sum[h] = exp_sub_sum(level, s, mx[h]);
    }
    let v_stride = kvh_n * vhd;
    let mut o = vec![0f32; heads * vhd];
    for &(j, r, n) in &blocks {
        for kvh in 0..kvh_n {
            let pv = PvRows {
                p: &scores[kvh * group * rows + (j - a)..],
                ps: rows,
                heads: group,
                len: n,
                v: &v.bytes[v.dtype.row_bytes((r * kvh_n + kvh) * vhd)..],
                dtype: v.dtype,
                v_stride,
                vhd,
                accumulate: true,
            };
            weighted_values(level, &pv, &mut o[kvh * group * vhd..])?;
        }
    }
    Ok(Partial { max: mx, sum, out: o })
}

#[cfg(test)]
mod tests {
    use super::super::testing::{Case, Shape};
    use super::super::KvCache;
    use super::*;
    use ft_backend::{AttentionDesc, DType};

    /// The same attention split by pairs (in position order) and by positions (segments
    /// merged): equal within 2e-6 (values are ~1; the merge rescales each segment's sums
    /// once); and split by positions, the same bits on one thread and on three.
    #[allow(clippy::too_many_arguments)]
    fn check(dtype: DType, heads: usize, kv_heads: usize, dim: usize, kv_len: usize, tokens: usize, window: Option<usize>, sinks: bool, paged: bool) {
        let shape = Shape { dtype, heads, kv_heads, hd: dim, vhd: dim, kv_len, tokens, window, sinks, paged };
        Case::new(shape, kv_len as u64 + tokens as u64, 64, 1.0, 2.0, 0.5).against_pairs(attention, "position split", 2e-6);
    }

    #[test]
    fn split_by_positions_equals_split_by_pairs() {
        check(DType::F16, 8, 2, 64, 1100, 1, None, false, false);
        check(DType::BF16, 8, 1, 32, 1300, 3, None, true, false);
        check(DType::F32, 4, 4, 48, 1024, 1, None, false, true);
        // A window shorter than the cache: segments start where the window does.
        check(DType::F16, 8, 2, 64, 2000, 2, Some(1500), true, true);
    }

    #[test]
    fn segments_come_in_even_counts_of_whole_blocks() {
        for len in (1..=2000).chain([4096, 4097, 5000]) {
            let seg = segment_len(len);
            let count = len.div_ceil(seg);
            assert!(seg.is_multiple_of(BLOCK) && seg <= SEGMENT.max(BLOCK), "{len}: segments of {seg}");
            assert!(count == 1 || count % 2 == 0 || len > 1536, "{len}: {count} segments of {seg}");
        }
        assert_eq!(segment_len(640), 160);
        assert_eq!(segment_len(4096), 256);
        assert_eq!(segment_len(300), 160);
    }

    #[test]
    fn short_caches_prefills_and_quantized_caches_keep_the_pairs() {
        let d = |n_tokens, kv_len, window| AttentionDesc { n_tokens, n_heads: 8, n_kv_heads: 2, head_dim: 64, v_head_dim: 64, kv_len, scale: 1.0, window };
        let c = |dtype| KvCache { bytes: &[], dtype };
        let split = |dtype, d: &AttentionDesc| super::super::split_positions(c(dtype), c(dtype), d);
        assert!(split(DType::F16, &d(1, 256, None)));
        assert!(!split(DType::F16, &d(1, 255, None)));
        assert!(split(DType::F16, &d(1, 4096, Some(512))));
        assert!(!split(DType::F16, &d(1, 4096, Some(255))));
        assert!(!split(DType::F16, &d(MAX_TOKENS + 1, 4096, None)));
        assert!(!split(DType::Q8_0, &d(1, 4096, None)));
    }
}
