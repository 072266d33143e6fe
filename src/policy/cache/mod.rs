//! The expert cache slot table: which `(layer, expert)` lives in which device slot.
//!
//! Whatever device memory is left after non-expert weights, KV and scratch becomes one pool of
//! equally sized expert slots shared by every MoE layer. This module is only the bookkeeping for
//! that pool — it never touches device memory — so the cache-manager actor can own it and the
//! policy can be tested without a GPU.
//!
//! Design points:
//! - **LRU in O(log n).** Every occupied slot carries a monotonically increasing tick; a
//!   `BTreeMap<tick, slot>` orders slots by recency, so a hit, an insert and an eviction are
//!   O(log n) instead of scanning all slots.
//! - **Leases pin slots.** A kernel may still be reading a slot when its request is cancelled.
//!   A [`Lease`] holds a per-slot `Arc<AtomicU32>` pin count and releases it in `Drop`, so the
//!   lease can be dropped on any thread, without a reference to the cache, and a dropped request
//!   can never leak a pin. Leased slots are never evicted, removed or shrunk away, which also
//!   means a lease guarantees that its slot keeps holding the same expert.
//! - **Order of use within a step.** Lease the hits first (`lookup_and_lease`), then insert the
//!   misses with `insert_and_lease`; otherwise inserting the misses could evict a hit that the
//!   same step is about to compute.
//! - **Planning without mutation.** [`ExpertCache::peek_evictions`] answers "what would inserting
//!   N experts evict?" so the router can weigh a fetch against what it displaces.

mod types;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

pub use types::{CacheError, CacheStats, ExpertKey, Insert, Lease, SlotId, MAX_SLOTS};

#[derive(Debug)]
struct Slot {
    key: Option<ExpertKey>,
    /// Recency tick; meaningful only while `key` is set.
    tick: u64,
    pins: Arc<AtomicU32>,
}

impl Slot {
    fn empty() -> Slot {
        Slot {
            key: None,
            tick: 0,
            pins: Arc::new(AtomicU32::new(0)),
        }
    }

    fn is_pinned(&self) -> bool {
        self.pins.load(Ordering::Acquire) > 0
    }
}

/// The slot table: `(layer, expert) → slot`, LRU order, leases, elastic capacity.
#[derive(Debug)]
pub struct ExpertCache {
    slots: Vec<Slot>,
    index: HashMap<ExpertKey, SlotId>,
    /// Occupied slots by recency, oldest first.
    recency: BTreeMap<u64, SlotId>,
    /// Empty slots; lowest id first so residents cluster low and a later shrink vacates less.
    free: BTreeSet<u32>,
    per_layer: HashMap<u16, usize>,
    clock: u64,
    stats: CacheStats,
}

impl ExpertCache {
    /// An empty cache with `capacity` slots (0 is allowed: every expert then runs on the CPU).
    pub fn new(capacity: usize) -> Result<ExpertCache, CacheError> {
        let mut cache = ExpertCache {
            slots: Vec::new(),
            index: HashMap::new(),
            recency: BTreeMap::new(),
            free: BTreeSet::new(),
            per_layer: HashMap::new(),
            clock: 0,
            stats: CacheStats::default(),
        };
        cache.resize(capacity)?;
        Ok(cache)
    }

    /// Number of slots.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Slots a lease pins right now (0 between steps: anything else is a leak).
    pub fn leased(&self) -> usize {
        self.slots.iter().filter(|s| s.is_pinned()).count()
    }

    /// Number of occupied slots.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// True when no slot holds an expert.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// Number of empty slots.
    pub fn free_slots(&self) -> usize {
        self.free.len()
    }

    /// Counters since creation (or the last [`reset_stats`](Self::reset_stats)).
    pub fn stats(&self) -> CacheStats {
        self.stats
    }

    /// Zeroes the counters, e.g. after warm-up so metrics show the steady state.
    pub fn reset_stats(&mut self) {
        self.stats = CacheStats::default();
    }

    /// Number of resident experts of `layer`, for the prefill planner.
    pub fn cached_in_layer(&self, layer: u16) -> usize {
        self.per_layer.get(&layer).copied().unwrap_or(0)
    }

