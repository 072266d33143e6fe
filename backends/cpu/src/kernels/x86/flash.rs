//! AVX2 steps of the f32 flash attention (`kernels::attention`'s `flash` module): one block
//! of [`KEYS`] keys at a time, the scores eight query rows a key ([`key_scores`], also the
//! position split's), the softmax carried row by row, the weighted values six rows by 16
//! columns a pass; keys and values read in f32 or straight from an f16/bf16 cache, widened
//! exactly in registers.
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

/// Query rows a pass of [`pv`] takes (the last pass two or four).
pub(crate) const ROWS: usize = 6;

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

/// `o[r·vhd + c] += Σ_j p[r·KEYS + j] · v_j[c]`, `j < n` in order, for the rows `r < rows`
/// (an even count) where `active[r]` (the others' `o` is left as it was), value `j` of code
/// `d` at `v + j·vsb`, `vhd` a multiple of 8. Six rows by 16 columns keep twelve chains in
/// flight, eight loads to every twelve multiply-adds; eight rows go as four and four.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn pv(d: u8, p: *const f32, rows: usize, v: *const u8, vsb: usize, n: usize, vhd: usize, o: *mut f32, active: &[bool]) {
    match d {
        F32 => pv_d::<F32>(p, rows, (v, vsb, n), vhd, o, active),
        F16 => pv_d::<F16>(p, rows, (v, vsb, n), vhd, o, active),
        _ => pv_d::<BF16>(p, rows, (v, vsb, n), vhd, o, active),
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pv_d<const D: u8>(p: *const f32, rows: usize, v: (*const u8, usize, usize), vhd: usize, o: *mut f32, active: &[bool]) {
    debug_assert!(rows.is_multiple_of(2) && vhd.is_multiple_of(8) && active.len() >= rows);
    let mut r = 0;
    while r + ROWS <= rows && rows - r != 8 {
        pv_r::<D, ROWS>(p, r, v, vhd, o, &active[r..r + ROWS]);
        r += ROWS;
    }
    while r + 4 <= rows {
        pv_r::<D, 4>(p, r, v, vhd, o, &active[r..r + 4]);
        r += 4;
    }
    if r < rows {
        pv_r::<D, 2>(p, r, v, vhd, o, &active[r..r + 2]);
    }
}

/// [`pv`] of rows `r..r + R`, `on` their `active` flags.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pv_r<const D: u8, const R: usize>(p: *const f32, r: usize, (v, vsb, n): (*const u8, usize, usize), vhd: usize, o: *mut f32, on: &[bool]) {
    if !on.contains(&true) {
        return;
    }
    let es = esize(D);
    let pr = |i: usize, j: usize| _mm256_broadcast_ss(&*p.add((r + i) * KEYS + j));
    let mut c = 0;
    while c + 16 <= vhd {
        let mut a = [[_mm256_setzero_ps(); 2]; R];
        for (i, a) in a.iter_mut().enumerate() {
            let op = o.add((r + i) * vhd + c);
            *a = [_mm256_loadu_ps(op), _mm256_loadu_ps(op.add(8))];
        }
        for j in 0..n {
            let vp = v.add(j * vsb + c * es);
            let (v0, v1) = (load::<D>(vp), load::<D>(vp.add(8 * es)));
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
        for j in 0..n {
            let vv = load::<D>(v.add(j * vsb + c * es));
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
/// `q + g·hd`, and `n` keys of code `d` read where they lie, key `j` at `k + j·ksb`: each
/// score eight lane chains over `d` in steps of 8, the lanes then added
/// `((0 + 1) + (2 + 3)) + ((4 + 5) + (6 + 7))`, in every pass. Six rows by two keys keep
/// twelve chains in flight with eight loads to every twelve multiply-adds and widen each key
/// vector once for six rows; the general product took two rows by four keys, widening every
/// key vector once per two rows.
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
    // Six rows, or four and four for eight (a pass of two keeps too few chains in flight).
    while g + ROWS <= rows && rows - g != 8 {
        key_scores_rows::<D, ROWS>(q.add(g * hd), hd, k, ksb, n, s.add(g * ls), ls);
        g += ROWS;
    }
    while g + 4 <= rows {
        key_scores_rows::<D, 4>(q.add(g * hd), hd, k, ksb, n, s.add(g * ls), ls);
        g += 4;
    }
    if g + 2 <= rows {
        key_scores_rows::<D, 2>(q.add(g * hd), hd, k, ksb, n, s.add(g * ls), ls);
        g += 2;
    }
    if g < rows {
        key_scores_rows::<D, 1>(q.add(g * hd), hd, k, ksb, n, s.add(g * ls), ls);
    }
}

/// [`key_scores`] of `R` rows, two keys a pass (`R` by 2 chains), an odd last key alone; four
/// rows (a decode step's group of eight query heads, in two passes) take three keys a pass:
/// twelve chains rather than the eight that only just cover two FMA units' latency. Decode
/// attention over 4,096 cached tokens, one thread, two builds at once on the two cores, six
/// rounds: 1.60–1.78 → 1.60–1.75 ms a call, median 1.74 → 1.66. Each score keeps its tree.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn key_scores_rows<const D: u8, const R: usize>(q: *const f32, hd: usize, k: *const u8, ksb: usize, n: usize, s: *mut f32, ls: usize) {
    let mut j = 0;
    if R == 4 {
        let kb = hd * esize(D);
        // Keys read where the cache holds them, a whole cache row apart, ask for the next
        // three keys into L1 and for the keys a block on into L2 (see `prefetch_row_ahead`);
        // a contiguous f32 copy's caller asks for its next block itself.
        let strided = ksb > kb;
        while j + 3 <= n {
            if strided {
                for jj in j..j + 3 {
                    super::prefetch_row_ahead(k, ksb, jj, kb);
                    if jj + 3 < n {
                        for line in (0..kb).step_by(64) {
                            super::prefetch_l1(k.wrapping_add((jj + 3) * ksb + line));
                        }
                    }
                }
            }
            key_scores_r::<D, R, 3>(q, hd, k, ksb, j, s, ls);
            j += 3;
        }
    }
    while j + 2 <= n {
        key_scores_r::<D, R, 2>(q, hd, k, ksb, j, s, ls);
        j += 2;
    }
    if j < n {
        key_scores_r::<D, R, 1>(q, hd, k, ksb, j, s, ls);
    }
}

/// Scores of `R` rows against keys `j0..j0 + J`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn key_scores_r<const D: u8, const R: usize, const J: usize>(q: *const f32, hd: usize, k: *const u8, ksb: usize, j0: usize, s: *mut f32, ls: usize) {
    let es = esize(D);
    let mut a = [[_mm256_setzero_ps(); J]; R];
    let mut d = 0;
    while d < hd {
        let mut kv = [_mm256_setzero_ps(); J];
        for (jj, kv) in kv.iter_mut().enumerate() {
            *kv = load::<D>(k.add((j0 + jj) * ksb + d * es));
        }
        for (i, a) in a.iter_mut().enumerate() {
            let x = _mm256_loadu_ps(q.add(i * hd + d));
            for (a, kv) in a.iter_mut().zip(&kv) {
                *a = _mm256_fmadd_ps(x, *kv, *a);
            }
        }
        d += 8;
    }
    if J == 2 {
        // Two rows' two keys in one tree: each row's pair of scores stored together.
        let mut i = 0;
        while i < R {
            let b = a[(i + 1).min(R - 1)];
            let v = sums4(a[i][0], a[i][J - 1], b[0], b[J - 1]);
            _mm_storel_pd(s.add(i * ls + j0) as *mut f64, _mm_castps_pd(v));
            if i + 1 < R {
                _mm_storeh_pd(s.add((i + 1) * ls + j0) as *mut f64, _mm_castps_pd(v));
            }
            i += 2;
        }
        return;
    }
    if J > 2 {
        // Every (row, key) chain in fours, each score the same tree.
        let mut at = 0;
        while at < R * J {
            let v = |x: usize| {
                let c = (at + x).min(R * J - 1);
                a[c / J][c % J]
            };
            let mut out = [0f32; 4];
            _mm_storeu_ps(out.as_mut_ptr(), sums4(v(0), v(1), v(2), v(3)));
            for (x, o) in out.iter().enumerate().take(R * J - at) {
                let c = at + x;
                *s.add((c / J) * ls + j0 + c % J) = *o;
            }
            at += 4;
        }
        return;
    }
    let mut i = 0;
    while i < R {
        // Four rows' sums in one tree; fewer repeat the last (the same tree per lane).
        let at = |x: usize| a[(i + x).min(R - 1)][0];
        let mut v = [0f32; 4];
        _mm_storeu_ps(v.as_mut_ptr(), sums4(at(0), at(1), at(2), at(3)));
        for (c, v) in v.iter().enumerate().take(R - i) {
            *s.add((i + c) * ls + j0) = *v;
        }
        i += 4;
    }
}

/// The lane sums of `a`, `b`, `c`, `d`, each `((0 + 1) + (2 + 3)) + ((4 + 5) + (6 + 7))`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn sums4(a: __m256, b: __m256, c: __m256, d: __m256) -> __m128 {
    let g = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    _mm_add_ps(_mm256_castps256_ps128(g), _mm256_extractf128_ps::<1>(g))
}
