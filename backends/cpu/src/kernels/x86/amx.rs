//! AMX tiles (`tdpbf16ps`, Sapphire Rapids and later) for bf16 products of many tokens.
//!
//! One `tdpbf16ps` multiplies a 16 × 32 bf16 tile by a 32 × 16 one into 16 × 16 f32 sums:
//! 8192 multiply-adds, against 32 for a `vdpbf16ps`. A prefill with bf16 weights (or
//! quantized ones dequantized to bf16) is compute-bound on `vdpbf16ps` at ~95 GFLOP/s a core;
//! the tiles run one expert-shaped product (768 × 2048, 32 tokens) at ~530.
//!
//! Layout: the weight tile is 16 rows × 32 values read straight from the row-major weights
//! (stride `2k` bytes); the activation tile is 16 pairs of k × 16 tokens, each 32-bit element
//! a pair of neighbouring values of one token ([`prepare`], once per product); the sums tile is
//! 16 rows × 16 tokens, written out transposed.
//!
//! The sums add in the tile's own order, not `vdpbf16ps`'s sixteen lanes, so a token's result
//! differs in the last bits from the one it gets in a product of fewer than [`MIN_TOKENS`]
//! tokens (decode); every product of at least that many tokens takes the tiles.
//!
//! Linux hands out the tile state only on request ([`available`] asks once per process).

use std::arch::asm;
use std::sync::OnceLock;

/// Rows, tokens and 32-bit elements (pairs of k) of one tile.
pub(crate) const TILE: usize = 16;
/// Values of k per tile step.
pub(crate) const KSTEP: usize = 32;
/// Fewest tokens a product takes the tiles for: one token tile, so the 16-wide sums are not
/// mostly padding, and batched decode (fewer sequences than this) keeps `vdpbf16ps`'s bits.
pub(crate) const MIN_TOKENS: usize = 16;
/// Fewest tokens a product whose rows must first be widened to bf16 (FP8, and the integer
/// types under [`quant_prefill_requested`]) leaves its own kernel for the tiles
/// ([`crate::kernels::quant::in_groups`]): the widening is repaid from about 24 tokens (one
/// thread, Q4_K 768 × 2048: 16 tokens 73–89 GFLOP/s against the int8 kernel's ~120, 32 tokens
/// 139–166).
pub(crate) const WIDENED_MIN_TOKENS: usize = 2 * MIN_TOKENS;

/// Whether `FT_AMX_QUANT_PREFILL=1` asks for the integer block types' prefills on the tiles
/// ([`crate::kernels::quant::in_groups`]): 512-token prefills of the 12-layer models here
/// 1.7–2.5× faster, but a token's products then differ between a prefill (bf16 activations)
/// and a decode step (int8), so a prompt restored from the prefix store may continue with
/// other tokens than one prefilled whole (`prefix_reuse::agent_transcript_gguf_model` fails
/// with it). Read once.
pub(crate) fn quant_prefill_requested() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        let on = std::env::var("FT_AMX_QUANT_PREFILL").is_ok_and(|v| v == "1");
        if on {
            tracing::warn!("FT_AMX_QUANT_PREFILL=1: integer block types prefill on the AMX tiles where the CPU has them; a prompt restored from the prefix store may then continue with other tokens than one prefilled whole");
        }
        on
    })
}

/// Whether the CPU has AMX-TILE and AMX-BF16 and the kernel granted this process the tile
/// state (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`); asked once.
pub(crate) fn available() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        if std::env::var_os("FT_NO_AMX").is_some() {
            return false;
        }
        // CPUID leaf 7: EDX bit 22 AMX-BF16, bit 24 AMX-TILE.
        let edx = std::arch::x86_64::__cpuid_count(7, 0).edx;
        if edx & (1 << 22) == 0 || edx & (1 << 24) == 0 {
            return false;
        }
        request_tile_state()
    })
}

/// Asks Linux for the tile data state; false on any refusal (or another OS).
fn request_tile_state() -> bool {
    #[cfg(target_os = "linux")]
    {
        const SYS_ARCH_PRCTL: i64 = 158;
        const ARCH_REQ_XCOMP_PERM: i64 = 0x1023;
        const XFEATURE_XTILEDATA: i64 = 18;
        let ret: i64;
        // SAFETY: a plain system call; it only changes this process's permitted XSAVE state.
        unsafe {
            asm!(
                "syscall",
                inlateout("rax") SYS_ARCH_PRCTL => ret,
                in("rdi") ARCH_REQ_XCOMP_PERM,
                in("rsi") XFEATURE_XTILEDATA,
                lateout("rcx") _,
                lateout("r11") _,
                options(nostack)
            );
        }
        ret == 0
    }
    #[cfg(not(target_os = "linux"))]
    false
}

