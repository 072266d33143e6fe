//! Causal attention of new queries against a KV cache (GQA, sliding window, learned sinks).

use super::elementwise::{axpy_row, exp_sub_sum, max};
use super::quant::decode_row;
use super::{gemv::block, need, shape_err, SimdLevel};
#[cfg(target_arch = "x86_64")]
use super::Out;
use ft_backend::{AttentionDesc, DType, KvPages, Result};
use rayon::prelude::*;
use rayon::ThreadPool;

#[cfg(target_arch = "x86_64")]
mod flash;
mod split;
#[cfg(target_arch = "x86_64")]
mod tiles;

/// Below this many score multiply-adds the calling thread does the work alone.
const PARALLEL_MIN: usize = 1 << 16;

/// A KV cache as raw bytes: `[capacity, n_kv_heads, dim]` values of `dtype`, any alignment.
#[derive(Clone, Copy, Debug)]
pub struct KvCache<'a> {
    /// The cache bytes (only the first `kv_len` entries are read).
    pub bytes: &'a [u8],
    /// Element type of the cache.
    pub dtype: DType,
}

/// Attention per [`AttentionDesc`]: `q[n_tokens, n_heads, head_dim]` f32 against caches
/// `k`, `v`, writing `out[n_tokens, n_heads, v_head_dim]`; `sinks[n_heads]` are extra logits
/// that take part in the softmax but contribute no value.
///
/// A few tokens over a long plain-float cache split by positions (`split`); prefills take
/// the AMX tiles where the CPU has them (`tiles`), else blocks of keys in f32 on AVX2
/// (`flash`); what is left (quantized caches, no AVX2, heads of other widths) is split over
/// (token, KV head) pairs on `pool`, each pair scoring all of its query heads against the
/// shared K rows in one tiled pass. [`path`] names the one a call takes. With `pages`, the
/// caches are pools and the sequence's rows are read in place, page run by page run (see
/// [`KvPages`]).
#[allow(clippy::too_many_arguments)]
pub fn attention(
    pool: &ThreadPool,
    level: SimdLevel,
    q: &[f32],
    k: KvCache<'_>,
    v: KvCache<'_>,
    pages: Option<&KvPages<'_>>,
    sinks: Option<&[f32]>,
    out: &mut [f32],
    d: &AttentionDesc,
) -> Result<()> {
    if d.n_tokens == 0 {
        return Ok(());
    }
    if d.n_kv_heads == 0 || d.n_heads == 0 || !d.n_heads.is_multiple_of(d.n_kv_heads) {
        return Err(shape_err(format!(
            "{} query heads cannot share {} KV heads",
            d.n_heads, d.n_kv_heads
        )));
    }
    if d.kv_len < d.n_tokens {
        return Err(shape_err(format!(
            "kv_len {} is less than the {} new tokens",
            d.kv_len, d.n_tokens
        )));
    }
    let rows_q = need(d.n_tokens, d.n_heads, "query rows")?;
    // The sequence's rows as runs contiguous in the cache (one for a contiguous cache), made
    // once for every (token, head) pair; and the rows the caches must hold.
    let runs = match pages {
        Some(p) => p.runs(0, d.kv_len)?,
        None => vec![(0, 0, d.kv_len)],
    };
    let cache_rows = KvPages::cache_rows(pages, d.kv_len)?;
    // A block-quantized cache (Q8_0) keeps every head's row in whole blocks.
    for (c, dim) in [(k, d.head_dim), (v, d.v_head_dim)] {
        if !dim.is_multiple_of(c.dtype.block_elems()) {
            return Err(shape_err(format!("a {} cache needs heads of whole {}-value blocks, not {dim}", c.dtype, c.dtype.block_elems())));
        }
    }
    let cache_bytes = |dim: usize, dtype: DType, what: &str| -> Result<usize> {
        let values = need(need(cache_rows, d.n_kv_heads, "kv rows")?, dim, what)?;
        dtype.bytes_for(values).ok_or_else(|| shape_err(format!("{values} {dtype} values of {what} overflow")))
    };
    let k_need = cache_bytes(d.head_dim, k.dtype, "k values")?;
    let v_need = cache_bytes(d.v_head_dim, v.dtype, "v values")?;
    let out_len = need(rows_q, d.v_head_dim, "output values")?;
    if q.len() < need(rows_q, d.head_dim, "query values")?
        || k.bytes.len() < k_need
        || v.bytes.len() < v_need
        || out.len() < out_len
    {
        return Err(shape_err(format!(
            "attention {}×{}×{} over kv_len {}: q {} values, k {} bytes, v {} bytes, out {} values",
            d.n_tokens,
            d.n_heads,
            d.head_dim,
            d.kv_len,
            q.len(),
            k.bytes.len(),
            v.bytes.len(),
            out.len()
        )));
    }
    if sinks.is_some_and(|s| s.len() < d.n_heads) {
        return Err(shape_err(format!(
            "{} sinks for {} heads",
            sinks.map_or(0, <[f32]>::len),
            d.n_heads
        )));
    }
    let group = d.n_heads / d.n_kv_heads;
    let chunk = group * d.v_head_dim;
    if chunk == 0 {
        return Ok(());
    }
    let out = &mut out[..out_len];
    let inp = Inputs { level, q, k, v, runs: &runs, sinks, d };
    if split_positions(k, v, d) {
        return split::attention(pool, &inp, out);
    }
    #[cfg(target_arch = "x86_64")]
    if tiles::eligible(level, k.dtype, v.dtype, d) {
        return tiles::attention(pool, &inp, out);
    }
    #[cfg(target_arch = "x86_64")]
    if flash::eligible(level, k.dtype, v.dtype, d) && flash::fits(d) {
        return flash::attention(pool, &inp, out);
    }
    by_pairs(pool, &inp, out)
}

