//! The E2M1 (4-bit float) types' int8 kernels: MXFP4 (E8M0 scale per 32 values) and NVFP4
//! (E4M3 scale per 16 values and a global scale), the codes widened to doubled integers by a
//! byte-table lookup.

use super::*;

/// The doubled E2M1 values as a byte table in both 128-bit lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn e2m1_table() -> __m256i {
    _mm256_broadcastsi128_si256(_mm_loadu_si128(E2M1_X2.as_ptr() as *const __m128i))
}

/// [`E2M1_OFFSET`] as a byte table in both 128-bit lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn e2m1_offset_table() -> __m256i {
    _mm256_broadcastsi128_si256(_mm_loadu_si128(E2M1_OFFSET.as_ptr() as *const __m128i))
}

/// What [`E2M1_OFFSET`] adds to every doubled E2M1 value, making it unsigned.
const OFFSET: i32 = 12;
/// The doubled E2M1 values plus [`OFFSET`]: 0..=24, an unsigned `vpmaddubsw` operand as it
/// is, so the codes' signs need not move onto the activations (two `vpsignb` a register).
const E2M1_OFFSET: [u8; 16] = {
    let mut t = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = (E2M1_X2[i] as i32 + OFFSET) as u8;
        i += 1;
    }
    t
};

/// MXFP4: `2^e · d_g · Σ (2·e2m1)·a` per block of 32 (the final `× ½` undoes the doubling).
#[inline(always)]
pub(super) unsafe fn mxfp4_blk<D: Dot, const R: usize, const N: usize>(
    w: &[*const u8; R],
    q: &[*const i8; N],
    d: &[*const f32; N],
    _a: &[*const f32; N],
    acc: &mut Acc<R, N>,
) {
    let table = e2m1_table();
    for r in 0..R {
        let p = w[r];
        let e = e8m0_to_f32(*p);
        let wv = _mm256_shuffle_epi8(table, D::nibbles(p.add(1)));
        for t in 0..N {
            let s = cvt(dot_s::<D>(wv, lda(q[t], 0)));
            acc[r][t][0] = _mm256_fmadd_ps(s, _mm256_set1_ps(e * *d[t]), acc[r][t][0]);
        }
    }
}

/// `2^e` of the E8M0 scale bytes of eight MXFP4 blocks from `p` (17 bytes apart), as f32
/// lanes, as [`e8m0_to_f32`] decodes them, in arithmetic only: `code << 23`, code 0 being
/// 2⁻¹²⁷ (bit 22 alone) and 255 a NaN (all exponent bits and bit 22). The bytes are gathered
/// into one word in general registers ([`opaque`]) and widened once.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn e8m0_x8(p: *const u8) -> __m256 {
    let mut word = 0u64;
    for b in 0..8 {
        word |= opaque(*p.add(17 * b) as u64) << (8 * b);
    }
    let mut c = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(word as i64));
    // SAFETY: an empty asm block on one vector register, as in `opaque`: the compares below
    // stay on the widened lanes, where LLVM would compare the bytes and widen the mask a
    // second time.
    std::arch::asm!("/* {0} */", inout(ymm_reg) c, options(pure, nomem, nostack, preserves_flags));
    let special = _mm256_or_si256(_mm256_cmpeq_epi32(c, _mm256_setzero_si256()), _mm256_cmpeq_epi32(c, _mm256_set1_epi32(255)));
    _mm256_castsi256_ps(_mm256_or_si256(_mm256_slli_epi32::<23>(c), _mm256_and_si256(special, _mm256_set1_epi32(1 << 22))))
}

/// What a lane adds back for offset codes that met activations summing to `s`: `−OFFSET · s`,
/// as the i32 bits the kernels add to their integer sums.
fn taken_back(s: i32) -> f32 {
    f32::from_bits((-OFFSET * s) as u32)
}

/// MXFP4's extras for one token's codes `q` (natural order, whole runs of eight blocks
/// first): per block, `−OFFSET ·` the sum of its 32 codes, as i32 bits, for [`mxfp4_oct`].
pub(crate) fn mxfp4_extras(q: &[i8], out: &mut [f32]) {
    for (o, block) in out.iter_mut().zip(q.chunks_exact(32)) {
        *o = taken_back(block.iter().map(|&v| v as i32).sum());
    }
}

