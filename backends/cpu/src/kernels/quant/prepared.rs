//! The activations of a fused quantized product, prepared once per product: zero-padded to
//! whole blocks, sub-block sums, int8 codes (or FP8's bf16 order), and the pass over the rows
//! a pool task is given, a few tokens at a time.

use super::{check_weights, QuantDot};
use crate::kernels::{shape_err, SimdLevel};
use ft_backend::{DType, Result};

/// Whether products of `n` tokens run the fused kernels a few tokens at a time
/// (reduced-precision activations allowed by `dot`): on AVX-512, FP8 against bf16 activations
/// (with AVX-512 BF16 and VBMI), and the types whose int8 kernel takes 4 tokens faster than a
/// bf16 tile takes a prefill. A token's products are then the same alone, in a batch and in
/// a prefill. One thread, cache-warm `2048 × 768`, GFLOP/s at 64 tokens, the int8 kernel in
/// groups against the bf16 tiles (the tiles' figure moves by 15 % between runs here): Q4_K
/// 120 / 77, MXFP4 128 / 82 (on its 512-bit kernel), Q6_K 110 / 81 (on its 512-bit kernel;
/// 76 / 90 on the 256-bit one), Q8_0 97 / 67–87 (unsigned codes, activations 64-byte
/// aligned; 146 with eight blocks transposed, [`crate::kernels::x86::qdot_i8`]); Q4_K and
/// Q5_K take 8 tokens or more on 512-bit registers, two a register
/// ([`crate::kernels::x86::qdot_i8::k4_pairs`]; Q4_K 195–230, Q5_K 160–215 from 8 tokens,
/// where Q5_K's decode-to-scratch route took 38–91); the others keep the tiles, their int8
/// kernels at 4 tokens being no clearly faster (Q4_0 80 / 80–86, NVFP4 90 / 81–87).
///
/// The AMX tiles ([`crate::kernels::gemv::amx_tiles`]) take only FP8 from these, from
/// [`crate::kernels::x86::amx::WIDENED_MIN_TOKENS`] (`x86::fp8_tiles`: its codes unscaled and
/// exact, bf16 activations as in its own kernel, so only the f32 summation order differs).
/// The integer types stay in groups though the tiles prefill 2.3× faster (12-layer Q8_0 GGUF,
/// 512 tokens, 2 threads of a Xeon: 224 against 97 tok/s; 276 against 148 since Q8_0's
/// eight-block kernel): the tiles round the activations to
/// bf16, the kernels to int8 per 32 values, so a prompt restored from the prefix store and
/// prefilled past the restored part in fewer tokens than the tiles take met other numbers than
/// one prefilled whole, and the Q8_0 GGUF agent transcript's greedy tokens changed with reuse
/// (`prefix_reuse::agent_transcript_gguf_model`). On AVX2 alone (`vpmaddubsw`, Zen 3) the
/// alternative is f32 tiles over weights decoded to f32; one thread, same shape, int8 at 4
/// tokens against the f32 tiles at 64: Q4_K 121 / 56, Q5_K 94 / 51, Q6_K 94 / 50–56, Q4_0
/// 130 / 58 and MXFP4 89 / 58 (their codes transposed so that a block meets its scales once per
/// token; before that 90, 65, 59, 66 and 68) and Q8_0 68 / 61 go in groups. Q8_0 stays in
/// groups beyond the tiles' crossover (int8 / tiles 67 / 67 at 32 tokens, 66 / 92 at 512; its
/// signed codes cost a sign move, a conversion and two multiplies per block and token) for the
/// same reason: the tiles above 32 tokens raised the 12-layer Q8_0 GGUF's 512-token prefill
/// from 62–85 to 93–106 tok/s and changed that transcript's tokens. NVFP4 (56 / 58, 20
/// at 5 tokens) keeps the tiles: in groups, the int8 prefill of a short prompt moved the
/// qwen3_5_moe NVFP4 fixture's next logits by 0.79 of their scale (its gated-delta state
/// carries the prefill's rounding; the tests allow 0.5).
///
/// `FT_AMX_QUANT_PREFILL=1` gives the integer types' prefills of 32 tokens or more back to the
/// tiles ([`in_groups_with`]), for those who would rather have the speed than exact reuse.
pub(crate) fn in_groups(level: SimdLevel, dot: QuantDot, dtype: DType, n: usize, k: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    let tiles = crate::kernels::x86::amx::quant_prefill_requested();
    #[cfg(not(target_arch = "x86_64"))]
    let tiles = false;
    in_groups_with(level, dot, dtype, n, k, tiles)
}

