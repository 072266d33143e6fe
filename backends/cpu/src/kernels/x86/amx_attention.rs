//! Prefill attention on AMX tiles: 16 queries of one head against blocks of [`KEYS`] keys,
//! scores and weighted values both in `tdpbf16ps`, the softmax carried across blocks
//! (flash attention).
//!
//! Queries lie along the tile columns, so each query's running maximum and sum are one lane
//! of a vector and the softmax needs no transposes:
//! - scores `Sᵀ[key][query]` = keys (16 keys × 32 dims, rows of the bf16 key copy) ·
//!   query pairs (16 dim pairs × 16 queries);
//! - values `Oᵀ[dim][query]` += transposed values (16 dims × 32 keys) · weight pairs
//!   (16 key pairs × 16 queries).
//!
//! Every operand is split into two bf16 parts, `x ≈ hi + lo` (hi rounded to nearest, lo the
//! remainder rounded to nearest), and each product takes three tile products (hi·hi, hi·lo,
//! lo·hi): within 2⁻¹⁷ of each operand where bf16 alone keeps 2⁻⁹, and f16 cache values
//! exactly. Prefill attention was re-reading every cached row per query: at 4,096 tokens it
//! took over half of a prefill at ~14 GFLOP/s a core.

use super::amx::{transpose16, CONFIG, TILE};
use super::avx512::exp_ps;
use std::arch::asm;
use std::arch::x86_64::*;

/// Keys per block: four score tiles, two value steps of 32.
pub(crate) const KEYS: usize = 64;
/// Bytes of one tile (16 rows of 64 bytes).
const TB: usize = 1024;
/// The upper 16 bits of each 32-bit lane.
const HI: i32 = 0xFFFF_0000u32 as i32;
/// Interleaves the two halves of 32 16-bit elements: element `2n` from `n`, `2n + 1` from
/// `16 + n`.
static ZIP: [i16; 32] = {
    let mut z = [0i16; 32];
    let mut n = 0;
    while n < 16 {
        z[2 * n] = n as i16;
        z[2 * n + 1] = 16 + n as i16;
        n += 1;
    }
    z
};

/// One query tile's work against one KV head: the copies [`super::super::attention`]'s tile
/// path made, and the per-head state it carries between blocks.
pub(crate) struct Task {
    /// Query pairs per head, `[heads][hd / 32][16 pairs][16 queries]`, hi and lo parts.
    pub qh: *const u32,
    pub ql: *const u32,
    /// Keys, bf16 hi and lo parts, in tiles: `[kp / 16][hd / 32]` tiles of 16 keys × 32 dims.
    pub kh: *const u16,
    pub kl: *const u16,
    /// Values transposed, bf16 hi and lo parts, in tiles: `[kp / 32][vhd / 16]` tiles of 16
    /// dims × 32 keys.
    pub vh: *const u16,
    pub vl: *const u16,
    /// Key and value head dims.
    pub hd: usize,
    pub vhd: usize,
    /// Query heads sharing the KV head.
    pub heads: usize,
    /// Per query lane: the last and first key it sees (lanes in token order).
    pub pos: [i32; TILE],
    pub start: [i32; TILE],
    /// The key blocks the tile sees.
    pub b0: usize,
    pub b1: usize,
    pub scale: f32,
    /// Unnormalised values `[heads][vhd][16]`, running maxima and sums `[heads][16]`.
    pub ot: *mut f32,
    pub m: *mut f32,
    pub l: *mut f32,
    /// Scratch: scores `[KEYS][16]` f32 and weight pairs `[2 (hi, lo)][2 steps][16][16]`.
    pub st: *mut f32,
    pub pt: *mut u32,
}