/// `n` tokens of `k` bf16 activations (`xb`, row-major, `k` a multiple of [`KSTEP`]) in tile
/// order, each element a pair of neighbouring values: token tile `τ`, step `s`, pair `p`,
/// token `j` at `((τ·k/32 + s)·16 + p)·16 + j`; tokens past `n` are zero. Each step of a token
/// tile is one 16 × 16 transpose in registers (element by element, the stores hit a new line
/// each and took 4.5 % of a bf16 prefill).
pub(crate) fn prepare(xb: &[u16], n: usize, k: usize) -> Vec<u32> {
    assert!(k.is_multiple_of(KSTEP) && xb.len() >= n * k, "activations for the tiles");
    let (tiles, steps) = (n.div_ceil(TILE), k / KSTEP);
    let mut out = vec![0u32; tiles * steps * TILE * TILE];
    // SAFETY: the tiles are used only where AVX-512 is (`gemv::amx_tiles`); the reads stay in
    // `n` rows of `k` values of `xb` and the writes in `out`, as sized above.
    unsafe { prepare_avx512(xb.as_ptr(), n, k, out.as_mut_ptr()) };
    out
}

#[target_feature(enable = "avx512f")]
unsafe fn prepare_avx512(xb: *const u16, n: usize, k: usize, out: *mut u32) {
    use std::arch::x86_64::*;
    let steps = k / KSTEP;
    for tau in 0..n.div_ceil(TILE) {
        for s in 0..steps {
            let mut r = [_mm512_setzero_ps(); TILE];
            for (j, v) in r.iter_mut().enumerate() {
                let t = tau * TILE + j;
                if t < n {
                    *v = _mm512_loadu_ps(xb.add(t * k + s * KSTEP) as *const f32);
                }
            }
            transpose16(&mut r);
            let o = out.add((tau * steps + s) * TILE * TILE);
            for (p, v) in r.iter().enumerate() {
                _mm512_storeu_ps(o.add(p * TILE) as *mut f32, *v);
            }
        }
    }
}

/// Transposes 16 rows of 16 32-bit lanes: row `i` lane `j` goes to row `j` lane `i`.
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn transpose16(r: &mut [std::arch::x86_64::__m512; TILE]) {
    use std::arch::x86_64::*;
    let (lo, hi) = (|a, b| _mm512_unpacklo_ps(a, b), |a, b| _mm512_unpackhi_ps(a, b));
    let pd = |v: __m512| _mm512_castps_pd(v);
    let ps = |v: __m512d| _mm512_castpd_ps(v);
    // Within each 128-bit lane: a 4 × 4 transpose of rows 4i..4i+4.
    let mut b = [_mm512_setzero_ps(); TILE];
    for i in 0..4 {
        let a0 = lo(r[4 * i], r[4 * i + 1]);
        let a1 = hi(r[4 * i], r[4 * i + 1]);
        let a2 = lo(r[4 * i + 2], r[4 * i + 3]);
        let a3 = hi(r[4 * i + 2], r[4 * i + 3]);
        b[4 * i] = ps(_mm512_unpacklo_pd(pd(a0), pd(a2)));
        b[4 * i + 1] = ps(_mm512_unpackhi_pd(pd(a0), pd(a2)));
        b[4 * i + 2] = ps(_mm512_unpacklo_pd(pd(a1), pd(a3)));
        b[4 * i + 3] = ps(_mm512_unpackhi_pd(pd(a1), pd(a3)));
    }
    // `b[4i + q]` lane `j` holds rows 4i..4i+4 of column 4j + q: a 4 × 4 transpose of
    // 128-bit lanes over i for each q.
    for q in 0..4 {
        let c0 = _mm512_shuffle_f32x4::<0x44>(b[q], b[4 + q]);
        let c1 = _mm512_shuffle_f32x4::<0xEE>(b[q], b[4 + q]);
        let c2 = _mm512_shuffle_f32x4::<0x44>(b[8 + q], b[12 + q]);
        let c3 = _mm512_shuffle_f32x4::<0xEE>(b[8 + q], b[12 + q]);
        r[q] = _mm512_shuffle_f32x4::<0x88>(c0, c2);
        r[4 + q] = _mm512_shuffle_f32x4::<0xDD>(c0, c2);
        r[8 + q] = _mm512_shuffle_f32x4::<0x88>(c1, c3);
        r[12 + q] = _mm512_shuffle_f32x4::<0xDD>(c1, c3);
    }
}

/// The 64-byte tile configuration: palette 1, eight tiles of 16 rows × 64 bytes.
#[repr(C, align(64))]
pub(crate) struct Config(pub(crate) [u8; 64]);