/// [`in_groups`], the integer types' prefills of
/// [`crate::kernels::x86::amx::WIDENED_MIN_TOKENS`] tokens or more left to the AMX tiles where
/// `tiles_for_integers` and the tiles run (`FT_AMX_QUANT_PREFILL=1`).
pub(crate) fn in_groups_with(level: SimdLevel, dot: QuantDot, dtype: DType, n: usize, k: usize, tiles_for_integers: bool) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        if dot != QuantDot::Int8 {
            return false;
        }
        match level.effective() {
            SimdLevel::Avx512 => {}
            SimdLevel::Avx2 => {
                return matches!(dtype, DType::Q4K | DType::Q5K | DType::Q6K | DType::Q4_0 | DType::Q8_0 | DType::Mxfp4)
            }
            SimdLevel::Scalar | SimdLevel::Auto => return false,
        }
        if (dtype == DType::F8E4M3 || tiles_for_integers) && crate::kernels::gemv::widened_on_tiles(level, dot, n, k) {
            return false;
        }
        match dtype {
            DType::F8E4M3 => crate::kernels::x86::fp8_bf16::available(),
            DType::Q4K | DType::Mxfp4 => true,
            DType::Q5K => crate::kernels::x86::qdot_i8::k4_pairs::available(),
            // Only their kernels of the variant's own beat the tiles.
            DType::Q8_0 | DType::Q6K => crate::kernels::x86::qdot_i8::Isa::best(level).own_sums(dtype),
            _ => false,
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (level, dot, dtype, n, k, tiles_for_integers);
        false
    }
}

/// The activations of one decode-sized product, prepared once (zero-padded to whole blocks,
/// sub-block sums, int8 codes) and shared by every row chunk the product is split into.
pub(crate) struct Prepared<'a> {
    dtype: DType,
    n: usize,
    k: usize,
    x: std::borrow::Cow<'a, [f32]>,
    xs: usize,
    aux: Aligned<f32>,
    /// Int8 codes and their scales (one per 32 values), token-major, when `dot` is `Int8`.
    int8: Option<Int8>,
    /// FP8's activations rounded to bf16 in its kernel's order, token-major, when `dot` is
    /// `Int8` and the CPU has AVX-512 BF16 and VBMI.
    fp8_bf16: Option<Aligned<u16>>,
    /// The integer instructions the int8 kernels use.
    #[cfg(target_arch = "x86_64")]
    isa: crate::kernels::x86::qdot_i8::Isa,
    /// Q4_K's or Q5_K's activations in token pairs, where the 512-bit pair kernel runs
    /// ([`crate::kernels::x86::qdot_i8::k4_pairs`]).
    #[cfg(target_arch = "x86_64")]
    pairs: Option<crate::kernels::x86::qdot_i8::k4_pairs::Pairs>,
}