    /// Finds `key`, counting a hit or a miss; a hit becomes the most recently used slot.
    pub fn lookup(&mut self, key: ExpertKey) -> Option<SlotId> {
        match self.index.get(&key).copied() {
            Some(slot) => {
                self.stats.hits += 1;
                self.touch(slot);
                Some(slot)
            }
            None => {
                self.stats.misses += 1;
                None
            }
        }
    }

    /// [`lookup`](Self::lookup) and pin the slot in one step, so nothing can evict it between.
    pub fn lookup_and_lease(&mut self, key: ExpertKey) -> Option<Lease> {
        let slot = self.lookup(key)?;
        Some(Lease::new(slot, &self.slots[slot.index()].pins))
    }

    /// Whether `key` is resident; no recency change, no statistics (for planning).
    pub fn contains(&self, key: ExpertKey) -> bool {
        self.index.contains_key(&key)
    }

    /// Where `key` lives, without touching recency or statistics.
    pub fn slot_of(&self, key: ExpertKey) -> Option<SlotId> {
        self.index.get(&key).copied()
    }

    /// Which expert `slot` holds, if the slot exists and is occupied.
    pub fn key_at(&self, slot: SlotId) -> Option<ExpertKey> {
        self.slots.get(slot.index()).and_then(|s| s.key)
    }

    /// Whether any lease currently pins `slot` (false for a slot that does not exist).
    pub fn is_leased(&self, slot: SlotId) -> bool {
        self.slots.get(slot.index()).is_some_and(Slot::is_pinned)
    }

    /// Number of pinned slots. O(capacity): for diagnostics and step-boundary checks.
    pub fn leased_slots(&self) -> usize {
        self.slots.iter().filter(|s| s.is_pinned()).count()
    }

    /// How many experts could be inserted right now: free slots plus unpinned residents.
    /// O(capacity); the router uses it to cap the number of fetches in a step.
    pub fn insertable(&self) -> usize {
        self.free.len()
            + self
                .recency
                .values()
                .filter(|s| !self.slots[s.index()].is_pinned())
                .count()
    }

