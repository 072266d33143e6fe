//! A cache of freed scratch allocations.
//!
//! The model allocates activation buffers per op and drops them soon after; a cuMemAlloc and
//! cuMemFree for each would cost more than the kernels, and cuMemFree waits for the whole
//! device, copy streams included, which would undo the overlap of expert transfers with
//! compute. Freed scratch memory therefore goes back to this pool, by size class, and is
//! handed out again. A reused buffer is zeroed on the compute stream, after every kernel that
//! could still read its previous contents (scratch is used on the compute stream).

use std::collections::HashMap;
use std::sync::Mutex;

/// Freed scratch allocations by size class.
pub(crate) struct ScratchPool {
    inner: Mutex<Inner>,
    /// Most bytes kept; beyond it freed memory goes back to the driver.
    limit: usize,
}

#[derive(Default)]
struct Inner {
    free: HashMap<usize, Vec<u64>>,
    bytes: usize,
}

impl ScratchPool {
    /// A pool keeping at most `limit` bytes.
    pub(crate) fn new(limit: usize) -> Self {
        Self { inner: Mutex::new(Inner::default()), limit }
    }

    /// The allocation size for a request of `bytes`: a multiple of 256 and of an eighth of its
    /// highest power of two, so sizes that differ a little share a class (≤ 12.5 % slack from
    /// 2 KiB on).
    pub(crate) fn class(bytes: usize) -> usize {
        let b = bytes.max(256);
        let top = 1usize << (usize::BITS - 1 - b.leading_zeros()); // highest set bit
        let step = (top / 8).max(256);
        b.div_ceil(step).saturating_mul(step)
    }

    /// A cached allocation of exactly `class` bytes, if there is one.
    pub(crate) fn take(&self, class: usize) -> Option<u64> {
        let mut g = self.inner.lock().ok()?;
        let ptr = g.free.get_mut(&class)?.pop()?;
        g.bytes -= class;
        Some(ptr)
    }

    /// Keeps `ptr` (of `class` bytes) for reuse; `false` when the pool is full (the caller
    /// then frees it).
    pub(crate) fn give(&self, ptr: u64, class: usize) -> bool {
        let Ok(mut g) = self.inner.lock() else { return false };
        if g.bytes + class > self.limit {
            return false;
        }
        g.bytes += class;
        g.free.entry(class).or_default().push(ptr);
        true
    }

    /// Removes and returns every cached allocation (to free them when memory runs short).
    pub(crate) fn drain(&self) -> Vec<u64> {
        let Ok(mut g) = self.inner.lock() else { return Vec::new() };
        g.bytes = 0;
        g.free.drain().flat_map(|(_, v)| v).collect()
    }

    /// Bytes held for reuse.
    pub(crate) fn cached_bytes(&self) -> usize {
        self.inner.lock().map_or(0, |g| g.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::ScratchPool;

    #[test]
    fn classes_round_up_by_at_most_an_eighth() {
        assert_eq!(ScratchPool::class(0), 256);
        assert_eq!(ScratchPool::class(4), 256);
        assert_eq!(ScratchPool::class(1000), 1024);
        assert_eq!(ScratchPool::class(4096), 4096);
        assert_eq!(ScratchPool::class(4097), 4096 + 512);
        assert_eq!(ScratchPool::class(300), 512);
        assert_eq!(ScratchPool::class(2049), 2304);
        for b in [2049usize, 5000, 123_457, 8 << 20, (8 << 20) + 1] {
            let c = ScratchPool::class(b);
            assert!(c >= b && (c - b) * 8 <= c, "{b} -> {c}");
        }
    }

    #[test]
    fn reuse_by_class_and_limit() {
        let p = ScratchPool::new(4096);
        assert!(p.give(0x1000, 2048));
        assert!(p.give(0x2000, 2048));
        assert!(!p.give(0x3000, 256), "over the limit");
        assert_eq!(p.cached_bytes(), 4096);
        assert_eq!(p.take(1024), None);
        assert_eq!(p.take(2048), Some(0x2000));
        assert_eq!(p.drain(), vec![0x1000]);
        assert_eq!(p.cached_bytes(), 0);
    }
}