pub(crate) const CONFIG: Config = {
    let mut b = [0u8; 64];
    b[0] = 1;
    let mut t = 0;
    while t < 8 {
        b[16 + 2 * t] = 64;
        b[48 + t] = TILE as u8;
        t += 1;
    }
    Config(b)
};

/// Stores accumulator tile `tmm4 + q` to `sums`.
#[inline(always)]
unsafe fn store_sums(q: usize, sums: &mut Sums) {
    let p = sums.0.as_mut_ptr();
    match q {
        0 => asm!("tilestored [{p} + {s}*1], tmm4", p = in(reg) p, s = in(reg) 64usize, options(nostack)),
        1 => asm!("tilestored [{p} + {s}*1], tmm5", p = in(reg) p, s = in(reg) 64usize, options(nostack)),
        2 => asm!("tilestored [{p} + {s}*1], tmm6", p = in(reg) p, s = in(reg) 64usize, options(nostack)),
        _ => asm!("tilestored [{p} + {s}*1], tmm7", p = in(reg) p, s = in(reg) 64usize, options(nostack)),
    }
}

/// Sums of 16 rows × 16 tokens, as a tile stores them (row-major).
#[repr(C, align(64))]
struct Sums([f32; TILE * TILE]);

/// Scales of the weights' k-blocks (FP8: the codes go to the tiles unscaled): row `r`'s block
/// `b` (values `b·32·steps ..`) is `s[r·per_row + b]`.
pub(crate) struct Scales<'a> {
    /// The scales, row-major.
    pub s: &'a [f32],
    /// Blocks per row.
    pub per_row: usize,
    /// Tile steps ([`KSTEP`] values) per block.
    pub steps: usize,
}

