//! Read-ahead of memory-mapped weight files.
//!
//! Decode touches experts in routing order, so a cold page cache fills by page faults at
//! scattered offsets. A background thread reads each mapped file in (`MADV_POPULATE_READ`, in
//! chunks) while the engine starts. `MADV_WILLNEED`, used before, reads nothing on the 6.18
//! kernel here (0 bytes more cached 12 s after advising the 4.7 GB Q4_K_M file; the populate read
//! it in 3.0–3.6 s). From a dropped page cache, that model's first token came after 2.2–3.1 s
//! and the 32 tokens after it ran at 14.3–17.9 tok/s; reading in, 1.15–1.21 s and 21.4–23.1
//! tok/s (3 alternating runs each).
//!
//! The faults of a populate read large folios (here PMD-sized; the map is advised
//! `MADV_HUGEPAGE` too), so the experts, which stay in the mapping, are read through 2 MiB
//! pages rather than the 4 KiB ones the engine's own scattered faults left.
//! It is asked only while the mapped files together fit in half of the memory available, so a
//! model larger than RAM is not read in to evict itself.

use memmap2::Mmap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Bytes this process has asked to read ahead so far.
static ADVISED: AtomicU64 = AtomicU64::new(0);

/// Bytes one populate call reads: small enough that the thread notices a dropped model soon.
const CHUNK: usize = 64 << 20;

/// Reads `map` (the file `path`) in on a background thread when it fits the budget.
pub fn advise(map: &Arc<Mmap>, path: &Path) {
    let len = map.len() as u64;
    let Some(available) = mem_available() else { return };
    let before = ADVISED.fetch_add(len, Ordering::Relaxed);
    if !within_budget(before, len, available) {
        ADVISED.fetch_sub(len, Ordering::Relaxed);
        tracing::debug!(file = %path.display(), len, available, "not read ahead: the mapped files exceed half the available memory");
        return;
    }
    #[cfg(target_os = "linux")]
    {
        // Advice only: the folios the faults read stay whatever size the kernel chooses.
        let _ = map.advise(memmap2::Advice::HugePage);
        let (map, file) = (Arc::clone(map), path.to_path_buf());
        let spawned = std::thread::Builder::new().name("ft-readahead".into()).spawn(move || populate(&map, &file));
        if spawned.is_ok() {
            return;
        }
    }
    #[cfg(unix)]
    will_need(map, path);
}

/// Faults `map` in chunk by chunk; stops once nothing else holds the map (the model is gone)
/// or the kernel refuses (before Linux 5.14: falls back to `MADV_WILLNEED`).
#[cfg(target_os = "linux")]
fn populate(map: &Arc<Mmap>, path: &Path) {
    let start = std::time::Instant::now();
    let mut off = 0;
    while off < map.len() {
        if Arc::strong_count(map) == 1 {
            tracing::debug!(file = %path.display(), off, "read-ahead stopped: the model was dropped");
            return;
        }
        let n = CHUNK.min(map.len() - off);
        if let Err(e) = map.advise_range(memmap2::Advice::PopulateRead, off, n) {
            tracing::debug!(file = %path.display(), off, "populate refused ({e}): asking for read-ahead instead");
            will_need(map, path);
            return;
        }
        off += n;
    }
    tracing::debug!(file = %path.display(), bytes = map.len(), secs = start.elapsed().as_secs_f64(), "read in");
}

#[cfg(unix)]
fn will_need(map: &Mmap, path: &Path) {
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
    meminfo("MemAvailable")
}

/// Field `key` (`MemTotal`, `MemAvailable`, …) of `/proc/meminfo`, in bytes (`None` elsewhere).
pub(crate) fn meminfo(key: &str) -> Option<u64> {
    ft_backend_cpu::meminfo_kib(&format!("{key}:")).map(|kib| kib * 1024)
}

/// Field `field` (`Rss`, `AnonHugePages`, …) of the mapping that starts at `addr`, in KiB, from
/// `/proc/self/smaps` (`None` elsewhere or when there is no such mapping).
pub(crate) fn mapping_kib(addr: usize, field: &str) -> Option<u64> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let head = format!("{addr:x}-");
    let key = format!("{field}:");
    // The mapping's field lines (`Name:  value`) up to the next mapping's header.
    let line = smaps
        .lines()
        .skip_while(|l| !l.starts_with(&head))
        .skip(1)
        .take_while(|l| l.split_whitespace().next().is_some_and(|f| f.ends_with(':')))
        .find(|l| l.starts_with(&key))?;
    line.split_whitespace().nth(1)?.parse().ok()
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
            let total = meminfo("MemTotal");
            assert!(total.is_some_and(|t| mem_available().is_some_and(|a| a <= t)), "{total:?}");
            assert_eq!(meminfo("Mem"), None, "a key is matched whole");
        }
    }

    /// The background thread faults the whole file into the mapping (nothing here touches
    /// it), and lets go of the map once it is done.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_mapped_file_is_read_in_without_being_touched() {
        let dir = std::env::temp_dir().join(format!("ft-readahead-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("weights.bin");
        let len = CHUNK + (3 << 20);
        std::fs::write(&path, vec![7u8; len]).expect("write");
        let file = std::fs::File::open(&path).expect("open");
        // SAFETY: a private temporary file nobody else writes.
        let map = Arc::new(unsafe { Mmap::map(&file) }.expect("map"));
        let addr = map.as_ptr() as usize;
        assert_eq!(mapping_kib(addr, "Rss"), Some(0), "nothing was read yet");
        advise(&map, &path);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while mapping_kib(addr, "Rss").is_some_and(|kib| kib < len as u64 / 1024) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(mapping_kib(addr, "Rss"), Some(len as u64 / 1024), "the whole file is resident");
        while Arc::strong_count(&map) > 1 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(Arc::strong_count(&map), 1, "the reader let go of the map");
        drop(map);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
