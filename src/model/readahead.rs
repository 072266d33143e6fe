//! Read-ahead advice for memory-mapped weight files.
//!
//! Decode touches experts in routing order, so a cold page cache fills by page faults at
//! scattered offsets. `MADV_WILLNEED` (llama.cpp's default prefetch too) has the kernel read the
//! files in, in the background, while the engine starts. On this project's 12-layer Q4_K_M
//! model from a dropped page cache (2 runs each), the first token still came after 3.3–3.5 s
//! (the disk's rate), but the 32 tokens after it ran at 13.3–14.1 tok/s instead of 10.0–11.5.
//! It is asked only while the mapped files together fit in half of the memory available, so a
//! model larger than RAM is not read in to evict itself.

use memmap2::Mmap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes this process has asked to read ahead so far.
static ADVISED: AtomicU64 = AtomicU64::new(0);

/// Asks the kernel to read `map` (the file `path`) ahead when it fits the budget.
pub fn advise(map: &Mmap, path: &Path) {
    let len = map.len() as u64;
    let Some(available) = mem_available() else { return };
    let before = ADVISED.fetch_add(len, Ordering::Relaxed);
    if !within_budget(before, len, available) {
        ADVISED.fetch_sub(len, Ordering::Relaxed);
        tracing::debug!(file = %path.display(), len, available, "not read ahead: the mapped files exceed half the available memory");
        return;
    }
    #[cfg(unix)]
    if let Err(e) = map.advise(memmap2::Advice::WillNeed) {
        tracing::debug!(file = %path.display(), "read-ahead advice refused: {e}");
    }
}

/// Whether `len` more bytes, after `advised` already asked for, stay within half of `available`.
fn within_budget(advised: u64, len: u64, available: u64) -> bool {
    advised.saturating_add(len) <= available / 2
}

/// `MemAvailable` from `/proc/meminfo`, in bytes (`None` elsewhere).
pub(crate) fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_is_half_the_available_memory_over_all_files() {
        let gib = 1u64 << 30;
        assert!(within_budget(0, 10 * gib, 24 * gib));
        assert!(within_budget(10 * gib, 2 * gib, 24 * gib));
        assert!(!within_budget(10 * gib, 3 * gib, 24 * gib), "shards add up");
        assert!(!within_budget(0, 60 * gib, 24 * gib), "a model larger than RAM is not read ahead");
        assert!(!within_budget(u64::MAX, 1, 24 * gib));
        if cfg!(target_os = "linux") {
            assert!(mem_available().is_some_and(|b| b > 0));
        }
    }
}
