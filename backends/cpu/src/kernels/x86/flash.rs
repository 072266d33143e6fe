//! AVX2 steps of the f32 flash attention (`kernels::attention`'s `flash` module): one block
//! of [`KEYS`] keys at a time, the scores six query rows by 16 keys a pass, the softmax
//! carried row by row, the weighted values six rows by 16 columns a pass. Also the scores of
//! the position split (`attention::split`, a decode step over a long cache) straight from the
//! cache ([`key_scores`]).
//!
//! Every (row, key) score and every (row, column) sum is one chain of operations in a fixed
//! order, whatever other rows share the pass: a row's result does not depend on which tokens
//! are tiled with it, so a prompt cut into other chunks gets the same bits.
//!
//! Safety contract of every `pub(crate) unsafe fn` here: the CPU has AVX2, FMA and F16C, and
//! the pointers cover what each function states.

use super::avx2::{exp_ps, hsum, load};
use super::{esize, BF16, F16, F32};
use std::arch::x86_64::*;

/// Keys per block.
pub(crate) const KEYS: usize = 32;

/// Query rows a pass of [`scores`] and [`pv`] takes (the last pass two or four).
pub(crate) const ROWS: usize = 6;

/// `s[r·KEYS + j] = q_r · k_j` for query rows `r < rows` (an even count) of `hd` values at
/// `q + r·hd`, and the block's keys transposed, `kt[d·KEYS + j]` ([`transpose`]).
///
/// Each score is one chain of multiply-adds over `d` in order, whatever the pass. Six rows by
/// sixteen keys keep twelve chains in flight (eight cover an FMA's latency) with eight loads
/// to every twelve multiply-adds; keys in rows with lane sums added at the end ran at ~55
/// GFLOP/s a thread, eight chains and a horizontal reduction per eight scores.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn scores(q: *const f32, rows: usize, kt: *const f32, hd: usize, s: *mut f32) {
    debug_assert!(rows.is_multiple_of(2));
    let mut r = 0;
    while r + ROWS <= rows {
        scores_r::<ROWS>(q, r, kt, hd, s);
        r += ROWS;
    }
    match rows - r {
        4 => scores_r::<4>(q, r, kt, hd, s),
        2 => scores_r::<2>(q, r, kt, hd, s),
        _ => {}
    }
}

/// [`scores`] of rows `r..r + R`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scores_r<const R: usize>(q: *const f32, r: usize, kt: *const f32, hd: usize, s: *mut f32) {
    let qr = q.add(r * hd);
    for j in (0..KEYS).step_by(16) {
        let mut a = [[_mm256_setzero_ps(); 2]; R];
        for d in 0..hd {
            let kp = kt.add(d * KEYS + j);
            let (k0, k1) = (_mm256_loadu_ps(kp), _mm256_loadu_ps(kp.add(8)));
            for (i, a) in a.iter_mut().enumerate() {
                let x = _mm256_broadcast_ss(&*qr.add(i * hd + d));
                a[0] = _mm256_fmadd_ps(x, k0, a[0]);
                a[1] = _mm256_fmadd_ps(x, k1, a[1]);
            }
        }
        for (i, a) in a.iter().enumerate() {
            let sp = s.add((r + i) * KEYS + j);
            _mm256_storeu_ps(sp, a[0]);
            _mm256_storeu_ps(sp.add(8), a[1]);
        }
    }
}

/// `kt[d·KEYS + j] = k[j·ks + d]`: a block's keys (`KEYS` rows of `hd`, a multiple of 8, a
/// row every `ks` values) transposed for [`scores`], eight by eight.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn transpose(k: *const f32, ks: usize, hd: usize, kt: *mut f32) {
    for j in (0..KEYS).step_by(8) {
        for d in (0..hd).step_by(8) {
            let r = |i: usize| _mm256_loadu_ps(k.add((j + i) * ks + d));
            let (t0, t1) = (_mm256_unpacklo_ps(r(0), r(1)), _mm256_unpackhi_ps(r(0), r(1)));
            let (t2, t3) = (_mm256_unpacklo_ps(r(2), r(3)), _mm256_unpackhi_ps(r(2), r(3)));
            let (t4, t5) = (_mm256_unpacklo_ps(r(4), r(5)), _mm256_unpackhi_ps(r(4), r(5)));
            let (t6, t7) = (_mm256_unpacklo_ps(r(6), r(7)), _mm256_unpackhi_ps(r(6), r(7)));
            let (u0, u1) = (_mm256_shuffle_ps::<0x44>(t0, t2), _mm256_shuffle_ps::<0xee>(t0, t2));
            let (u2, u3) = (_mm256_shuffle_ps::<0x44>(t1, t3), _mm256_shuffle_ps::<0xee>(t1, t3));
            let (u4, u5) = (_mm256_shuffle_ps::<0x44>(t4, t6), _mm256_shuffle_ps::<0xee>(t4, t6));
            let (u6, u7) = (_mm256_shuffle_ps::<0x44>(t5, t7), _mm256_shuffle_ps::<0xee>(t5, t7));
            let out = [
                _mm256_permute2f128_ps::<0x20>(u0, u4),
                _mm256_permute2f128_ps::<0x20>(u1, u5),
                _mm256_permute2f128_ps::<0x20>(u2, u6),
                _mm256_permute2f128_ps::<0x20>(u3, u7),
                _mm256_permute2f128_ps::<0x31>(u0, u4),
                _mm256_permute2f128_ps::<0x31>(u1, u5),
                _mm256_permute2f128_ps::<0x31>(u2, u6),
                _mm256_permute2f128_ps::<0x31>(u3, u7),
            ];
            for (c, v) in out.iter().enumerate() {
                _mm256_storeu_ps(kt.add((d + c) * KEYS + j), *v);
            }
        }
    }
}