/// The path an attention call of `d` over caches of `k` and `v` takes, as the kernel bench
/// reports it: "position split", "AMX tiles", "flash blocks" or "pair split".
pub fn path(level: SimdLevel, k: DType, v: DType, d: &AttentionDesc) -> &'static str {
    if split_positions(KvCache { bytes: &[], dtype: k }, KvCache { bytes: &[], dtype: v }, d) {
        return "position split";
    }
    #[cfg(target_arch = "x86_64")]
    {
        if tiles::eligible(level, k, v, d) {
            return "AMX tiles";
        }
        if flash::eligible(level, k, v, d) && flash::fits(d) {
            return "flash blocks";
        }
    }
    let _ = level;
    "pair split"
}

/// What one checked attention call reads.
#[derive(Clone, Copy)]
struct Inputs<'a> {
    level: SimdLevel,
    /// `[n_tokens, n_heads, head_dim]` queries.
    q: &'a [f32],
    k: KvCache<'a>,
    v: KvCache<'a>,
    /// The sequence's rows as runs contiguous in the cache: (first logical row, its cache
    /// row, rows).
    runs: &'a [(usize, usize, usize)],
    sinks: Option<&'a [f32]>,
    d: &'a AttentionDesc,
}

impl Inputs<'_> {
    /// The positions `start..end` token `t` sees: its window's, up to its own.
    fn seen(&self, t: usize) -> (usize, usize) {
        let pos = self.d.kv_len - self.d.n_tokens + t;
        (self.d.window.map_or(0, |w| (pos + 1).saturating_sub(w)), pos + 1)
    }

    /// The cache row of every position `0..kv_len`.
    #[cfg(target_arch = "x86_64")]
    fn cache_rows(&self) -> Vec<usize> {
        self.runs_in(0, self.d.kv_len).flat_map(|(_, r, n)| r..r + n).collect()
    }

    /// The runs' parts inside positions `a..b`, as (first logical row, its cache row, rows).
    fn runs_in(&self, a: usize, b: usize) -> impl Iterator<Item = (usize, usize, usize)> + Clone + '_ {
        self.runs.iter().filter_map(move |&(j, r, n)| {
            let (x, y) = (j.max(a), (j + n).min(b));
            // Lazily: `y - x` underflows for a run outside the range.
            (x < y).then(|| (x, r + (x - j), y - x))
        })
    }
}