/// Runs every task's key blocks `b0..b1` for every head, block by block, each block for all
/// the tasks that see it (their state starts at `m = −∞`, `l = 0`, `ot = 0`, set by the
/// caller): tasks of neighbouring query tiles share each block's keys and values while they
/// are in L2, instead of each task streaming the whole cache copy.
///
/// # Safety
/// AMX ([`super::amx::available`]), AVX-512 and its BF16 conversions; every pointer covers the
/// layout [`Task`] states, `hd` a multiple of 32, `vhd` of 64, the copies hold `b1 · KEYS` keys.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")]
pub(crate) unsafe fn run(tasks: &[Task]) {
    asm!("ldtilecfg [{}]", in(reg) CONFIG.0.as_ptr(), options(nostack, readonly));
    let first = tasks.iter().map(|t| t.b0).min().unwrap_or(0);
    let end = tasks.iter().map(|t| t.b1).max().unwrap_or(0);
    for b in first..end {
        let key0 = b * KEYS;
        for t in tasks.iter().filter(|t| (t.b0..t.b1).contains(&b)) {
            // Lanes are in token order, so lane 0 sees the fewest keys at the top and the
            // last lane the fewest at the bottom.
            let masked = key0 + KEYS - 1 > t.pos[0] as usize || key0 < t.start[TILE - 1] as usize;
            for g in 0..t.heads {
                scores(t, g, key0);
                weights(t, g, key0, masked);
                values(t, g, key0);
            }
        }
    }
    asm!("tilerelease", options(nostack, nomem));
}

/// `st = Sᵀ` for head `g` and keys `key0..key0 + 64`.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn scores(t: &Task, g: usize, key0: usize) {
    let steps = t.hd / 32;
    let (qh, ql) = ((t.qh as *const u8).add(g * steps * TB), (t.ql as *const u8).add(g * steps * TB));
    // Key tile `kt` of the block, step `s`: 1 KiB at `((key0 / 16 + kt)·steps + s)·1 KiB`.
    let at = key0 / TILE * steps * TB;
    let (kh, kl) = ((t.kh as *const u8).add(at), (t.kl as *const u8).add(at));
    asm!("tilezero tmm4", "tilezero tmm5", "tilezero tmm6", "tilezero tmm7", options(nostack, nomem));
    for s in 0..steps {
        products4(qh.add(s * TB), ql.add(s * TB), kh.add(s * TB), kl.add(s * TB), steps * TB);
    }
    sums4(t.st as *mut u8, true);
}

/// `tmm(4 + i) += A_i · B` for `i < 4` in three tile products each (hi·hi, hi·lo, lo·hi):
/// `B` the tiles at `bh`, `bl`, `A_i` those at `ah + i·next`, `al + i·next` (hi, lo parts;
/// rows of 64 bytes, one after another).
#[inline(always)]
unsafe fn products4(bh: *const u8, bl: *const u8, ah: *const u8, al: *const u8, next: usize) {
    asm!(
        "tileloadd tmm0, [{bh} + {s64}*1]",
        "tileloadd tmm1, [{bl} + {s64}*1]",
        "tileloadd tmm2, [{h} + {s64}*1]",
        "tileloadd tmm3, [{l} + {s64}*1]",
        "tdpbf16ps tmm4, tmm2, tmm0",
        "tdpbf16ps tmm4, tmm2, tmm1",
        "tdpbf16ps tmm4, tmm3, tmm0",
        "add {h}, {next}",
        "add {l}, {next}",
        "tileloadd tmm2, [{h} + {s64}*1]",
        "tileloadd tmm3, [{l} + {s64}*1]",
        "tdpbf16ps tmm5, tmm2, tmm0",
        "tdpbf16ps tmm5, tmm2, tmm1",
        "tdpbf16ps tmm5, tmm3, tmm0",
        "add {h}, {next}",
        "add {l}, {next}",
        "tileloadd tmm2, [{h} + {s64}*1]",
        "tileloadd tmm3, [{l} + {s64}*1]",
        "tdpbf16ps tmm6, tmm2, tmm0",
        "tdpbf16ps tmm6, tmm2, tmm1",
        "tdpbf16ps tmm6, tmm3, tmm0",
        "add {h}, {next}",
        "add {l}, {next}",
        "tileloadd tmm2, [{h} + {s64}*1]",
        "tileloadd tmm3, [{l} + {s64}*1]",
        "tdpbf16ps tmm7, tmm2, tmm0",
        "tdpbf16ps tmm7, tmm2, tmm1",
        "tdpbf16ps tmm7, tmm3, tmm0",
        bh = in(reg) bh,
        bl = in(reg) bl,
        h = inout(reg) ah => _,
        l = inout(reg) al => _,
        next = in(reg) next,
        s64 = in(reg) 64usize,
        options(nostack, readonly)
    );
}

