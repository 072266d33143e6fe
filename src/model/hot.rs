//! Huge-page copies of the weights every decoded token reads, for the CPU backend.
//!
//! The CPU backend reads weights where they lie, in the memory-mapped checkpoint: page-cache
//! pages of 4 KiB, each a TLB entry, and the hardware prefetchers stop at every page boundary.
//! Summing a 1.5 GiB shard on 2 threads here ran at 29.7–30.9 GB/s through the file mapping
//! and 32.6–34.6 GB/s from an anonymous copy in transparent huge pages (5 alternating passes).
//! The dense weights (attention, shared experts, the output head) are read in full for every
//! token — 55 % of a Qwen3-30B-A3B-shaped model's bytes per token — so they are copied once at
//! load ([`copy`]).
//!
//! The routed experts are most of the file. Each layer's are copied together into one mapping
//! of their own ([`copy_experts`]) while [`crate::policy::host_copy`] says the memory allows;
//! otherwise they stay mapped. `ft-actor bench` (512-token prompt, 64 tokens, runs alternating
//! with the experts mapped) on the 12-layer Qwen3-30B-A3B-shaped models here, decode tokens/s
//! mapped → copied: Q4_K_M 25.9 → 27.5 (6 pairs, every pair faster), Q8_0 16.6 → 18.3,
//! MXFP4 20.6 → 21.8 (4 pairs each), the bf16 folder 10.2 → 11.2 (2 pairs); the cold prefills
//! 7–11 % faster too. The mapped pages were PMD-sized folios as well, and the GGUF expert
//! tensors' 32-byte misalignment in the file was no part of it (copies placed 32 bytes off a
//! cache line decoded as fast).

use super::weights::{ExpertWeights, HostMatrix};
use ft_backend::HostBytes;
use rayon::prelude::*;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Matrices smaller than one huge page are left where they are.
const MIN_BYTES: usize = 2 << 20;

/// Bytes copied so far by this process.
static COPIED: AtomicU64 = AtomicU64::new(0);

struct ReadOnly(memmap2::Mmap);