/// [`attention`] one task per (token, KV head) pair, `out` of the checked length.
fn by_pairs(pool: &ThreadPool, inp: &Inputs<'_>, out: &mut [f32]) -> Result<()> {
    let d = inp.d;
    let group = d.n_heads / d.n_kv_heads;
    let chunk = group * d.v_head_dim;
    let task = |idx: usize, o: &mut [f32]| pair(inp, o, idx / d.n_kv_heads, idx % d.n_kv_heads);
    let work = d.n_tokens * d.n_heads * d.kv_len * d.head_dim.max(1);
    if pool.current_num_threads() > 1 && d.n_tokens * d.n_heads > group && work >= PARALLEL_MIN {
        pool.install(|| {
            out.par_chunks_mut(chunk)
                .enumerate()
                .try_for_each(|(i, o)| task(i, o))
        })
    } else {
        out.chunks_mut(chunk)
            .enumerate()
            .try_for_each(|(i, o)| task(i, o))
    }
}

/// Whether a few tokens' attention over a long cache runs split by positions
/// ([`split::attention`]) rather than by (token, KV head) pair: every token sees at least
/// [`split::MIN_ROWS`] rows and the caches hold plain floats. The thread count plays no
/// part, so neither does it in the numbers.
fn split_positions(k: KvCache<'_>, v: KvCache<'_>, d: &AttentionDesc) -> bool {
    let first = d.kv_len - d.n_tokens + 1;
    let shortest = d.window.map_or(first, |w| w.min(first));
    d.n_tokens <= split::MAX_TOKENS
        && shortest >= split::MIN_ROWS
        && !k.dtype.is_quantized()
        && !v.dtype.is_quantized()
}

/// All query heads of KV head `kvh` for token `t`, into `o[group, v_head_dim]`.
fn pair(inp: &Inputs<'_>, o: &mut [f32], t: usize, kvh: usize) -> Result<()> {
    let Inputs { level, q, k, v, sinks, d, .. } = *inp;
    let group = d.n_heads / d.n_kv_heads;
    let (hd, vhd) = (d.head_dim, d.v_head_dim);
    let (start, end) = inp.seen(t);
    let len = end - start;
    if len == 0 {
        o.fill(0.0);
        // A zero window sees nothing; the reference's empty sum is zero.
        return Ok(());
    }
    let q_rows = &q[(t * d.n_heads + kvh * group) * hd..][..group * hd];
    let runs = inp.runs_in(start, end);
    let k_stride = d.n_kv_heads * hd;
    let mut scores = vec![0f32; group * len];
    for (j, r, n) in runs.clone() {
        let k_rows = &k.bytes[k.dtype.row_bytes(r * k_stride + kvh * hd)..];
        if k.dtype.is_quantized() {
            blocks_scores(level, q_rows, group, hd, k_rows, k.dtype, k.dtype.row_bytes(k_stride), n, &mut scores[j - start..], len);
            continue;
        }
        block(
            level,
            q_rows,
            hd,
            group,
            hd,
            k_rows,
            k.dtype,
            k_stride,
            n,
            &mut scores[j - start..],
            len,
        )?;
    }
    for (g, s) in scores.chunks_exact_mut(len).enumerate() {
        s.iter_mut().for_each(|v| *v *= d.scale);
        let sink = sinks.map(|x| x[kvh * group + g]);
        let m = sink.map_or(max(s), |x| max(s).max(x));
        let denom = exp_sub_sum(level, s, m) + sink.map_or(0.0, |x| (x - m).exp());
        let inv = 1.0 / denom;
        s.iter_mut().for_each(|v| *v *= inv);
    }
    let v_stride = d.n_kv_heads * vhd;
    let v_rows = |r: usize| &v.bytes[v.dtype.row_bytes((r * d.n_kv_heads + kvh) * vhd)..];
    // Run after run, each continuing the sums the last one stored: the same additions in the
    // same order as one pass over contiguous rows, so where a sequence's pages lie in the
    // pool never changes its numbers.
    for (i, (j, r, n)) in runs.enumerate() {
        let pv = PvRows { p: &scores[j - start..], ps: len, heads: group, len: n, v: v_rows(r), dtype: v.dtype, v_stride, vhd, accumulate: i > 0 };
        weighted_values(level, &pv, o)?;
    }
    Ok(())
}

