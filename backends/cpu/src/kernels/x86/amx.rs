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
/// order: token tile `τ`, step `s`, pair `p`, token `j` at 32-bit element
/// `((τ·k/32 + s)·16 + p)·16 + j`; tokens past `n` are zero.
pub(crate) fn prepare(xb: &[u16], n: usize, k: usize) -> Vec<u16> {
    debug_assert!(k % KSTEP == 0 && xb.len() >= n * k);
    let (tiles, steps) = (n.div_ceil(TILE), k / KSTEP);
    let mut out = vec![0u32; tiles * steps * TILE * TILE];
    for (t, row) in xb.chunks_exact(k).take(n).enumerate() {
        let (tau, j) = (t / TILE, t % TILE);
        for (s, step) in row.chunks_exact(KSTEP).enumerate() {
            let base = (tau * steps + s) * TILE * TILE + j;
            for (p, pair) in step.chunks_exact(2).enumerate() {
                out[base + p * TILE] = u32::from(pair[0]) | u32::from(pair[1]) << 16;
            }
        }
    }
    out.into_iter().flat_map(|v| [v as u16, (v >> 16) as u16]).collect()
}

/// The 64-byte tile configuration: palette 1, eight tiles of 16 rows × 64 bytes.
#[repr(C, align(64))]
struct Config([u8; 64]);

const CONFIG: Config = {
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

/// Sums of 16 rows × 16 tokens, as a tile stores them (row-major).
#[repr(C, align(64))]
struct Sums([f32; TILE * TILE]);

/// `out[t·os + r] = x_t · w_r` for `r < 16·row_tiles` and `t < n`: `w` the bf16 rows (`k`
/// values each, row-major, any alignment), `xt` the activations in tile order ([`prepare`]).
///
/// # Safety
/// [`available`] returned true; `w` holds `16·row_tiles` rows of `k` values, `xt` is
/// [`prepare`]'s output for `n` tokens of `k`, `out` covers `(n − 1)·os + 16·row_tiles`.
pub(crate) unsafe fn rows(xt: &[u16], n: usize, k: usize, w: *const u8, row_tiles: usize, out: *mut f32, os: usize) {
    let (tiles, steps) = (n.div_ceil(TILE), k / KSTEP);
    let wstride = 2 * k;
    let tile_bytes = TILE * TILE * 4;
    let x = xt.as_ptr() as *const u8;
    asm!("ldtilecfg [{}]", in(reg) CONFIG.0.as_ptr(), options(nostack, readonly));
    let mut sums = Sums([0.0; TILE * TILE]);
    // Two row tiles (32 rows) against two token tiles where there are, so each weight tile
    // loaded meets two token tiles and each token tile two weight tiles.
    let mut rt = 0;
    while rt < row_tiles {
        let two_rows = rt + 1 < row_tiles;
        let mut tt = 0;
        while tt < tiles {
            let two_tokens = tt + 1 < tiles;
            let w0 = w.add(rt * TILE * wstride);
            let w1 = w0.add(TILE * wstride);
            let x0 = x.add(tt * steps * tile_bytes);
            let x1 = x0.add(steps * tile_bytes);
            asm!("tilezero tmm4", "tilezero tmm5", "tilezero tmm6", "tilezero tmm7", options(nostack, nomem));
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
            }
            // Sums tile (row tile i, token tile j) is tmm(4 + 2i + j).
            for (i, j) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
                if (i == 1 && !two_rows) || (j == 1 && !two_tokens) {
                    continue;
                }
                let p = sums.0.as_mut_ptr();
                match 2 * i + j {
                    0 => asm!("tilestored [{p} + {s}*1], tmm4", p = in(reg) p, s = in(reg) 64usize, options(nostack)),
                    1 => asm!("tilestored [{p} + {s}*1], tmm5", p = in(reg) p, s = in(reg) 64usize, options(nostack)),
                    2 => asm!("tilestored [{p} + {s}*1], tmm6", p = in(reg) p, s = in(reg) 64usize, options(nostack)),
                    _ => asm!("tilestored [{p} + {s}*1], tmm7", p = in(reg) p, s = in(reg) 64usize, options(nostack)),
                }
                let (r0, t0) = ((rt + i) * TILE, (tt + j) * TILE);
                for t in 0..TILE.min(n - t0) {
                    let o = out.add((t0 + t) * os + r0);
                    for r in 0..TILE {
                        *o.add(r) = sums.0[r * TILE + t];
                    }
                }
            }
            tt += if two_tokens { 2 } else { 1 };
        }
        rt += if two_rows { 2 } else { 1 };
    }
    asm!("tilerelease", options(nostack, nomem));
}