impl<'a> Prepared<'a> {
    /// Prepares `n` tokens of `x` (stride `xs`) for the fused kernels; `None` where they do
    /// not apply (no AVX2, a dtype without one, or more than 4 tokens of a type that does not
    /// run them [`in_groups`]), leaving the product to the decode-to-scratch path.
    #[allow(unused_variables)]
    pub(crate) fn new(
        level: SimdLevel,
        dot: QuantDot,
        x: &'a [f32],
        xs: usize,
        n: usize,
        k: usize,
        dtype: DType,
    ) -> Result<Option<Self>> {
        #[cfg(not(target_arch = "x86_64"))]
        return Ok(None);
        #[cfg(target_arch = "x86_64")]
        {
            use crate::kernels::x86::{qdot, qdot_i8};
            if n == 0
                || (n > qdot::MAX_TOKENS && !in_groups(level, dot, dtype, n, k))
                || !matches!(level.effective(), SimdLevel::Avx2 | SimdLevel::Avx512)
                || !qdot::supported(dtype)
            {
                return Ok(None);
            }
            let x_need = (n - 1).checked_mul(xs).and_then(|v| v.checked_add(k));
            if x_need.is_none_or(|v| v > x.len()) {
                return Err(shape_err(format!(
                    "{dtype} matmul of {n} tokens × k={k}: x has {} values",
                    x.len()
                )));
            }
            let (be, kp) = (dtype.block_elems(), dtype.padded(k));
            // The kernels read whole blocks of activations: a partial last block is
            // zero-padded (padded weight values then contribute nothing, as in the scratch
            // path).
            let (xv, xs) = if kp == k {
                (std::borrow::Cow::Borrowed(x), xs)
            } else {
                let mut v = vec![0f32; n * kp];
                for t in 0..n {
                    v[t * kp..][..k].copy_from_slice(&x[t * xs..][..k]);
                }
                (std::borrow::Cow::Owned(v), kp)
            };
            let blocks = kp / be;
            let apb = qdot::aux_per_block(dtype);
            let mut aux = Aligned::zeroed(n * blocks * apb);
            if let Some(g) = be.checked_div(apb) {
                let mut tokens: Vec<&mut [f32]> = aux.chunks_mut(blocks * apb).collect();
                per_token(&mut tokens, |t, sums| {
                    // SAFETY: the level checked above implies AVX; every type with sums has
                    // sub-blocks of 16 or 32 values.
                    unsafe { sub_block_sums(&xv[t * xs..][..kp], g, sums) };
                });
            }
            let isa = qdot_i8::Isa::best(level);
            let int8 = (dot == QuantDot::Int8 && qdot_i8::supported(dtype)).then(|| int8_codes(&xv, xs, n, kp, dtype, isa, &aux));
            let fp8_bf16 = (dot == QuantDot::Int8 && dtype == DType::F8E4M3 && crate::kernels::x86::fp8_bf16::available()).then(|| {
                let mut v = Aligned::zeroed(n * kp);
                for t in 0..n {
                    crate::kernels::x86::fp8_bf16::prepare(&xv[t * xs..][..kp], &mut v[t * kp..][..kp]);
                }
                v
            });
            // FP8's AVX2 kernel reads its activations reordered and scaled (`fp8_prepare`).
            let (xv, xs) = if dtype == DType::F8E4M3 && fp8_bf16.is_none() {
                let mut v = vec![0f32; n * kp];
                for t in 0..n {
                    qdot::fp8_prepare(&xv[t * xs..][..kp], &mut v[t * kp..][..kp]);
                }
                (std::borrow::Cow::Owned(v), kp)
            } else {
                (xv, xs)
            };
            let pairs = int8.as_ref().and_then(|i| pairs(isa, dtype, i, &aux, n, kp));
            Ok(Some(Self {
                dtype,
                n,
                k,
                x: xv,
                xs,
                aux,
                int8,
                fp8_bf16,
                isa,
                pairs,
            }))
        }
    }

    /// The same activations for the int8 kernels in `isa`'s instructions (tests compare
    /// every variant the CPU has).
    #[cfg(all(test, target_arch = "x86_64"))]
    pub(crate) fn with_isa(mut self, isa: crate::kernels::x86::qdot_i8::Isa) -> Self {
        self.isa = isa;
        if self.int8.is_some() {
            let kp = self.dtype.padded(self.k);
            self.int8 = Some(int8_codes(&self.x, self.xs, self.n, kp, self.dtype, isa, &self.aux));
        }
        self.pairs = self.int8.as_ref().and_then(|i| pairs(isa, self.dtype, i, &self.aux, self.n, self.dtype.padded(self.k)));
        self
    }

    /// Whether the 512-bit pair kernel serves these tokens (tests name what they covered).
    #[cfg(all(test, target_arch = "x86_64"))]
    pub(crate) fn has_pairs(&self) -> bool {
        self.pairs.is_some()
    }