/// [`block`] for a block-quantized cache: `scores[g * ld + i] = q_g · k_row(i)` for `n` rows
/// of `hd` values, row `i` at byte `i * row_bytes`; each row decoded once for all heads.
#[allow(clippy::too_many_arguments)]
fn blocks_scores(level: SimdLevel, q: &[f32], heads: usize, hd: usize, k: &[u8], dtype: DType, row_bytes: usize, n: usize, scores: &mut [f32], ld: usize) {
    let mut row = vec![0f32; hd];
    for i in 0..n {
        decode_row(level, &k[i * row_bytes..], dtype, &mut row);
        for g in 0..heads {
            let qg = &q[g * hd..][..hd];
            scores[g * ld + i] = qg.iter().zip(&row).map(|(a, b)| a * b).sum();
        }
    }
}

/// The operands of [`weighted_values`].
struct PvRows<'a> {
    /// Weights, `heads` rows of `len` (a row every `ps` values).
    p: &'a [f32],
    ps: usize,
    heads: usize,
    len: usize,
    /// Value rows (dtype `dtype`, any alignment), a row every `v_stride` values.
    v: &'a [u8],
    dtype: DType,
    v_stride: usize,
    vhd: usize,
    /// Add to what `out` holds instead of overwriting it.
    accumulate: bool,
}

/// `out[g, :] (+)= Σ_j p[g, j] · v_row(j)` for `g < heads`, rows `j` in order, each head's
/// sums carried in one accumulator per element (so a pass continued with `accumulate` adds
/// exactly as one longer pass would).
fn weighted_values(level: SimdLevel, a: &PvRows<'_>, out: &mut [f32]) -> Result<()> {
    let PvRows { p, ps, heads, len, v, dtype, v_stride, vhd, accumulate } = *a;
    let es = dtype.size();
    let v_need = len.checked_sub(1).map_or(Some(0), |l| {
        l.checked_mul(v_stride)
            .and_then(|e| e.checked_add(vhd))
            .and_then(|e| dtype.bytes_for(e))
    });
    let p_need = heads.checked_sub(1).map_or(Some(0), |h| h.checked_mul(ps).and_then(|e| e.checked_add(len)));
    if p_need.is_none_or(|n| p.len() < n)
        || out.len() < need(heads, vhd, "values out")?
        || v_need.is_none_or(|n| v.len() < n)
    {
        return Err(shape_err(format!(
            "value pass of {heads} heads × {len} rows × {vhd}: p {}, v {} bytes, out {}",
            p.len(),
            v.len(),
            out.len()
        )));
    }
    if heads == 0 || len == 0 {
        if !accumulate {
            out[..heads * vhd].fill(0.0);
        }
        return Ok(());
    }
    if dtype.is_quantized() {
        // Row by row, each decoded once for all heads; every sum in row order, as below.
        if !accumulate {
            out[..heads * vhd].fill(0.0);
        }
        let mut row = vec![0f32; vhd];
        let row_bytes = dtype.row_bytes(v_stride);
        for j in 0..len {
            decode_row(level, &v[j * row_bytes..], dtype, &mut row);
            for (g, og) in out.chunks_exact_mut(vhd).take(heads).enumerate() {
                let w = p[g * ps + j];
                og.iter_mut().zip(&row).for_each(|(o, x)| *o += w * x);
            }
        }
        return Ok(());
    }
    #[cfg(target_arch = "x86_64")]
    {
        use super::x86::{avx2, avx512, code, Pv};
        let level = level.effective();
        let (per_pass, pass): (usize, unsafe fn(u8, usize, Pv)) = match level {
            SimdLevel::Avx512 => (avx512::PV_HEADS, avx512::pv),
            SimdLevel::Avx2 => (avx2::PV_HEADS, avx2::pv),
            _ => (0, avx2::pv),
        };
        if per_pass > 0 {
            for h0 in (0..heads).step_by(per_pass) {
                let g = per_pass.min(heads - h0);
                let a = Pv {
                    p: p[h0 * ps..].as_ptr(),
                    ps,
                    v: v.as_ptr(),
                    vsb: v_stride * es,
                    len,
                    vhd,
                    out: out[h0 * vhd..].as_mut_ptr(),
                    os: vhd,
                    accumulate,
                };
                // SAFETY: the ISA is confirmed by `effective`, and the checks above cover
                // `g` rows of `p` and `out` and `len` value rows.
                unsafe { pass(code(dtype), g, a) };
            }
            return Ok(());
        }
    }
    if !accumulate {
        out[..heads * vhd].fill(0.0);
    }
    for j in 0..len {
        let row = &v[j * v_stride * es..][..vhd * es];
        for (g, og) in out.chunks_exact_mut(vhd).take(heads).enumerate() {
            axpy_row(level, p[g * ps + j], row, dtype, og)?;
        }
    }
    Ok(())
}

