//! Whether a layer's routed experts are copied out of the checkpoint's file mapping into
//! anonymous huge-page memory at load.
//!
//! The copy reads faster for every token (on the 12-layer Qwen3-30B-A3B-shaped models here,
//! decode 6–10 % faster in Q4_K_M, Q8_0, MXFP4 and bf16, see [`crate::model::hot`]), but it is
//! process memory the kernel cannot take back, unlike the mapped file's page cache. So a layer is copied only while the memory left available after
//! it stays above a reserve for everything loaded later (KV pool, prefix store, other
//! programs); past that the experts stay mapped, as a model larger than RAM must.

/// Smallest memory kept available after the copies.
pub const RESERVE_MIN: u64 = 2 << 30;
/// Fraction of the machine's memory kept available after the copies, where larger than
/// [`RESERVE_MIN`].
pub const RESERVE_FRACTION: f64 = 0.25;

/// Memory that must stay available once the experts are copied, on a machine of `total` bytes.
pub fn reserve(total: u64) -> u64 {
    ((total as f64 * RESERVE_FRACTION) as u64).max(RESERVE_MIN)
}

/// Whether `bytes` more of expert copies fit: `available` (the kernel's `MemAvailable`
/// now, which counts the mapped file's reclaimable page cache as available) less `bytes`
/// stays at or above [`reserve`] of `total`.
pub fn fits(bytes: u64, available: u64, total: u64) -> bool {
    available.checked_sub(bytes).is_some_and(|left| left >= reserve(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn the_reserve_is_a_quarter_of_memory_and_never_under_two_gib() {
        assert_eq!(reserve(64 * GIB), 16 * GIB);
        assert_eq!(reserve(4 * GIB), 2 * GIB);
        assert_eq!(reserve(0), 2 * GIB);
    }

    #[test]
    fn copies_stop_where_the_reserve_would_be_touched() {
        // 24 GiB machine, 23 available: a 14.5 GiB bf16 model's experts fit (8.5 left, 6 kept).
        assert!(fits(14 * GIB + GIB / 2, 23 * GIB, 24 * GIB));
        // The same machine with 18 available leaves 3.5: they stay mapped.
        assert!(!fits(14 * GIB + GIB / 2, 18 * GIB, 24 * GIB));
        // Exactly at the reserve is still a fit; one byte past is not.
        assert!(fits(17 * GIB, 23 * GIB, 24 * GIB));
        assert!(!fits(17 * GIB + 1, 23 * GIB, 24 * GIB));
        // More than is available never fits (no underflow).
        assert!(!fits(u64::MAX, 23 * GIB, 24 * GIB));
    }
}