/// One row's step of the online softmax over a block: the scores `s[..KEYS]` times `scale`,
/// of keys `lo..hi` only. Returns `None`, touching nothing, when the row sees no key of the
/// block; otherwise writes `p_j = exp(x_j − m')` over the scores (0 outside `lo..hi`), moves
/// the row's maximum `m` to `m'` and its sum `l` to `l·α + Σ p`, and returns `α = exp(m − m')`,
/// the factor the row's earlier weighted values take.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn softmax_row(s: *mut f32, scale: f32, lo: usize, hi: usize, m: &mut f32, l: &mut f32) -> Option<f32> {
    if lo >= hi {
        return None;
    }
    let sc = _mm256_set1_ps(scale);
    let none = _mm256_set1_ps(f32::NEG_INFINITY);
    let (after, before) = (_mm256_set1_epi32(lo as i32 - 1), _mm256_set1_epi32(hi as i32));
    let mut x = [_mm256_setzero_ps(); 4];
    let mut keep = [_mm256_setzero_ps(); 4];
    let mut mx = none;
    for i in 0..4 {
        let idx = _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(8 * i as i32));
        keep[i] = _mm256_castsi256_ps(_mm256_and_si256(_mm256_cmpgt_epi32(idx, after), _mm256_cmpgt_epi32(before, idx)));
        x[i] = _mm256_mul_ps(_mm256_loadu_ps(s.add(8 * i)), sc);
        mx = _mm256_max_ps(mx, _mm256_blendv_ps(none, x[i], keep[i]));
    }
    let h = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps::<1>(mx));
    let h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    let top = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
    let next = m.max(top);
    // A row that saw nothing before (m = −∞) takes α = 0: its sums so far are zero.
    let alpha = (*m - next).exp();
    let mv = _mm256_set1_ps(next);
    let mut sum = _mm256_setzero_ps();
    for i in 0..4 {
        // Masked after the exponential: the clamped polynomial gives exp(−∞) as ~1e-38.
        let p = _mm256_and_ps(exp_ps(_mm256_sub_ps(x[i], mv)), keep[i]);
        _mm256_storeu_ps(s.add(8 * i), p);
        sum = _mm256_add_ps(sum, p);
    }
    *l = *l * alpha + hsum(sum);
    *m = next;
    Some(alpha)
}

/// `o[r·vhd + c] += Σ_j p[r·KEYS + j] · v[j·vs + c]`, `j` in order, for the rows
/// `r < rows` (an even count) where `active[r]` (the others' `o` is left as it was), `vhd` a
/// multiple of 8. Six rows by 16 columns keep twelve chains in flight, eight loads to every
/// twelve multiply-adds.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn pv(p: *const f32, rows: usize, v: *const f32, vs: usize, vhd: usize, o: *mut f32, active: &[bool]) {
    debug_assert!(rows.is_multiple_of(2) && vhd.is_multiple_of(8) && active.len() >= rows);
    let mut r = 0;
    while r + ROWS <= rows {
        pv_r::<ROWS>(p, r, (v, vs), vhd, o, &active[r..r + ROWS]);
        r += ROWS;
    }
    match rows - r {
        4 => pv_r::<4>(p, r, (v, vs), vhd, o, &active[r..r + 4]),
        2 => pv_r::<2>(p, r, (v, vs), vhd, o, &active[r..r + 2]),
        _ => {}
    }
}