    /// Resident `(slot, expert)` pairs from least to most recently used.
    pub fn residents(&self) -> impl Iterator<Item = (SlotId, ExpertKey)> + '_ {
        self.recency
            .values()
            .filter_map(|&slot| self.slots[slot.index()].key.map(|key| (slot, key)))
    }

    /// Pins an occupied slot. The lease may be moved to and dropped on any thread.
    pub fn lease(&self, slot: SlotId) -> Result<Lease, CacheError> {
        let s = self
            .slots
            .get(slot.index())
            .ok_or(CacheError::InvalidSlot {
                slot,
                capacity: self.capacity(),
            })?;
        if s.key.is_none() {
            return Err(CacheError::EmptySlot { slot });
        }
        Ok(Lease::new(slot, &s.pins))
    }

    /// Places `key` in a free slot, else in the least recently used unpinned slot.
    ///
    /// The new resident is the most recently used. The caller fills the slot (transfer engine)
    /// before any kernel reads it; until then, lease it so it cannot be evicted.
    pub fn insert(&mut self, key: ExpertKey) -> Result<Insert, CacheError> {
        if self.slots.is_empty() {
            return Err(CacheError::ZeroCapacity);
        }
        if let Some(&slot) = self.index.get(&key) {
            return Err(CacheError::AlreadyCached { key, slot });
        }
        let (slot, evicted) = match self.free.pop_first() {
            Some(id) => (SlotId(id), None),
            None => {
                let slot = self
                    .recency
                    .values()
                    .copied()
                    .find(|s| !self.slots[s.index()].is_pinned())
                    .ok_or(CacheError::AllLeased {
                        capacity: self.capacity(),
                    })?;
                let old = self.vacate(slot);
                self.stats.evictions += 1;
                (slot, old)
            }
        };
        self.occupy(slot, key);
        self.stats.insertions += 1;
        Ok(Insert { slot, evicted })
    }

    /// [`insert`](Self::insert) and pin the new slot, so a later insert in the same step cannot
    /// evict it before its transfer completes.
    pub fn insert_and_lease(&mut self, key: ExpertKey) -> Result<(Insert, Lease), CacheError> {
        let ins = self.insert(key)?;
        let lease = Lease::new(ins.slot, &self.slots[ins.slot.index()].pins);
        Ok((ins, lease))
    }

    /// Drops `key` from the cache (e.g. its transfer failed and the slot holds garbage).
    /// Returns the slot it occupied, or `None` if it was not resident.
    pub fn remove(&mut self, key: ExpertKey) -> Result<Option<SlotId>, CacheError> {
        let Some(&slot) = self.index.get(&key) else {
            return Ok(None);
        };
        if self.slots[slot.index()].is_pinned() {
            return Err(CacheError::Leased { slot });
        }
        self.vacate(slot);
        self.free.insert(slot.0);
        Ok(Some(slot))
    }

    /// The residents that inserting `n` new experts would evict, in eviction order, without
    /// changing anything. Free slots are used first; pinned slots are skipped. If fewer than
    /// `n − free` residents are evictable, all evictable residents are returned (the remaining
    /// inserts would fail with [`CacheError::AllLeased`] or displace the newly inserted ones).
    pub fn peek_evictions(&self, n: usize) -> Vec<ExpertKey> {
        let need = n.saturating_sub(self.free.len());
        self.recency
            .values()
            .filter(|s| !self.slots[s.index()].is_pinned())
            .take(need)
            .filter_map(|s| self.slots[s.index()].key)
            .collect()
    }

    /// Changes the number of slots (elastic VRAM).
    ///
    /// Growing adds empty slots. Shrinking removes slots with id `>= new_capacity` and returns
    /// the experts they held (by slot id) so the device memory behind them can be released; if
    /// any of those slots is leased nothing changes and [`CacheError::Leased`] is returned. The
    /// engine applies resizes at step boundaries, when no lease is alive.
    pub fn resize(&mut self, new_capacity: usize) -> Result<Vec<ExpertKey>, CacheError> {
        if new_capacity > MAX_SLOTS {
            return Err(CacheError::CapacityTooLarge {
                requested: new_capacity,
                max: MAX_SLOTS,
            });
        }
        let old = self.slots.len();
        if new_capacity >= old {
            for id in old..new_capacity {
                self.slots.push(Slot::empty());
                // Lossless: new_capacity <= MAX_SLOTS.
                self.free.insert(id as u32);
            }
            return Ok(Vec::new());
        }
        if let Some(id) = (new_capacity..old).find(|&id| self.slots[id].is_pinned()) {
            return Err(CacheError::Leased {
                slot: SlotId(id as u32),
            });
        }
        let mut gone = Vec::new();
        for id in new_capacity..old {
            let slot = SlotId(id as u32);
            if let Some(key) = self.vacate(slot) {
                gone.push(key);
            }
            self.free.remove(&slot.0);
        }
        self.slots.truncate(new_capacity);
        self.stats.vacated += gone.len() as u64;
        Ok(gone)
    }

    fn next_tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    fn touch(&mut self, slot: SlotId) {
        let tick = self.next_tick();
        let s = &mut self.slots[slot.index()];
        self.recency.remove(&s.tick);
        s.tick = tick;
        self.recency.insert(tick, slot);
    }

    fn occupy(&mut self, slot: SlotId, key: ExpertKey) {
        let tick = self.next_tick();
        let s = &mut self.slots[slot.index()];
        s.key = Some(key);
        s.tick = tick;
        self.recency.insert(tick, slot);
        self.index.insert(key, slot);
        *self.per_layer.entry(key.layer).or_insert(0) += 1;
    }

    /// Empties an occupied slot's bookkeeping; the caller decides whether it becomes free.
    fn vacate(&mut self, slot: SlotId) -> Option<ExpertKey> {
        let s = &mut self.slots[slot.index()];
        let key = s.key.take()?;
        self.recency.remove(&s.tick);
        self.index.remove(&key);
        if let Some(n) = self.per_layer.get_mut(&key.layer) {
            *n -= 1;
            if *n == 0 {
                self.per_layer.remove(&key.layer);
            }
        }
        Some(key)
    }
}