    /// `out[t*os + r] = x_t · row(r)` for the prepared tokens and the `nrows` rows at the
    /// start of `w`.
    pub(crate) fn run(&self, w: &[u8], nrows: usize, out: &mut [f32], os: usize) -> Result<()> {
        let (dtype, n) = (self.dtype, self.n);
        let out_need = (n - 1).checked_mul(os).and_then(|v| v.checked_add(nrows));
        if out_need.is_none_or(|v| v > out.len()) {
            return Err(shape_err(format!(
                "{dtype} matmul of {n} tokens × {nrows} rows: out holds {} values",
                out.len()
            )));
        }
        // SAFETY: `out` holds the extent checked above and is borrowed mutably for the call.
        unsafe { self.run_into(w, nrows, out.as_mut_ptr(), os) }
    }

    /// [`Prepared::run`] into the output at `out`, which the prefill tasks of one product
    /// share (each writing columns of its own), so no `&mut` slice covers it.
    ///
    /// # Safety
    /// `out` holds `(n - 1)·os + nrows` values that nothing else reads or writes while this
    /// runs.
    pub(crate) unsafe fn run_into(&self, w: &[u8], nrows: usize, out: *mut f32, os: usize) -> Result<()> {
        let (dtype, n, k) = (self.dtype, self.n, self.k);
        check_weights(k, w, dtype, nrows)?;
        if nrows == 0 {
            return Ok(());
        }
        #[cfg(target_arch = "x86_64")]
        {
            use crate::kernels::x86::{qdot, qdot_i8};
            let kp = dtype.padded(k);
            let blocks = kp / dtype.block_elems();
            let auxs = blocks * qdot::aux_per_block(dtype);
            // Token pairs first where the pair kernel runs (the same bits as the rest take).
            let mut first = 0;
            if let Some(p) = &self.pairs {
                // SAFETY: `pairs` confirmed the pair kernel's instructions (VBMI with GFNI's
                // variant) and laid out `blocks` whole blocks per token; `w` and `out` were
                // checked above.
                unsafe { p.run(dtype == DType::Q5K, self.isa == qdot_i8::Isa::Avx512Gfni, w.as_ptr(), dtype.row_bytes(k), nrows, out, os) };
                first = 2 * p.pairs();
            }
            // More tokens than a pass takes (a prefill [`in_groups`]) go through the rows given
            // here a group at a time: the rows, one pool task's share, stay in cache.
            for g0 in (first..n).step_by(qdot::MAX_TOKENS) {
                let cnt = qdot::MAX_TOKENS.min(n - g0);
                let out = out.add(g0 * os);
                if let Some(xb) = &self.fp8_bf16 {
                    let x = xb[g0 * kp..].as_ptr();
                    let job = crate::kernels::x86::fp8_bf16::Job { x, xs: kp, w: w.as_ptr(), rb: dtype.row_bytes(k), blocks, out, os };
                    // SAFETY: `new` confirmed AVX-512 BF16 and VBMI and prepared `blocks` whole
                    // blocks per token; `w` and `out` were checked above.
                    unsafe { crate::kernels::x86::fp8_bf16::run(&job, cnt, nrows) };
                    continue;
                }
                match &self.int8 {
                    Some(Int8 { q, d, extras }) => {
                        // A kernel that reads per-token extras reads them where the others
                        // read sub-block sums.
                        let (aux, auxs) = match extras {
                            Some(e) => (e, e.len() / n),
                            None => (&self.aux, auxs),
                        };
                        let job = qdot_i8::Job {
                            q: q[g0 * kp..].as_ptr(),
                            qs: kp,
                            d: d[g0 * kp / qdot_i8::QK..].as_ptr(),
                            ds: kp / qdot_i8::QK,
                            aux: aux[g0 * auxs..].as_ptr(),
                            auxs,
                            w: w.as_ptr(),
                            rb: dtype.row_bytes(k),
                            blocks,
                            out,
                            os,
                        };
                        // SAFETY: `new` confirmed AVX2/FMA/F16C and sized the activations for
                        // `blocks` blocks per token; `w` and `out` were checked above.
                        unsafe { qdot_i8::run(self.isa, dtype, &job, cnt, nrows) };
                    }
                    None => {
                        let job = qdot::Job {
                            x: self.x[g0 * self.xs..].as_ptr(),
                            xs: self.xs,
                            aux: self.aux[g0 * auxs..].as_ptr(),
                            auxs,
                            w: w.as_ptr(),
                            rb: dtype.row_bytes(k),
                            blocks,
                            out,
                            os,
                        };
                        // SAFETY: as above; `x` holds `blocks` whole blocks per token (checked
                        // or padded in `new`).
                        unsafe { qdot::run(dtype, &job, cnt, nrows) };
                    }
                }
            }
        }
        Ok(())
    }
}