/// [`pv`] of rows `r..r + R`, `on` their `active` flags.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pv_r<const R: usize>(p: *const f32, r: usize, (v, vs): (*const f32, usize), vhd: usize, o: *mut f32, on: &[bool]) {
    if !on.contains(&true) {
        return;
    }
    let pr = |i: usize, j: usize| _mm256_broadcast_ss(&*p.add((r + i) * KEYS + j));
    let mut c = 0;
    while c + 16 <= vhd {
        let mut a = [[_mm256_setzero_ps(); 2]; R];
        for (i, a) in a.iter_mut().enumerate() {
            let op = o.add((r + i) * vhd + c);
            *a = [_mm256_loadu_ps(op), _mm256_loadu_ps(op.add(8))];
        }
        for j in 0..KEYS {
            let vp = v.add(j * vs + c);
            let (v0, v1) = (_mm256_loadu_ps(vp), _mm256_loadu_ps(vp.add(8)));
            for (i, a) in a.iter_mut().enumerate() {
                let pb = pr(i, j);
                a[0] = _mm256_fmadd_ps(pb, v0, a[0]);
                a[1] = _mm256_fmadd_ps(pb, v1, a[1]);
            }
        }
        for (i, a) in a.iter().enumerate() {
            if on[i] {
                let op = o.add((r + i) * vhd + c);
                _mm256_storeu_ps(op, a[0]);
                _mm256_storeu_ps(op.add(8), a[1]);
            }
        }
        c += 16;
    }
    if c < vhd {
        let mut a = [_mm256_setzero_ps(); R];
        for (i, a) in a.iter_mut().enumerate() {
            *a = _mm256_loadu_ps(o.add((r + i) * vhd + c));
        }
        for j in 0..KEYS {
            let vv = _mm256_loadu_ps(v.add(j * vs + c));
            for (i, a) in a.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(pr(i, j), vv, *a);
            }
        }
        for (i, a) in a.iter().enumerate() {
            if on[i] {
                _mm256_storeu_ps(o.add((r + i) * vhd + c), *a);
            }
        }
    }
}

/// `s[g·ls + j] = q_g · k_j` for query rows `g < rows` of `hd` values (a multiple of 8) at
/// `q + g·hd`, and `n` keys of cache code `d` read where they lie, key `j` at `k + j·ksb`:
/// the position split's scores, whose rows (one token's query heads of a KV head) are too few
/// to pay for widening and transposing the keys. Eight rows a key keep eight chains in
/// flight and widen each key vector once for all of them; the general product took two rows
/// by four keys, widening every key vector once per two rows.
///
/// # Safety
/// See the module docs; the `n` keys of `hd` values and `rows` rows of `s` are readable and
/// writable.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn key_scores(d: u8, q: *const f32, rows: usize, hd: usize, k: *const u8, ksb: usize, n: usize, s: *mut f32, ls: usize) {
    match d {
        F32 => key_scores_d::<F32>(q, rows, hd, k, ksb, n, s, ls),
        F16 => key_scores_d::<F16>(q, rows, hd, k, ksb, n, s, ls),
        _ => key_scores_d::<BF16>(q, rows, hd, k, ksb, n, s, ls),
    }
}

#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn key_scores_d<const D: u8>(q: *const f32, rows: usize, hd: usize, k: *const u8, ksb: usize, n: usize, s: *mut f32, ls: usize) {
    let mut g = 0;
    while g + 8 <= rows {
        key_scores_r::<D, 8>(q.add(g * hd), hd, k, ksb, n, s.add(g * ls), ls);
        g += 8;
    }
    if g + 4 <= rows {
        key_scores_r::<D, 4>(q.add(g * hd), hd, k, ksb, n, s.add(g * ls), ls);
        g += 4;
    }
    while g < rows {
        key_scores_r::<D, 1>(q.add(g * hd), hd, k, ksb, n, s.add(g * ls), ls);
        g += 1;
    }
}

/// [`key_scores`] of `R` rows (8, 4 or 1).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn key_scores_r<const D: u8, const R: usize>(q: *const f32, hd: usize, k: *const u8, ksb: usize, n: usize, s: *mut f32, ls: usize) {
    let es = esize(D);
    for j in 0..n {
        let kp = k.add(j * ksb);
        let mut a = [_mm256_setzero_ps(); R];
        let mut d = 0;
        while d < hd {
            let kv = load::<D>(kp.add(d * es));
            for (i, a) in a.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(_mm256_loadu_ps(q.add(i * hd + d)), kv, *a);
            }
            d += 8;
        }
        if R == 1 {
            *s.add(j) = hsum(a[0]);
            continue;
        }
        for i in (0..R).step_by(4) {
            let mut v = [0f32; 4];
            _mm_storeu_ps(v.as_mut_ptr(), sums4(a[i], a[i + 1], a[i + 2], a[i + 3]));
            for (c, v) in v.iter().enumerate() {
                *s.add((i + c) * ls + j) = *v;
            }
        }
    }
}

/// The lane sums of `a`, `b`, `c`, `d`, each `((0 + 1) + (2 + 3)) + ((4 + 5) + (6 + 7))`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn sums4(a: __m256, b: __m256, c: __m256, d: __m256) -> __m128 {
    let g = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    _mm_add_ps(_mm256_castps256_ps128(g), _mm256_extractf128_ps::<1>(g))
}
