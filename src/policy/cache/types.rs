//! The cache's vocabulary: keys, slot ids, errors, counters and the [`Lease`] guard.

use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// One routed expert of one MoE layer: the unit that is cached, fetched or run on the CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ExpertKey {
    /// Decoder layer index.
    pub layer: u16,
    /// Expert index within the layer.
    pub expert: u32,
}

impl ExpertKey {
    /// Builds a key.
    pub const fn new(layer: u16, expert: u32) -> Self {
        ExpertKey { layer, expert }
    }
}

impl fmt::Display for ExpertKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "L{}/E{}", self.layer, self.expert)
    }
}

/// Index of a device expert slot; actor messages carry this, never a device pointer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SlotId(pub u32);

impl SlotId {
    /// The slot index as a `usize`, for offset arithmetic in the transfer engine.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for SlotId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// The most slots a cache can have: slot ids are `u32` so they stay cheap in messages.
pub const MAX_SLOTS: usize = u32::MAX as usize;

/// Why a cache operation was refused. Every refusal leaves the cache unchanged.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CacheError {
    /// The cache has no slots (CPU-only mode, or no device memory left).
    #[error("the expert cache has zero capacity")]
    ZeroCapacity,
    /// Every slot is pinned by a lease, so nothing can be evicted; run the expert on the CPU.
    #[error("all {capacity} expert cache slots are leased; nothing can be evicted")]
    AllLeased {
        /// Current capacity.
        capacity: usize,
    },
    /// The operation would vacate or overwrite a slot that a lease still pins.
    #[error("expert cache slot {slot} is leased")]
    Leased {
        /// The first pinned slot found.
        slot: SlotId,
    },
    /// The slot id is outside the current capacity.
    #[error("expert cache slot {slot} does not exist (capacity {capacity})")]
    InvalidSlot {
        /// The slot asked for.
        slot: SlotId,
        /// Current capacity.
        capacity: usize,
    },
    /// Leasing an empty slot would pin nothing useful, so it is refused.
    #[error("expert cache slot {slot} holds no expert")]
    EmptySlot {
        /// The slot asked for.
        slot: SlotId,
    },
    /// The expert is already resident; a second copy would waste a slot.
    #[error("expert {key} is already cached in slot {slot}")]
    AlreadyCached {
        /// The expert.
        key: ExpertKey,
        /// Where it lives.
        slot: SlotId,
    },
    /// More slots than a `u32` slot id can name.
    #[error("expert cache capacity {requested} exceeds the maximum of {max} slots")]
    CapacityTooLarge {
        /// Capacity asked for.
        requested: usize,
        /// [`MAX_SLOTS`].
        max: usize,
    },
}

/// Counters for `/metrics` and `ft-actor info`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheStats {
    /// `lookup` calls that found the expert.
    pub hits: u64,
    /// `lookup` calls that did not.
    pub misses: u64,
    /// Experts placed into slots.
    pub insertions: u64,
    /// Residents displaced by an insertion (LRU victims).
    pub evictions: u64,
    /// Residents dropped because a resize shrank the cache.
    pub vacated: u64,
}

impl CacheStats {
    /// Hits over lookups; 0 before the first lookup (not NaN, so it can be exported as is).
    pub fn hit_rate(&self) -> f64 {
        let total = self.hits + self.misses;
        if total == 0 {
            0.0
        } else {
            self.hits as f64 / total as f64
        }
    }
}

/// Result of a successful [`ExpertCache::insert`](super::ExpertCache::insert).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Insert {
    /// The slot the transfer engine must fill with the new expert.
    pub slot: SlotId,
    /// The expert previously in that slot, if any (its device copy is now stale).
    pub evicted: Option<ExpertKey>,
}

/// A pin on one slot; while any lease on a slot is alive the slot keeps its expert.
///
/// Dropping the lease releases the pin, from any thread, with no access to the cache. Cloning
/// adds a pin, so several consumers of one slot (e.g. tokens of a batch) can each hold one.
#[derive(Debug)]
pub struct Lease {
    slot: SlotId,
    pins: Arc<AtomicU32>,
}

impl Lease {
    pub(super) fn new(slot: SlotId, pins: &Arc<AtomicU32>) -> Lease {
        // Relaxed is enough for the increment: the cache observes it through its own &mut
        // access or through later Acquire loads, and a new pin can only come from the owner.
        pins.fetch_add(1, Ordering::Relaxed);
        Lease {
            slot,
            pins: Arc::clone(pins),
        }
    }

    /// The pinned slot.
    pub fn slot(&self) -> SlotId {
        self.slot
    }
}

impl Clone for Lease {
    fn clone(&self) -> Lease {
        Lease::new(self.slot, &self.pins)
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        // Release pairs with the Acquire in `is_pinned`: once the cache sees the pin gone, every
        // read the lease holder did through the slot happened before.
        self.pins.fetch_sub(1, Ordering::Release);
    }
}