/// Stores the sums tiles `tmm4..tmm7` to four consecutive tiles at `p` (`store`), or loads
/// them from there.
#[inline(always)]
unsafe fn sums4(p: *mut u8, store: bool) {
    if store {
        asm!(
            "tilestored [{p} + {s64}*1], tmm4",
            "add {p}, {tb}",
            "tilestored [{p} + {s64}*1], tmm5",
            "add {p}, {tb}",
            "tilestored [{p} + {s64}*1], tmm6",
            "add {p}, {tb}",
            "tilestored [{p} + {s64}*1], tmm7",
            p = inout(reg) p => _,
            s64 = in(reg) 64usize,
            tb = in(reg) TB,
            options(nostack)
        );
    } else {
        asm!(
            "tileloadd tmm4, [{p} + {s64}*1]",
            "add {p}, {tb}",
            "tileloadd tmm5, [{p} + {s64}*1]",
            "add {p}, {tb}",
            "tileloadd tmm6, [{p} + {s64}*1]",
            "add {p}, {tb}",
            "tileloadd tmm7, [{p} + {s64}*1]",
            p = inout(reg) p => _,
            s64 = in(reg) 64usize,
            tb = in(reg) TB,
            options(nostack, readonly)
        );
    }
}

/// Softmax step of head `g` over the scores in `st`: masks keys a query does not see,
/// raises the running maximum (rescaling the sum and values where it moved), and writes the
/// weights `exp(s − max)` as hi and lo pairs to `pt`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")]
unsafe fn weights(t: &Task, g: usize, key0: usize, masked: bool) {
    let neg = _mm512_set1_ps(f32::NEG_INFINITY);
    let scale = _mm512_set1_ps(t.scale);
    let (pos, start) = (_mm512_loadu_si512(t.pos.as_ptr() as *const _), _mm512_loadu_si512(t.start.as_ptr() as *const _));
    let mut bm = neg;
    for j in 0..KEYS {
        let p = t.st.add(j * TILE);
        let mut x = _mm512_mul_ps(_mm512_loadu_ps(p), scale);
        if masked {
            let key = _mm512_set1_epi32((key0 + j) as i32);
            let seen = _mm512_cmpge_epi32_mask(key, start) & _mm512_cmple_epi32_mask(key, pos);
            x = _mm512_mask_mov_ps(neg, seen, x);
        }
        _mm512_storeu_ps(p, x);
        bm = _mm512_max_ps(bm, x);
    }
    let (mp, lp) = (t.m.add(g * TILE), t.l.add(g * TILE));
    let old = _mm512_loadu_ps(mp);
    let new = _mm512_max_ps(old, bm);
    // Where no key has been seen yet the maximum is −∞; subtract 0 there instead (every
    // weight is then 0).
    let sub = _mm512_mask_mov_ps(new, _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(new, neg), _mm512_setzero_ps());
    let mut l = _mm512_loadu_ps(lp);
    if _mm512_cmp_ps_mask::<_CMP_NEQ_OQ>(new, old) != 0 {
        let alpha = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask::<_CMP_NEQ_OQ>(old, neg), exp_ps(_mm512_sub_ps(old, sub)));
        l = _mm512_mul_ps(l, alpha);
        let ot = t.ot.add(g * t.vhd * TILE);
        for r in 0..t.vhd {
            let p = ot.add(r * TILE);
            _mm512_storeu_ps(p, _mm512_mul_ps(_mm512_loadu_ps(p), alpha));
        }
        _mm512_storeu_ps(mp, new);
    }
    let hi = _mm512_set1_epi32(HI);
    let zip = _mm512_loadu_si512(ZIP.as_ptr() as *const _);
    // Two vectors of weights as bf16 pairs, rounded to nearest: element n holds (e[n], o[n]).
    let pairs = |e: __m512, o: __m512| _mm512_permutexvar_epi16(zip, std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(o, e)));
    let mut sum = _mm512_setzero_ps();
    for j in (0..KEYS).step_by(2) {
        let (xe, xo) = (_mm512_loadu_ps(t.st.add(j * TILE)), _mm512_loadu_ps(t.st.add((j + 1) * TILE)));
        let (mut e, mut o) = (exp_ps(_mm512_sub_ps(xe, sub)), exp_ps(_mm512_sub_ps(xo, sub)));
        if masked {
            e = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask::<_CMP_NEQ_OQ>(xe, neg), e);
            o = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask::<_CMP_NEQ_OQ>(xo, neg), o);
        }
        sum = _mm512_add_ps(sum, _mm512_add_ps(e, o));
        let h = pairs(e, o);
        let (eh, oh) = (_mm512_castsi512_ps(_mm512_slli_epi32::<16>(h)), _mm512_castsi512_ps(_mm512_and_si512(h, hi)));
        let l = pairs(_mm512_sub_ps(e, eh), _mm512_sub_ps(o, oh));
        // Row `p` of step `j / 32`: the pair (key j, key j + 1) of every query, key j low.
        let row = (j / 32) * TILE * TILE + (j % 32 / 2) * TILE;
        _mm512_storeu_si512(t.pt.add(row) as *mut _, h);
        _mm512_storeu_si512(t.pt.add(2 * TILE * TILE + row) as *mut _, l);
    }
    _mm512_storeu_ps(lp, _mm512_add_ps(l, sum));
}