/// MXFP4, eight blocks a step: the blocks' code bytes transposed by dwords
/// ([`super::dwords_4x4`]), so lane `l` of every register is block `l`, against activations in
/// [`super::blocks8_order`]; the eight registers' products add into one i32 vector and meet the
/// blocks' scales in one conversion and one multiply-add per token, where each pair of blocks
/// took one of each and a scale spread. The codes enter offset to unsigned ([`E2M1_OFFSET`])
/// and each block's sum takes back `OFFSET ·` its activations' sum ([`mxfp4_extras`], at
/// `a`): the same integers as signed codes, without the sixteen `vpsignb` a token's step took.
#[inline(always)]
pub(super) unsafe fn mxfp4_oct<D: Dot, const R: usize, const N: usize>(
    w: &[*const u8; R],
    q: &[*const i8; N],
    d: &[*const f32; N],
    a: &[*const f32; N],
    acc: &mut Acc<R, N>,
) {
    let (table, m4) = (e2m1_offset_table(), _mm256_set1_epi8(0x0f));
    for r in 0..R {
        let p = w[r];
        // Blocks b and b + 4 side by side (codes after each block's scale byte). Written out:
        // as array maps, LLVM left them a call each.
        let (mut y, mut lo, mut hi) = ([_mm256_setzero_si256(); 4], [_mm256_setzero_si256(); 4], [_mm256_setzero_si256(); 4]);
        for b in 0..4 {
            // Two whole-register loads and a blend: the upper lane read 16 bytes early lands
            // on block b + 4's codes. An insert would take a shuffle port.
            let (l, h) = (_mm256_loadu_si256(p.add(17 * b + 1) as *const __m256i), _mm256_loadu_si256(p.add(17 * b + 53) as *const __m256i));
            y[b] = _mm256_blend_epi32::<0xF0>(l, h);
        }
        let z = dwords_4x4(y);
        for i in 0..4 {
            lo[i] = _mm256_shuffle_epi8(table, _mm256_and_si256(z[i], m4));
            hi[i] = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16::<4>(z[i]), m4));
        }
        let ev = e8m0_x8(p);
        for t in 0..N {
            let sums = _mm256_add_epi32(D::blocks8_sums_u24(&lo, &hi, q[t]), _mm256_loadu_si256(a[t] as *const __m256i));
            let sums = cvt(sums);
            acc[r][t][0] = _mm256_fmadd_ps(sums, _mm256_mul_ps(ev, _mm256_loadu_ps(d[t])), acc[r][t][0]);
        }
    }
}

/// The order [`nvfp4_blk`] reads a token's int8 activations in: in each run of 64 values the
/// even-indexed ones, then the odd-indexed ones. A byte of NVFP4 holds values `2i` (low nibble)
/// and `2i + 1` (high), so 32 bytes split by one mask and one shift into the even values and
/// the odd values of 64, in the order of these activations.
pub(crate) fn nvfp4_order(q: &mut [i8]) {
    let mut tmp = [0i8; 64];
    for c in q.chunks_exact_mut(64) {
        for i in 0..32 {
            tmp[i] = c[2 * i];
            tmp[32 + i] = c[2 * i + 1];
        }
        c.copy_from_slice(&tmp);
    }
}

/// Extras [`nvfp4_blk`] reads per run of 64 values of one token.
const NVFP4_EXTRAS: usize = 16;

/// NVFP4's extras for one token's codes `q` (in [`nvfp4_order`]) and scales `d` (one per
/// [`QK`] values, natural order): per run of 64 values, 16 values. First, for lane `l` of
/// [`nvfp4_blk`]'s sums, `−OFFSET ·` the sum of the eight codes that lane meets (bytes
/// `4l..4l + 4` of both halves), as i32 bits; then the lanes' activation scales, the run's
/// first scale four times and its second four times, so the kernel reads them with one load
/// where spreading two scales over the halves took three shuffles a run and token.
pub(crate) fn nvfp4_extras(q: &[i8], d: &[f32], out: &mut [f32]) {
    for ((o, run), d) in out.chunks_exact_mut(NVFP4_EXTRAS).zip(q.chunks_exact(64)).zip(d.chunks_exact(2)) {
        let (sums, scales) = o.split_at_mut(8);
        for (l, o) in sums.iter_mut().enumerate() {
            *o = taken_back(run[4 * l..][..4].iter().chain(&run[32 + 4 * l..][..4]).map(|&v| v as i32).sum());
        }
        scales[..4].fill(d[0]);
        scales[4..].fill(d[1]);
    }
}

/// Extras per token of `kp` values (a multiple of 64) for [`nvfp4_extras`].
pub(crate) fn nvfp4_extras_len(kp: usize) -> usize {
    kp / 64 * NVFP4_EXTRAS
}

