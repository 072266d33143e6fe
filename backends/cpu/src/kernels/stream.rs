//! The loop of a memory read-bandwidth probe: the wrapping sum of a `u64` slice with the
//! widest loads the CPU has and four independent accumulators, as a STREAM-style read kernel
//! does. Plain Rust (SSE2 on the baseline target) issues four 16-byte loads per cache line
//! and measured 20–22 GB/s on 2 threads of a machine whose 64-byte loads read 28 GB/s, so a
//! roofline against it flattered every kernel measured beside it.
//!
//! [`Loads::Ahead`] adds the software prefetch the weight kernels issue (into L2, the same
//! distance ahead): on a machine whose cores each keep too few misses in flight for the memory,
//! it reads faster than plain loads (26.1 against 23.2 GB/s, 2 threads, here), and the bf16
//! kernel streamed a 622 MB matrix at 26.4 GB/s, above the plain probe. [`Loads::Streams`]
//! reads four far-apart parts of each range in turn, which keeps more misses in flight than
//! one sequential stream can: summing 1152-byte rows with that prefetch on 2 threads here,
//! one stream a thread read 32.5–34 GB/s and four 43. A roofline is the fastest of the three.

use super::SimdLevel;

/// How a probe pass reads memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Loads {
    /// Loads only; the hardware prefetchers alone run ahead.
    #[default]
    Plain,
    /// Loads, and a software prefetch into L2 of the line the kernels' distance ahead.
    Ahead,
    /// As [`Loads::Ahead`], from [`STREAM_PARTS`] equal parts of the range in turn, a KiB of
    /// each at a time.
    Streams,
}

/// Parts [`Loads::Streams`] reads in turn.
pub const STREAM_PARTS: usize = 4;

impl Loads {
    /// Every pattern, plain first.
    pub const ALL: [Loads; 3] = [Loads::Plain, Loads::Ahead, Loads::Streams];

    /// How it reads, for reports.
    pub fn describe(self) -> &'static str {
        match self {
            Loads::Plain => "plain loads",
            Loads::Ahead => "loads with an L2 prefetch 2 KiB ahead",
            Loads::Streams => "loads with an L2 prefetch 2 KiB ahead from four parts of each range in turn",
        }
    }
}

/// `Σ data` (wrapping), read at `level`'s widest loads in the pattern `loads` (the scalar
/// loop has no prefetch).
pub fn stream_sum(level: SimdLevel, loads: Loads, data: &[u64]) -> u64 {
    if loads == Loads::Streams {
        return parts_sum(level, data);
    }
    #[cfg(target_arch = "x86_64")]
    {
        let ahead = loads == Loads::Ahead;
        match level.effective() {
            // SAFETY: `effective` confirmed the instructions; the loads stay inside `data`
            // (a prefetch beyond it does not fault).
            SimdLevel::Avx512 if ahead => return unsafe { x86::sum512::<true>(data) },
            SimdLevel::Avx512 => return unsafe { x86::sum512::<false>(data) },
            SimdLevel::Avx2 if ahead => return unsafe { x86::sum256::<true>(data) },
            SimdLevel::Avx2 => return unsafe { x86::sum256::<false>(data) },
            _ => {}
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (level, loads);
    scalar(data)
}

/// [`Loads::Streams`]: a KiB of each of the [`STREAM_PARTS`] parts in turn, each piece summed
/// with the prefetch ahead (which lands further into the same part), then the tail.
fn parts_sum(level: SimdLevel, data: &[u64]) -> u64 {
    const PIECE: usize = 128;
    let part = data.len() / STREAM_PARTS / PIECE * PIECE;
    let mut sum = 0u64;
    for i in (0..part).step_by(PIECE) {
        for p in 0..STREAM_PARTS {
            sum = sum.wrapping_add(stream_sum(level, Loads::Ahead, &data[p * part + i..][..PIECE]));
        }
    }
    sum.wrapping_add(stream_sum(level, Loads::Ahead, &data[STREAM_PARTS * part..]))
}

/// Eight lanes of adds (the compiler vectorises them for the baseline target).
fn scalar(data: &[u64]) -> u64 {
    let mut acc = [0u64; 8];
    let mut chunks = data.chunks_exact(8);
    for c in &mut chunks {
        for i in 0..8 {
            acc[i] = acc[i].wrapping_add(c[i]);
        }
    }
    chunks.remainder().iter().chain(&acc).fold(0u64, |a, b| a.wrapping_add(*b))
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// The kernels' prefetch distance, in 64-byte lines.
    const AHEAD_LINES: usize = crate::kernels::x86::qdot::PF / 64;

    /// Prefetches into L2 the four lines `AHEAD_LINES` after line `i` of `p`.
    #[inline(always)]
    unsafe fn ahead(p: *const u8, i: usize) {
        for k in 0..4 {
            crate::kernels::x86::prefetch(p.wrapping_add((i + AHEAD_LINES + k) * 64));
        }
    }

    /// 64-byte loads, four accumulators; `AHEAD`: with [`ahead`].
    ///
    /// # Safety
    /// The CPU has AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn sum512<const AHEAD: bool>(data: &[u64]) -> u64 {
        let (mut a, mut i) = ([_mm512_setzero_si512(); 4], 0);
        let p = data.as_ptr() as *const __m512i;
        while (i + 4) * 8 <= data.len() {
            if AHEAD {
                ahead(p as *const u8, i);
            }
            for (k, acc) in a.iter_mut().enumerate() {
                *acc = _mm512_add_epi64(*acc, _mm512_loadu_si512(p.add(i + k)));
            }
            i += 4;
        }
        let v = _mm512_add_epi64(_mm512_add_epi64(a[0], a[1]), _mm512_add_epi64(a[2], a[3]));
        data[i * 8..].iter().fold(_mm512_reduce_add_epi64(v) as u64, |s, x| s.wrapping_add(*x))
    }

    /// 32-byte loads, four accumulators; `AHEAD`: with [`ahead`] every other step.
    ///
    /// # Safety
    /// The CPU has AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn sum256<const AHEAD: bool>(data: &[u64]) -> u64 {
        let (mut a, mut i) = ([_mm256_setzero_si256(); 4], 0);
        let p = data.as_ptr() as *const __m256i;
        while (i + 4) * 4 <= data.len() {
            if AHEAD && i % 8 == 0 {
                ahead(p as *const u8, i / 2);
            }
            for (k, acc) in a.iter_mut().enumerate() {
                *acc = _mm256_add_epi64(*acc, _mm256_loadu_si256(p.add(i + k)));
            }
            i += 4;
        }
        let v = _mm256_add_epi64(_mm256_add_epi64(a[0], a[1]), _mm256_add_epi64(a[2], a[3]));
        let mut lanes = [0u64; 4];
        _mm256_storeu_si256(lanes.as_mut_ptr() as *mut __m256i, v);
        data[i * 4..].iter().chain(&lanes).fold(0u64, |s, x| s.wrapping_add(*x))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every level gives the exact wrapping sum, including ragged tails.
    #[test]
    fn every_level_sums_exactly() {
        for len in [0usize, 1, 7, 31, 32, 33, 1000, 4099] {
            let data: Vec<u64> = (0..len as u64).map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15)).collect();
            let want = data.iter().fold(0u64, |a, b| a.wrapping_add(*b));
            for level in [SimdLevel::Scalar, SimdLevel::Avx2, SimdLevel::Avx512] {
                for loads in Loads::ALL {
                    assert_eq!(stream_sum(level, loads, &data), want, "{level:?} {loads:?} len {len}");
                }
            }
        }
    }
}