impl AsRef<[u8]> for ReadOnly {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// A copy of `b` in anonymous memory advised for transparent huge pages, or `None` (keep `b`)
/// when it is smaller than a huge page, the copies would pass a quarter of the available
/// memory (the mapped file's pages stay cached too until the kernel needs them), or the
/// mapping fails.
pub fn copy(b: &HostBytes) -> Option<HostBytes> {
    let len = b.len();
    if len < MIN_BYTES {
        return None;
    }
    let available = super::readahead::mem_available()?;
    let before = COPIED.fetch_add(len as u64, Ordering::Relaxed);
    if !within_budget(before, len as u64, available) {
        COPIED.fetch_sub(len as u64, Ordering::Relaxed);
        return None;
    }
    let made = (|| {
        let mut map = memmap2::MmapMut::map_anon(len).ok()?;
        // Advice only: without THP the copy still reads as fast as the mapping did.
        #[cfg(target_os = "linux")]
        let _ = map.advise(memmap2::Advice::HugePage);
        map.copy_from_slice(b.as_slice());
        HostBytes::new(Arc::new(ReadOnly(map.make_read_only().ok()?)), 0, len)
    })();
    if made.is_none() {
        COPIED.fetch_sub(len as u64, Ordering::Relaxed);
    }
    made
}

/// Start of every expert matrix in a layer's copy: a cache line, so rows that start on one
/// in the file start on one in the copy.
const ALIGN: usize = 64;

/// Expert bytes copied so far by this process.
static EXPERTS_COPIED: AtomicU64 = AtomicU64::new(0);

/// Bytes of routed experts this process has copied out of file mappings (for reports).
pub fn experts_copied() -> u64 {
    EXPERTS_COPIED.load(Ordering::Relaxed)
}

/// Copies the gate, up and down matrices of one layer's routed experts into one anonymous
/// mapping advised for transparent huge pages and points them at the copies; returns the bytes
/// copied, or 0 (all left as they were) when [`crate::policy::host_copy::fits`] says no, the
/// memory figures cannot be read, or the mapping fails. The copy runs on rayon's pool.
pub fn copy_experts(experts: &mut [ExpertWeights]) -> u64 {
    let mut mats: Vec<&mut HostMatrix> = experts.iter_mut().flat_map(|e| [&mut e.gate, &mut e.up, &mut e.down]).collect();
    let mut offsets = Vec::with_capacity(mats.len());
    let mut total = 0usize;
    for m in &mats {
        offsets.push(total);
        total = total.saturating_add(m.bytes.len().next_multiple_of(ALIGN));
    }
    let (Some(available), Some(ram)) = (super::readahead::mem_available(), super::readahead::meminfo("MemTotal")) else {
        return 0;
    };
    if total == 0 || !crate::policy::host_copy::fits(total as u64, available, ram) {
        return 0;
    }
    let Ok(mut map) = memmap2::MmapMut::map_anon(total) else { return 0 };
    // Advice only: without THP the copy is still anonymous memory, as fast as the mapping.
    #[cfg(target_os = "linux")]
    let _ = map.advise(memmap2::Advice::HugePage);
    let mut dsts = Vec::with_capacity(mats.len());
    let mut rest: &mut [u8] = &mut map;
    for m in &mats {
        let (dst, tail) = rest.split_at_mut(m.bytes.len());
        dsts.push(dst);
        let pad = tail.len().min(m.bytes.len().next_multiple_of(ALIGN) - m.bytes.len());
        rest = &mut tail[pad..];
    }
    dsts.into_par_iter().zip(mats.par_iter()).for_each(|(dst, m)| dst.copy_from_slice(m.bytes.as_slice()));
    let Ok(map) = map.make_read_only() else { return 0 };
    let owner: Arc<dyn AsRef<[u8]> + Send + Sync> = Arc::new(ReadOnly(map));
    // Views are made first and swapped in after, so a failure leaves every matrix as it was.
    let views: Option<Vec<HostBytes>> =
        mats.iter().zip(&offsets).map(|(m, &off)| HostBytes::new(Arc::clone(&owner), off, m.bytes.len())).collect();
    let Some(views) = views else { return 0 };
    for (m, v) in mats.iter_mut().zip(views) {
        m.bytes = v;
    }
    EXPERTS_COPIED.fetch_add(total as u64, Ordering::Relaxed);
    total as u64
}

/// Whether `len` more bytes, after `copied`, stay within a quarter of `available`.
fn within_budget(copied: u64, len: u64, available: u64) -> bool {
    copied.saturating_add(len) <= available / 4
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_holds_the_same_bytes_and_small_matrices_stay_put() {
        let bytes: Vec<u8> = (0..(3usize << 20)).map(|i| (i * 31 % 251) as u8).collect();
        let src = HostBytes::from_vec(bytes);
        if let Some(c) = copy(&src) {
            assert_eq!(c.as_slice(), src.as_slice());
        } else {
            // Only a machine with under 12 MiB available refuses it.
            assert!(super::super::readahead::mem_available().is_none_or(|a| a < 12 << 20));
        }
        assert!(copy(&HostBytes::from_vec(vec![1u8; 4096])).is_none());
    }

    #[test]
    fn a_layers_experts_are_copied_whole_each_matrix_on_a_cache_line() {
        let m = |seed: usize, len: usize| HostMatrix {
            bytes: HostBytes::from_vec((0..len).map(|i| (i * 7 + seed) as u8).collect()),
            dtype: ft_backend::DType::Q8_0,
            rows: 1,
            cols: 32 * len / 34,
        };
        // Lengths that are not multiples of a cache line, so every start after the first needs
        // padding.
        let mut experts: Vec<ExpertWeights> =
            (0..3).map(|e| ExpertWeights { gate: m(e, 34 * 5), up: m(e + 1, 34 * 3), down: m(e + 2, 34 * 7), biases: None }).collect();
        let before = experts.clone();
        let copied = copy_experts(&mut experts);
        let (available, ram) = (super::super::readahead::mem_available(), super::super::readahead::meminfo("MemTotal"));
        let mats = |es: &[ExpertWeights]| -> Vec<HostBytes> { es.iter().flat_map(|e| [e.gate.bytes.clone(), e.up.bytes.clone(), e.down.bytes.clone()]).collect() };
        for (a, b) in mats(&experts).iter().zip(mats(&before)) {
            assert_eq!(a.as_slice(), b.as_slice());
        }
        if copied == 0 {
            // Only a machine short of memory (or without /proc/meminfo) keeps them mapped.
            assert!(available.zip(ram).is_none_or(|(a, r)| !crate::policy::host_copy::fits(1 << 20, a, r)));
            return;
        }
        // 9 matrices of 170, 102 and 238 bytes, each rounded up to 64.
        assert_eq!(copied, 3 * (192 + 128 + 256));
        let mats = mats(&experts);
        let base = mats[0].as_slice().as_ptr() as usize;
        for (i, b) in mats.iter().enumerate() {
            assert_eq!(b.as_slice().as_ptr() as usize % ALIGN, 0, "matrix {i} starts on a cache line");
            assert!(b.as_slice().as_ptr() as usize >= base, "one mapping, in order");
        }
        assert!(experts_copied() >= copied);
        // A layer with no experts copies nothing.
        assert_eq!(copy_experts(&mut []), 0);
    }

    #[test]
    fn budget_is_a_quarter_of_the_available_memory_over_all_copies() {
        let gib = 1u64 << 30;
        assert!(within_budget(0, 3 * gib, 16 * gib));
        assert!(within_budget(3 * gib, gib, 16 * gib));
        assert!(!within_budget(3 * gib, gib + 1, 16 * gib));
        assert!(!within_budget(u64::MAX, 1, 16 * gib));
    }
}