/// The 16 E4M3 scales at `p` times `global` for [`nvfp4_blk`], register `c` holding groups
/// `4c..4c + 4`, each over two lanes, equal to the reference's `e4m3_to_f32(sc) · global`.
/// E4M3 widens exactly to f16 (sign to bit 15, the other seven bits up by 7, which reads as
/// the value · 2⁻⁸, subnormals included), so `vcvtph2ps` and an exact `× 2⁸` decode them; the
/// NaN codes (±0x7f) get all five exponent bits, an f16 NaN. The f16 codes are doubled in 16
/// bits before converting (two unpacks), where spreading converted f32 took a lane-crossing
/// permute per register. `2⁸·global` is exact while finite, so one multiply by it rounds each
/// scale once, as `(v·2⁸)·global` does; where only `2⁸·global` overflows, the scales take
/// that order.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nvfp4_spread_scales(p: *const u8, global: f32) -> [__m256; 4] {
    let b = _mm256_cvtepu8_epi16(_mm_loadu_si128(p as *const __m128i));
    let mag = _mm256_and_si256(b, _mm256_set1_epi16(0x7f));
    let h = _mm256_or_si256(
        _mm256_slli_epi16::<8>(_mm256_and_si256(b, _mm256_set1_epi16(0x80))),
        _mm256_slli_epi16::<7>(mag),
    );
    let nan = _mm256_and_si256(_mm256_cmpeq_epi16(mag, _mm256_set1_epi16(0x7f)), _mm256_set1_epi16(0x7c00));
    let h = _mm256_or_si256(h, nan);
    // Lane 0: groups 0..4 (lo), 4..8 (hi); lane 1: groups 8..12, 12..16.
    let (lo, hi) = (_mm256_unpacklo_epi16(h, h), _mm256_unpackhi_epi16(h, h));
    let v = [
        _mm256_cvtph_ps(_mm256_castsi256_si128(lo)),
        _mm256_cvtph_ps(_mm256_castsi256_si128(hi)),
        _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(lo)),
        _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(hi)),
    ];
    let g256 = global * 256.0;
    if global.is_finite() && !g256.is_finite() {
        let (k, g) = (_mm256_set1_ps(256.0), _mm256_set1_ps(global));
        return [
            _mm256_mul_ps(_mm256_mul_ps(v[0], k), g),
            _mm256_mul_ps(_mm256_mul_ps(v[1], k), g),
            _mm256_mul_ps(_mm256_mul_ps(v[2], k), g),
            _mm256_mul_ps(_mm256_mul_ps(v[3], k), g),
        ];
    }
    let g = _mm256_set1_ps(g256);
    [_mm256_mul_ps(v[0], g), _mm256_mul_ps(v[1], g), _mm256_mul_ps(v[2], g), _mm256_mul_ps(v[3], g)]
}

/// NVFP4: `(e4m3(sc_g)·global) · d · Σ (2·e2m1)·a` per group of 16 (final `× ½`), 64 values a
/// step: the even values' codes (low nibbles) and the odd values' (high) meet the activations
/// of [`nvfp4_order`] and add into one i32 vector whose lane pairs are the four groups, so
/// each step converts and scales once instead of once per 32 values. The codes enter offset
/// to unsigned ([`E2M1_OFFSET`]) and each lane's sum takes back `OFFSET ·` its activations'
/// sum ([`nvfp4_extras`], at `a`, with the spread activation scales): the same integers as
/// signed codes with their signs moved onto the activations, in four instructions fewer a
/// step and token.
#[inline(always)]
pub(super) unsafe fn nvfp4_blk<D: Dot, const R: usize, const N: usize>(
    w: &[*const u8; R],
    q: &[*const i8; N],
    _d: &[*const f32; N],
    a: &[*const f32; N],
    acc: &mut Acc<R, N>,
) {
    let (table, m4) = (e2m1_offset_table(), _mm256_set1_epi8(0x0f));
    for r in 0..R {
        let p = w[r];
        let sv = nvfp4_spread_scales(p.add(4), (p as *const f32).read_unaligned());
        for c in 0..4 {
            let v = _mm256_loadu_si256(p.add(20 + 32 * c) as *const __m256i);
            let lo = _mm256_shuffle_epi8(table, _mm256_and_si256(v, m4));
            let hi = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4));
            for t in 0..N {
                // Groups 4c .. 4c + 4, each over two lanes; lanes 0..4 take activation scale
                // 2c, lanes 4..8 scale 2c + 1 (both spread in the extras).
                let e = a[t].add(NVFP4_EXTRAS * c);
                let dot = D::dot_u2(lo, lda(q[t], 64 * c), hi, lda(q[t], 64 * c + 32));
                let dot = _mm256_add_epi32(dot, _mm256_loadu_si256(e as *const __m256i));
                let scale = _mm256_mul_ps(sv[c], _mm256_loadu_ps(e.add(8)));
                acc[r][t][c & 1] = _mm256_fmadd_ps(cvt(dot), scale, acc[r][t][c & 1]);
            }
        }
    }
}