/// `Oᵀ += Vᵀ · Pᵀ` for head `g` and keys `key0..key0 + 64`, four dim tiles at a time.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn values(t: &Task, g: usize, key0: usize) {
    let dtiles = t.vhd / TILE;
    let ot = (t.ot as *mut u8).add(g * t.vhd * TILE * 4);
    let (ph, pl) = (t.pt as *const u8, (t.pt as *const u8).add(2 * TB));
    for dg in 0..dtiles / 4 {
        let o = ot.add(dg * 4 * TB);
        sums4(o, false);
        for s in 0..2 {
            // Value tile (32 keys from `key0 + 32·s`, dims `16·dt ..`): 1 KiB at
            // `((key0 / 32 + s)·dtiles + dt)·1 KiB`.
            let at = ((key0 / 32 + s) * dtiles + dg * 4) * TB;
            products4(ph.add(s * TB), pl.add(s * TB), (t.vh as *const u8).add(at), (t.vl as *const u8).add(at), TB);
        }
        sums4(o, true);
    }
}

/// Writes head `g`'s normalised values for the first `valid` queries: query `n`'s row at
/// `out + n·os` (`vhd` values), with the head's sink (if any) in the denominator.
///
/// # Safety
/// AVX-512; `t.ot`, `t.m`, `t.l` as after [`run`]; `out` covers `(valid − 1)·os + vhd`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(crate) unsafe fn finish(t: &Task, g: usize, sink: Option<f32>, out: *mut f32, os: usize, valid: usize) {
    let neg = _mm512_set1_ps(f32::NEG_INFINITY);
    let (m, l) = (_mm512_loadu_ps(t.m.add(g * TILE)), _mm512_loadu_ps(t.l.add(g * TILE)));
    // A query that saw no key (l = 0) gets zeros, as the reference's empty sum.
    let f = match sink {
        Some(s) => {
            let s = _mm512_set1_ps(s);
            let top = _mm512_max_ps(m, s);
            let fac = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask::<_CMP_NEQ_OQ>(m, neg), exp_ps(_mm512_sub_ps(m, top)));
            let den = _mm512_fmadd_ps(l, fac, exp_ps(_mm512_sub_ps(s, top)));
            _mm512_maskz_div_ps(_mm512_cmp_ps_mask::<_CMP_GT_OQ>(l, _mm512_setzero_ps()), fac, den)
        }
        None => _mm512_maskz_div_ps(_mm512_cmp_ps_mask::<_CMP_GT_OQ>(l, _mm512_setzero_ps()), _mm512_set1_ps(1.0), l),
    };
    let ot = t.ot.add(g * t.vhd * TILE);
    for dt in 0..t.vhd / TILE {
        let mut r = [_mm512_setzero_ps(); TILE];
        for (i, v) in r.iter_mut().enumerate() {
            *v = _mm512_mul_ps(_mm512_loadu_ps(ot.add((dt * TILE + i) * TILE)), f);
        }
        transpose16(&mut r);
        for (n, v) in r.iter().enumerate().take(valid) {
            _mm512_storeu_ps(out.add(n * os + dt * TILE), *v);
        }
    }
}