/// Q4_K's or Q5_K's int8 activations in token pairs for the 512-bit pair kernel, where `isa`
/// is an AVX-512 variant, the CPU runs it and there are [`k4_pairs::MIN_TOKENS`] tokens or
/// more.
#[cfg(target_arch = "x86_64")]
fn pairs(isa: crate::kernels::x86::qdot_i8::Isa, dtype: DType, i: &Int8, aux: &[f32], n: usize, kp: usize) -> Option<crate::kernels::x86::qdot_i8::k4_pairs::Pairs> {
    use crate::kernels::x86::qdot_i8::{k4_pairs, Isa};
    let wide = matches!(isa, Isa::Avx512Vnni | Isa::Avx512Vbmi | Isa::Avx512Gfni);
    (matches!(dtype, DType::Q4K | DType::Q5K) && n >= k4_pairs::MIN_TOKENS && wide && k4_pairs::available()).then(|| k4_pairs::Pairs::new(&i.q, &i.d, aux, n, kp, isa.k4_crossed()))
}

/// A product's int8 activations.
struct Int8 {
    /// Codes, token-major, in the order of the kernel that reads them.
    q: Aligned<i8>,
    /// One scale per 32 values, token-major.
    d: Vec<f32>,
    /// What the kernel reads beside them where it reads extras
    /// ([`crate::kernels::x86::qdot_i8::Isa::has_extras`]), token-major.
    extras: Option<Aligned<f32>>,
}

/// `sums[i]` = the sum of `x[i·g..(i + 1)·g]`, `g` a multiple of 8: eight partial sums (value
/// `j` into partial `j mod 8`, in order), then `((p0 + p4) + (p2 + p6)) + ((p1 + p5) + (p3 +
/// p7))`; the same order for every product, so decode, batches and prefills agree. Added one
/// by one, eight strided chains side by side in general registers took a 512-token Q4_K_M
/// prefill ~2.5 % of its samples.
///
/// # Safety
/// The CPU has AVX.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn sub_block_sums(x: &[f32], g: usize, sums: &mut [f32]) {
    use std::arch::x86_64::*;
    debug_assert!(g % 8 == 0 && x.len() >= sums.len() * g);
    for (s, c) in sums.iter_mut().zip(x.chunks_exact(g)) {
        let mut p = _mm256_setzero_ps();
        for run in c.chunks_exact(8) {
            p = _mm256_add_ps(p, _mm256_loadu_ps(run.as_ptr()));
        }
        let four = _mm_add_ps(_mm256_castps256_ps128(p), _mm256_extractf128_ps::<1>(p));
        let two = _mm_add_ps(four, _mm_movehl_ps(four, four));
        *s = _mm_cvtss_f32(_mm_add_ss(two, _mm_movehdup_ps(two)));
    }
}

/// Fewest tokens whose activations [`Prepared::new`] prepares over the pool it runs on: the
/// attention projections of a 512-token prefill quantized on one thread while the other
/// waited (~1 % of the samples each way); expert products, which prepare side by side, and
/// decode stay on their thread.
#[cfg(target_arch = "x86_64")]
const PARALLEL_TOKENS: usize = 64;