/// What the attention tests share.
#[cfg(test)]
mod testing {
    use super::{attention as attend, by_pairs, Inputs, KvCache};
    use crate::kernels::SimdLevel;
    use ft_backend::{AttentionDesc, DType, KvPages, Result};
    use rayon::ThreadPool;

    /// A test shape: the cache's dtype, heads, key and value dims, cached rows, new tokens,
    /// window, whether the heads have sinks and the cache lies in shuffled pages.
    pub(super) struct Shape {
        pub dtype: DType,
        pub heads: usize,
        pub kv_heads: usize,
        pub hd: usize,
        pub vhd: usize,
        pub kv_len: usize,
        pub tokens: usize,
        pub window: Option<usize>,
        pub sinks: bool,
        pub paged: bool,
    }

    /// Random queries, caches and sinks of a [`Shape`], the pages in a shuffled order inside a
    /// pool with room to spare (so runs break) when it is paged.
    pub(super) struct Case {
        s: Shape,
        page_rows: usize,
        table: Vec<u32>,
        kc: Vec<u8>,
        vc: Vec<u8>,
        q: Vec<f32>,
        sink: Vec<f32>,
        runs: Vec<(usize, usize, usize)>,
        pub d: AttentionDesc,
    }

    impl Case {
        /// Values in ±1, queries in ±`q_amp`, sinks in ±`sink_amp`, scores scaled by
        /// `scale / √head_dim`, all drawn from `seed`.
        pub(super) fn new(s: Shape, seed: u64, page_rows: usize, q_amp: f32, sink_amp: f32, scale: f32) -> Case {
            let mut rng = ft_backend::conformance::Rng::new(seed);
            let pages = s.kv_len.div_ceil(page_rows);
            let table: Vec<u32> = (0..pages as u32).map(|p| (p * 7 + 3) % (pages as u32 + 5)).collect();
            let capacity = if s.paged { (pages + 5) * page_rows } else { s.kv_len };
            let kc = bytes(s.dtype, &rng.vec(capacity * s.kv_heads * s.hd, 1.0));
            let vc = bytes(s.dtype, &rng.vec(capacity * s.kv_heads * s.vhd, 1.0));
            let q = rng.vec(s.tokens * s.heads * s.hd, q_amp);
            let sink = rng.vec(s.heads, sink_amp);
            let d = AttentionDesc {
                n_tokens: s.tokens,
                n_heads: s.heads,
                n_kv_heads: s.kv_heads,
                head_dim: s.hd,
                v_head_dim: s.vhd,
                kv_len: s.kv_len,
                scale: scale / (s.hd as f32).sqrt(),
                window: s.window,
            };
            let runs = if s.paged { KvPages { table: &table, page_rows }.runs(0, s.kv_len).expect("runs") } else { vec![(0, 0, s.kv_len)] };
            Case { s, page_rows, table, kc, vc, q, sink, runs, d }
        }

        /// The shape, for assertion messages.
        pub(super) fn what(&self) -> String {
            let s = &self.s;
            format!(
                "{} {}/{}×{}/{} kv {} t {} {:?} sinks {} paged {}",
                s.dtype, s.heads, s.kv_heads, s.hd, s.vhd, s.kv_len, s.tokens, s.window, s.sinks, s.paged
            )
        }

        /// The caches' element type.
        pub(super) fn dtype(&self) -> DType {
            self.s.dtype
        }

        /// Output values per token.
        pub(super) fn row_len(&self) -> usize {
            self.s.heads * self.s.vhd
        }