/// 16 values as bf16 parts `hi`, `lo`, each rounded to nearest.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn halves16(x: __m512) -> (__m256i, __m256i) {
    let h: __m256i = std::mem::transmute(_mm512_cvtneps_pbh(x));
    let back = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)));
    (h, std::mem::transmute::<__m256bh, __m256i>(_mm512_cvtneps_pbh(_mm512_sub_ps(x, back))))
}

/// 32 keys' rows (`kb`: 32 rows of `hd` f32) into their tiles, hi and lo parts: `hi` and
/// `lo` are the two tiles of 16 keys for each 32-dim step (`32·hd` values).
///
/// # Safety
/// AVX-512 with BF16; `hd` a multiple of 32, `kb`, `hi` and `lo` at least `32·hd` long.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub(crate) unsafe fn split_keys(kb: &[f32], hd: usize, hi: &mut [u16], lo: &mut [u16]) {
    let steps = hd / 32;
    for i in 0..32 {
        for s in 0..steps {
            // Key i: row i % 16 of tile (i / 16, s).
            let at = ((i / TILE * steps + s) * TILE + i % TILE) * 32;
            for half in 0..2 {
                let (h, l) = halves16(_mm512_loadu_ps(kb.as_ptr().add(i * hd + s * 32 + half * 16)));
                _mm256_storeu_si256(hi.as_mut_ptr().add(at + half * 16) as *mut __m256i, h);
                _mm256_storeu_si256(lo.as_mut_ptr().add(at + half * 16) as *mut __m256i, l);
            }
        }
    }
}

/// 32 keys' value rows (`vb`: 32 rows of `vhd` f32) transposed into their tiles, hi and lo
/// parts: dim `e` of key `i` at `e·32 + i` (the tiles of 16 dims × 32 keys, in dim order).
///
/// # Safety
/// AVX-512 with BF16; `vhd` a multiple of 16, `vb`, `hi` and `lo` at least `32·vhd` long.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub(crate) unsafe fn split_values(vb: &[f32], vhd: usize, hi: &mut [u16], lo: &mut [u16]) {
    for dt in 0..vhd / TILE {
        for half in 0..2 {
            let mut r = [_mm512_setzero_ps(); TILE];
            for (k, v) in r.iter_mut().enumerate() {
                *v = _mm512_loadu_ps(vb.as_ptr().add((half * TILE + k) * vhd + dt * TILE));
            }
            transpose16(&mut r);
            for (e, v) in r.iter().enumerate() {
                let (h, l) = halves16(*v);
                let at = (dt * TILE + e) * 32 + half * TILE;
                _mm256_storeu_si256(hi.as_mut_ptr().add(at) as *mut __m256i, h);
                _mm256_storeu_si256(lo.as_mut_ptr().add(at) as *mut __m256i, l);
            }
        }
    }
}