/// `out[t·os + r] = x_t · w_r` for `r < 16·row_tiles` and `t < n`: `w` the bf16 rows (`k`
/// values each, row-major, any alignment), `xt` the activations in tile order ([`prepare`]).
/// With `scales`, each k-block's sums leave the tiles and add into f32 accumulators times
/// their row's scale.
///
/// # Safety
/// [`available`] returned true (and AVX-512 is there); `w` holds `16·row_tiles` rows of `k` values, `xt` is
/// [`prepare`]'s output for `n` tokens of `k`, `out` covers `(n − 1)·os + 16·row_tiles`;
/// `scales` (if any) has `steps > 0` and `per_row ≥ ⌈k / (32·steps)⌉` scales for each of those rows.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn rows(xt: &[u32], n: usize, k: usize, w: *const u8, row_tiles: usize, out: *mut f32, os: usize, scales: Option<&Scales>) {
    let (tiles, steps) = (n.div_ceil(TILE), k / KSTEP);
    let wstride = 2 * k;
    let tile_bytes = TILE * TILE * 4;
    let x = xt.as_ptr() as *const u8;
    asm!("ldtilecfg [{}]", in(reg) CONFIG.0.as_ptr(), options(nostack, readonly));
    let mut sums = Sums([0.0; TILE * TILE]);
    // Two row tiles (32 rows) against two token tiles where there are, so each weight tile
    // loaded meets two token tiles and each token tile two weight tiles. Rows in blocks of
    // about 512 KiB, token tiles outside the rows of a block: the block stays in L2 while each
    // pair of token tiles sweeps it (rows outside re-read a 512-token prefill's 2 MiB of
    // activations from L3 for every pair of row tiles).
    let block = ((512usize << 10) / (TILE * wstride)).max(2) & !1;
    for b0 in (0..row_tiles).step_by(block) {
        let b1 = (b0 + block).min(row_tiles);
    let mut tt = 0;
    while tt < tiles {
        let two_tokens = tt + 1 < tiles;
        let mut rt = b0;
        while rt < b1 {
            let two_rows = rt + 1 < b1;
            let w0 = w.add(rt * TILE * wstride);
            let w1 = w0.add(TILE * wstride);
            let x0 = x.add(tt * steps * tile_bytes);
            let x1 = x0.add(steps * tile_bytes);
            asm!("tilezero tmm4", "tilezero tmm5", "tilezero tmm6", "tilezero tmm7", options(nostack, nomem));
            // Scaled: the f32 sums of the blocks so far, per (row tile, token tile), row-major.
            let mut acc = [[std::arch::x86_64::_mm512_setzero_ps(); TILE]; 4];
            for s in 0..steps {
                let (a0, b0) = (w0.add(s * 2 * KSTEP), x0.add(s * tile_bytes));
                match (two_rows, two_tokens) {
                    (true, true) => asm!(
                        "tileloadd tmm0, [{a0} + {sa}*1]",
                        "tileloadd tmm1, [{a1} + {sa}*1]",
                        "tileloadd tmm2, [{b0} + {sb}*1]",
                        "tileloadd tmm3, [{b1} + {sb}*1]",
                        "tdpbf16ps tmm4, tmm0, tmm2",
                        "tdpbf16ps tmm5, tmm0, tmm3",
                        "tdpbf16ps tmm6, tmm1, tmm2",
                        "tdpbf16ps tmm7, tmm1, tmm3",
                        a0 = in(reg) a0, a1 = in(reg) w1.add(s * 2 * KSTEP),
                        b0 = in(reg) b0, b1 = in(reg) x1.add(s * tile_bytes),
                        sa = in(reg) wstride, sb = in(reg) 64usize,
                        options(nostack, readonly)
                    ),
                    (true, false) => asm!(
                        "tileloadd tmm0, [{a0} + {sa}*1]",
                        "tileloadd tmm1, [{a1} + {sa}*1]",
                        "tileloadd tmm2, [{b0} + {sb}*1]",
                        "tdpbf16ps tmm4, tmm0, tmm2",
                        "tdpbf16ps tmm6, tmm1, tmm2",
                        a0 = in(reg) a0, a1 = in(reg) w1.add(s * 2 * KSTEP),
                        b0 = in(reg) b0,
                        sa = in(reg) wstride, sb = in(reg) 64usize,
                        options(nostack, readonly)
                    ),
                    (false, true) => asm!(
                        "tileloadd tmm0, [{a0} + {sa}*1]",
                        "tileloadd tmm2, [{b0} + {sb}*1]",
                        "tileloadd tmm3, [{b1} + {sb}*1]",
                        "tdpbf16ps tmm4, tmm0, tmm2",
                        "tdpbf16ps tmm5, tmm0, tmm3",
                        a0 = in(reg) a0,
                        b0 = in(reg) b0, b1 = in(reg) x1.add(s * tile_bytes),
                        sa = in(reg) wstride, sb = in(reg) 64usize,
                        options(nostack, readonly)
                    ),
                    (false, false) => asm!(
                        "tileloadd tmm0, [{a0} + {sa}*1]",
                        "tileloadd tmm2, [{b0} + {sb}*1]",
                        "tdpbf16ps tmm4, tmm0, tmm2",
                        a0 = in(reg) a0,
                        b0 = in(reg) b0,
                        sa = in(reg) wstride, sb = in(reg) 64usize,
                        options(nostack, readonly)
                    ),
                }
                if let Some(sc) = scales {
                    if (s + 1) % sc.steps == 0 || s + 1 == steps {
                        let block = s / sc.steps;
                        for (q, acc) in acc.iter_mut().enumerate() {
                            let (i, j) = (q / 2, q % 2);
                            if (i == 1 && !two_rows) || (j == 1 && !two_tokens) {
                                continue;
                            }
                            store_sums(q, &mut sums);
                            let r0 = (rt + i) * TILE;
                            for (r, a) in acc.iter_mut().enumerate() {
                                let f = std::arch::x86_64::_mm512_set1_ps(sc.s[(r0 + r) * sc.per_row + block]);
                                let c = std::arch::x86_64::_mm512_load_ps(sums.0.as_ptr().add(r * TILE));
                                *a = std::arch::x86_64::_mm512_fmadd_ps(c, f, *a);
                            }
                        }
                        asm!("tilezero tmm4", "tilezero tmm5", "tilezero tmm6", "tilezero tmm7", options(nostack, nomem));
                    }
                }
            }
            // Sums tile (row tile i, token tile j) is tmm(4 + 2i + j).
            for (i, j) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
                if (i == 1 && !two_rows) || (j == 1 && !two_tokens) {
                    continue;
                }
                let (r0, t0) = ((rt + i) * TILE, (tt + j) * TILE);
                let mut v = [std::arch::x86_64::_mm512_setzero_ps(); TILE];
                if scales.is_some() {
                    v = acc[2 * i + j];
                } else {
                    store_sums(2 * i + j, &mut sums);
                    for (r, v) in v.iter_mut().enumerate() {
                        *v = std::arch::x86_64::_mm512_load_ps(sums.0.as_ptr().add(r * TILE));
                    }
                }
                transpose16(&mut v);
                for (t, v) in v.iter().enumerate().take(TILE.min(n - t0)) {
                    std::arch::x86_64::_mm512_storeu_ps(out.add((t0 + t) * os + r0), *v);
                }
            }
            rt += if two_rows { 2 } else { 1 };
        }
        tt += if two_tokens { 2 } else { 1 };
    }
    }
    asm!("tilerelease", options(nostack, nomem));
}
