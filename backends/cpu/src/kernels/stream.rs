//! The loop of a memory read-bandwidth probe: the wrapping sum of a `u64` slice with the
//! widest loads the CPU has and four independent accumulators, as a STREAM-style read kernel
//! does. Plain Rust (SSE2 on the baseline target) issues four 16-byte loads per cache line
//! and measured 20–22 GB/s on 2 threads of a machine whose 64-byte loads read 28 GB/s, so a
//! roofline against it flattered every kernel measured beside it.

use super::SimdLevel;

/// `Σ data` (wrapping), read at `level`'s widest loads.
pub fn stream_sum(level: SimdLevel, data: &[u64]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    match level.effective() {
        // SAFETY: `effective` confirmed the instructions; the loops stay inside `data`.
        SimdLevel::Avx512 => return unsafe { x86::sum512(data) },
        SimdLevel::Avx2 => return unsafe { x86::sum256(data) },
        _ => {}
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = level;
    scalar(data)
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

    /// 64-byte loads, four accumulators.
    ///
    /// # Safety
    /// The CPU has AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn sum512(data: &[u64]) -> u64 {
        let (mut a, mut i) = ([_mm512_setzero_si512(); 4], 0);
        let p = data.as_ptr() as *const __m512i;
        while (i + 4) * 8 <= data.len() {
            for (k, acc) in a.iter_mut().enumerate() {
                *acc = _mm512_add_epi64(*acc, _mm512_loadu_si512(p.add(i + k)));
            }
            i += 4;
        }
        let v = _mm512_add_epi64(_mm512_add_epi64(a[0], a[1]), _mm512_add_epi64(a[2], a[3]));
        data[i * 8..].iter().fold(_mm512_reduce_add_epi64(v) as u64, |s, x| s.wrapping_add(*x))
    }

    /// 32-byte loads, four accumulators.
    ///
    /// # Safety
    /// The CPU has AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn sum256(data: &[u64]) -> u64 {
        let (mut a, mut i) = ([_mm256_setzero_si256(); 4], 0);
        let p = data.as_ptr() as *const __m256i;
        while (i + 4) * 4 <= data.len() {
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
                assert_eq!(stream_sum(level, &data), want, "{level:?} len {len}");
            }
        }
    }
}