        /// Tokens `toks` of a case whose new tokens are its whole cache as one chunk of a
        /// prefill: against the cache up to the chunk's end, through the public entry.
        pub(super) fn run(&self, pool: &ThreadPool, toks: std::ops::Range<usize>) -> Vec<f32> {
            let s = &self.s;
            assert_eq!(s.tokens, s.kv_len, "a chunk needs the prompt to be the whole cache");
            let (k, v) = (KvCache { bytes: &self.kc, dtype: s.dtype }, KvCache { bytes: &self.vc, dtype: s.dtype });
            let d = AttentionDesc { n_tokens: toks.len(), kv_len: toks.end, ..self.d };
            let q = &self.q[toks.start * s.heads * s.hd..toks.end * s.heads * s.hd];
            let pages = KvPages { table: &self.table, page_rows: self.page_rows };
            let mut out = vec![f32::NAN; toks.len() * self.row_len()];
            let sinks = s.sinks.then_some(&self.sink[..]);
            attend(pool, SimdLevel::Auto, q, k, v, s.paged.then_some(&pages), sinks, &mut out, &d).expect("attention");
            out
        }

        /// `kernel` (the path [`path`] calls `name`)'s output on 1 and on 3 threads, the same
        /// bits, and within `tol` of the pair split; the public entry gives the same bits too
        /// where it takes `kernel` for this shape. Returns the largest difference from the pair
        /// split.
        pub(super) fn against_pairs(&self, kernel: impl Fn(&ThreadPool, &Inputs<'_>, &mut [f32]) -> Result<()>, name: &str, tol: f32) -> f32 {
            let what = self.what();
            let (k, v) = (KvCache { bytes: &self.kc, dtype: self.s.dtype }, KvCache { bytes: &self.vc, dtype: self.s.dtype });
            let sinks = self.s.sinks.then_some(&self.sink[..]);
            let inp = Inputs { level: SimdLevel::Auto, q: &self.q, k, v, runs: &self.runs, sinks, d: &self.d };
            let n = self.s.tokens * self.s.heads * self.s.vhd;
            let mut pairs = vec![0f32; n];
            by_pairs(&pool(2), &inp, &mut pairs).expect("pairs");
            let mut got = [vec![f32::NAN; n], vec![f32::NAN; n]];
            for (threads, out) in [1, 3].into_iter().zip(&mut got) {
                kernel(&pool(threads), &inp, out).expect("kernel");
            }
            let same = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same(&got[0], &got[1]), "{what}: one thread and three");
            let mut worst = 0f32;
            for (i, (a, b)) in got[0].iter().zip(&pairs).enumerate() {
                assert!((a - b).abs() <= tol, "{what}: value {i}: {a} vs {b}");
                worst = worst.max((a - b).abs());
            }
            let pages = KvPages { table: &self.table, page_rows: self.page_rows };
            let mut via = vec![0f32; n];
            attend(&pool(2), SimdLevel::Auto, &self.q, k, v, self.s.paged.then_some(&pages), sinks, &mut via, &self.d).expect("attention");
            // On a CPU with AMX tiles, the public entry takes them for prefills the flash
            // kernel can also run (the tiles' tests check those).
            let taken = super::path(SimdLevel::Auto, self.s.dtype, self.s.dtype, &self.d);
            if taken == name {
                assert!(same(&via, &got[0]), "{what}: kernels::attention takes the kernel under test");
            } else {
                assert_eq!((name, taken), ("flash blocks", "AMX tiles"), "{what}: the path taken");
            }
            worst
        }
    }

    /// A pool of `threads` workers.
    pub(super) fn pool(threads: usize) -> ThreadPool {
        rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("pool")
    }

    /// The values `x` as cache bytes of `dtype` (f32, f16, else bf16).
    pub(super) fn bytes(dtype: DType, x: &[f32]) -> Vec<u8> {
        match dtype {
            DType::F32 => bytemuck::cast_slice(x).to_vec(),
            DType::F16 => x.iter().flat_map(|&v| half::f16::from_f32(v).to_le_bytes()).collect(),
            _ => x.iter().flat_map(|&v| half::bf16::from_f32(v).to_le_bytes()).collect(),
        }
    }
}