/// Runs `f(t, &mut tokens[t])` for every token's slices, over the rayon pool this thread works
/// in where there are [`PARALLEL_TOKENS`] or more (the same work per token either way).
#[cfg(target_arch = "x86_64")]
fn per_token<T: Send, F: Fn(usize, &mut T) + Sync>(tokens: &mut [T], f: F) {
    if tokens.len() >= PARALLEL_TOKENS && rayon::current_thread_index().is_some() {
        use rayon::prelude::*;
        tokens.par_iter_mut().enumerate().for_each(|(t, v)| f(t, v));
    } else {
        tokens.iter_mut().enumerate().for_each(|(t, v)| f(t, v));
    }
}

/// Quantizes `n` tokens of `x` (stride `xs`, `kp` values each, whole blocks of `dtype`) to int8
/// for the kernels of `isa`; `aux` holds the tokens' exact sub-block sums.
#[cfg(target_arch = "x86_64")]
fn int8_codes(x: &[f32], xs: usize, n: usize, kp: usize, dtype: DType, isa: crate::kernels::x86::qdot_i8::Isa, aux: &[f32]) -> Int8 {
    use crate::kernels::x86::qdot_i8;
    let g = kp / qdot_i8::QK;
    let with_extras = isa.has_extras(dtype);
    let (per, sums) = (if with_extras { isa.extras_len(dtype, kp) } else { 0 }, aux.len() / n);
    // Chunks of at least one value, so every token has one (a row shorter than one of MXFP4's
    // 512-bit steps has no extras).
    let (mut q, mut d, mut e) = (Aligned::zeroed(n * kp), vec![0f32; n * g], Aligned::zeroed(n * per.max(1)));
    let mut tokens: Vec<_> = q.chunks_mut(kp).zip(d.chunks_mut(g)).zip(e.chunks_mut(per.max(1))).collect();
    per_token(&mut tokens, |t, ((q, d), e)| {
        let e = &mut e[..per];
        // SAFETY: `Prepared::new` confirmed AVX2/FMA/F16C; `kp` is a multiple of every int8
        // type's block, itself a multiple of QK, and the slices are sized so.
        unsafe { qdot_i8::quantize(&x[t * xs..][..kp], q, d) };
        if with_extras {
            isa.make_extras(dtype, q, d, &aux[t * sums..][..sums], e);
            return;
        }
        // The activation order of the kernels that pair scale groups in one register (the
        // kernels that read extras were given theirs by `make_extras`).
        match dtype {
            DType::Q4K | DType::Q5K => qdot_i8::q4_k_order(q, d, isa.k4_crossed()),
            DType::Q6K => qdot_i8::q6_k_order(q),
            // Whole runs of eight blocks only, the last blocks as they are.
            DType::Q4_0 => qdot_i8::blocks8_order(q),
            _ => {}
        }
    });
    drop(tokens);
    Int8 { q, d, extras: with_extras.then_some(e) }
}

/// A zeroed buffer whose first element sits on a 64-byte boundary. The kernels read activations
/// in 32- and 64-byte loads, and a load that straddles two cache lines costs two: with the
/// codes and extras of a 2048-value token at 64-byte offsets, one warm thread's Q6_K product
/// at 4 tokens went from 23.0 to 18.3 ns a row and block (Q6_K on 512-bit registers).
pub(crate) struct Aligned<T> {
    buf: Vec<T>,
    off: usize,
    len: usize,
}

impl<T: Copy + Default> Aligned<T> {
    /// `len` zeroed values.
    pub(crate) fn zeroed(len: usize) -> Self {
        let size = std::mem::size_of::<T>().max(1);
        let buf = vec![T::default(); len + 64 / size];
        // The allocation is aligned to `T`, so the distance to the next boundary is a whole
        // number of values.
        let off = (buf.as_ptr() as usize).wrapping_neg() % 64 / size;
        Self { buf, off, len }
    }
}

impl<T> std::ops::Deref for Aligned<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.buf[self.off..][..self.len]
    }
}

impl<T> std::ops::DerefMut for Aligned<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.buf[self.off..][..self.len]
    }
}
