//! Unit tests of the expert cache.

use super::*;

fn k(layer: u16, expert: u32) -> ExpertKey {
    ExpertKey::new(layer, expert)
}

fn filled(cap: usize, keys: &[ExpertKey]) -> ExpertCache {
    let mut c = ExpertCache::new(cap).unwrap();
    for &key in keys {
        c.insert(key).unwrap();
    }
    c
}

#[test]
fn zero_capacity_refuses_inserts() {
    let mut c = ExpertCache::new(0).unwrap();
    assert_eq!(c.insert(k(0, 0)), Err(CacheError::ZeroCapacity));
    assert_eq!(c.lookup(k(0, 0)), None);
    assert!(c.peek_evictions(3).is_empty());
    assert_eq!(c.insertable(), 0);
}

#[test]
fn free_slots_fill_lowest_first_without_eviction() {
    let mut c = ExpertCache::new(3).unwrap();
    for e in 0..3 {
        let ins = c.insert(k(0, e)).unwrap();
        assert_eq!(
            ins,
            Insert {
                slot: SlotId(e),
                evicted: None
            }
        );
    }
    assert_eq!(c.len(), 3);
    assert_eq!(c.free_slots(), 0);
    assert_eq!(c.stats().evictions, 0);
}

#[test]
fn lookup_counts_and_refreshes_recency() {
    let mut c = filled(3, &[k(0, 0), k(0, 1), k(0, 2)]);
    assert_eq!(c.lookup(k(0, 0)), Some(SlotId(0)));
    assert_eq!(c.lookup(k(9, 9)), None);
    // 0 was touched, so 1 is now the oldest.
    let ins = c.insert(k(1, 7)).unwrap();
    assert_eq!(ins.evicted, Some(k(0, 1)));
    assert_eq!(ins.slot, SlotId(1));
    let s = c.stats();
    assert_eq!((s.hits, s.misses, s.insertions, s.evictions), (1, 1, 4, 1));
    assert!((s.hit_rate() - 0.5).abs() < 1e-12);
    let order: Vec<_> = c.residents().map(|(_, key)| key).collect();
    assert_eq!(order, vec![k(0, 2), k(0, 0), k(1, 7)]);
}

#[test]
fn contains_and_slot_of_do_not_touch() {
    let mut c = filled(2, &[k(0, 0), k(0, 1)]);
    assert!(c.contains(k(0, 0)));
    assert_eq!(c.slot_of(k(0, 0)), Some(SlotId(0)));
    assert_eq!(c.stats().hits + c.stats().misses, 0);
    assert_eq!(c.insert(k(0, 2)).unwrap().evicted, Some(k(0, 0)));
}

#[test]
fn leased_slots_are_never_evicted() {
    let mut c = filled(2, &[k(0, 0), k(0, 1)]);
    let lease = c.lease(SlotId(0)).unwrap();
    assert!(c.is_leased(SlotId(0)));
    assert_eq!(c.insert(k(0, 2)).unwrap().evicted, Some(k(0, 1)));
    // Slot 1 (now k(0,2)) is unpinned, so it goes next even though slot 0 is older.
    assert_eq!(c.insert(k(0, 3)).unwrap().evicted, Some(k(0, 2)));
    assert_eq!(c.key_at(SlotId(0)), Some(k(0, 0)));
    drop(lease);
    assert!(!c.is_leased(SlotId(0)));
    assert_eq!(c.insert(k(0, 4)).unwrap().evicted, Some(k(0, 0)));
}

#[test]
fn all_leased_is_an_error_and_changes_nothing() {
    let mut c = filled(2, &[k(0, 0), k(0, 1)]);
    let _a = c.lease(SlotId(0)).unwrap();
    let _b = c.lease(SlotId(1)).unwrap();
    assert_eq!(
        c.insert(k(0, 2)),
        Err(CacheError::AllLeased { capacity: 2 })
    );
    assert_eq!(c.len(), 2);
    assert!(!c.contains(k(0, 2)));
    assert_eq!(c.stats().insertions, 2);
    assert_eq!(c.insertable(), 0);
    assert_eq!(c.leased_slots(), 2);
}

#[test]
fn lease_dropped_on_another_thread_releases_the_slot() {
    let mut c = filled(1, &[k(0, 0)]);
    let lease = c.lease(SlotId(0)).unwrap();
    assert!(c.insert(k(0, 1)).is_err());
    std::thread::spawn(move || drop(lease)).join().unwrap();
    assert_eq!(c.insert(k(0, 1)).unwrap().evicted, Some(k(0, 0)));
}

#[test]
fn cloned_lease_keeps_the_pin_until_all_are_dropped() {
    let c = filled(1, &[k(0, 0)]);
    let a = c.lease(SlotId(0)).unwrap();
    let b = a.clone();
    assert_eq!(b.slot(), SlotId(0));
    drop(a);
    assert!(c.is_leased(SlotId(0)));
    drop(b);
    assert!(!c.is_leased(SlotId(0)));
}

#[test]
fn lease_rejects_bad_slots() {
    let c = filled(2, &[k(0, 0)]);
    assert_eq!(
        c.lease(SlotId(5)).unwrap_err(),
        CacheError::InvalidSlot {
            slot: SlotId(5),
            capacity: 2
        }
    );
    assert_eq!(
        c.lease(SlotId(1)).unwrap_err(),
        CacheError::EmptySlot { slot: SlotId(1) }
    );
}

#[test]
fn lookup_and_insert_with_lease() {
    let mut c = ExpertCache::new(1).unwrap();
    let (ins, lease) = c.insert_and_lease(k(2, 3)).unwrap();
    assert_eq!(lease.slot(), ins.slot);
    assert!(c.insert(k(2, 4)).is_err());
    drop(lease);
    assert!(c.lookup_and_lease(k(9, 9)).is_none());
    let hit = c.lookup_and_lease(k(2, 3)).unwrap();
    assert_eq!(hit.slot(), SlotId(0));
    assert_eq!(c.stats().hits, 1);
}

#[test]
fn duplicate_insert_is_refused() {
    let mut c = filled(2, &[k(0, 0)]);
    assert_eq!(
        c.insert(k(0, 0)),
        Err(CacheError::AlreadyCached {
            key: k(0, 0),
            slot: SlotId(0)
        })
    );
    assert_eq!(c.len(), 1);
}

#[test]
fn peek_evictions_predicts_inserts_without_mutating() {
    let mut c = filled(4, &[k(0, 0), k(0, 1), k(0, 2)]);
    c.lookup(k(0, 0));
    let _pin = c.lease(SlotId(1)).unwrap();
    // One free slot, then LRU order 2, 0 (1 is pinned).
    assert!(c.peek_evictions(1).is_empty());
    assert_eq!(c.peek_evictions(2), vec![k(0, 2)]);
    assert_eq!(c.peek_evictions(10), vec![k(0, 2), k(0, 0)]);
    let before = (c.stats(), c.residents().collect::<Vec<_>>());
    let predicted = c.peek_evictions(3);
    assert_eq!(before, (c.stats(), c.residents().collect::<Vec<_>>()));
    let actual: Vec<_> = (10..13)
        .filter_map(|e| c.insert(k(1, e)).unwrap().evicted)
        .collect();
    assert_eq!(predicted, actual);
}

#[test]
fn grow_adds_free_slots() {
    let mut c = filled(1, &[k(0, 0)]);
    assert_eq!(c.resize(3).unwrap(), Vec::<ExpertKey>::new());
    assert_eq!((c.capacity(), c.free_slots()), (3, 2));
    assert_eq!(
        c.insert(k(0, 1)).unwrap(),
        Insert {
            slot: SlotId(1),
            evicted: None
        }
    );
}

#[test]
fn shrink_vacates_high_slots_and_returns_their_keys() {
    let mut c = filled(4, &[k(0, 0), k(0, 1), k(1, 2)]);
    assert_eq!(c.resize(1).unwrap(), vec![k(0, 1), k(1, 2)]);
    assert_eq!((c.capacity(), c.len(), c.free_slots()), (1, 1, 0));
    assert!(c.contains(k(0, 0)) && !c.contains(k(1, 2)));
    assert_eq!(c.cached_in_layer(1), 0);
    assert_eq!(c.stats().vacated, 2);
    assert_eq!(
        c.insert(k(3, 3)).unwrap(),
        Insert {
            slot: SlotId(0),
            evicted: Some(k(0, 0))
        }
    );
    assert_eq!(c.resize(0).unwrap(), vec![k(3, 3)]);
    assert!(c.is_empty());
    assert_eq!(c.insert(k(0, 0)), Err(CacheError::ZeroCapacity));
}

#[test]
fn shrink_over_a_lease_changes_nothing() {
    let mut c = filled(3, &[k(0, 0), k(0, 1), k(0, 2)]);
    let lease = c.lease(SlotId(2)).unwrap();
    assert_eq!(c.resize(1), Err(CacheError::Leased { slot: SlotId(2) }));
    assert_eq!((c.capacity(), c.len()), (3, 3));
    // A lease below the cut does not block the shrink.
    assert_eq!(c.resize(3).unwrap(), vec![]);
    drop(lease);
    let low = c.lease(SlotId(0)).unwrap();
    assert_eq!(c.resize(1).unwrap(), vec![k(0, 1), k(0, 2)]);
    drop(low);
}

#[test]
fn capacity_limit_is_an_error() {
    let mut c = ExpertCache::new(1).unwrap();
    assert!(matches!(
        c.resize(MAX_SLOTS + 1),
        Err(CacheError::CapacityTooLarge { .. })
    ));
    assert_eq!(c.capacity(), 1);
}

#[test]
fn remove_frees_a_slot_but_not_a_leased_one() {
    let mut c = filled(2, &[k(0, 0), k(0, 1)]);
    let lease = c.lease(SlotId(1)).unwrap();
    assert_eq!(
        c.remove(k(0, 1)),
        Err(CacheError::Leased { slot: SlotId(1) })
    );
    drop(lease);
    assert_eq!(c.remove(k(0, 1)), Ok(Some(SlotId(1))));
    assert_eq!(c.remove(k(0, 1)), Ok(None));
    assert_eq!(c.free_slots(), 1);
    assert_eq!(
        c.insert(k(5, 5)).unwrap(),
        Insert {
            slot: SlotId(1),
            evicted: None
        }
    );
}

#[test]
fn per_layer_counts_follow_inserts_and_evictions() {
    let mut c = filled(3, &[k(0, 0), k(0, 1), k(1, 0)]);
    assert_eq!((c.cached_in_layer(0), c.cached_in_layer(1)), (2, 1));
    c.insert(k(1, 1)).unwrap(); // evicts k(0,0)
    assert_eq!((c.cached_in_layer(0), c.cached_in_layer(1)), (1, 2));
    c.reset_stats();
    assert_eq!(c.stats(), CacheStats::default());
}

/// Random operations against an obviously correct O(n) model of LRU-with-pins.
#[test]
fn matches_a_naive_model_under_random_operations() {
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let cap = 6;
    let mut c = ExpertCache::new(cap).unwrap();
    // Model: resident keys in recency order (oldest first) plus pin counts by key.
    let mut order: Vec<ExpertKey> = Vec::new();
    let mut leases: Vec<(ExpertKey, Lease)> = Vec::new();
    for _ in 0..5000 {
        let key = k((next() % 3) as u16, (next() % 6) as u32);
        match next() % 4 {
            0 | 1 => {
                let pinned = |key: &ExpertKey| leases.iter().any(|(l, _)| l == key);
                let expect = if order.contains(&key) {
                    Err(CacheError::AlreadyCached {
                        key,
                        slot: c.slot_of(key).unwrap(),
                    })
                } else if order.len() < cap {
                    Ok(None)
                } else {
                    match order.iter().position(|o| !pinned(o)) {
                        Some(i) => Ok(Some(order[i])),
                        None => Err(CacheError::AllLeased { capacity: cap }),
                    }
                };
                let got = c.insert(key).map(|ins| ins.evicted);
                assert_eq!(got, expect);
                if let Ok(ev) = got {
                    order.retain(|o| Some(*o) != ev);
                    order.push(key);
                }
            }
            2 => {
                let hit = c.lookup_and_lease(key);
                assert_eq!(hit.is_some(), order.contains(&key));
                if let Some(lease) = hit {
                    order.retain(|o| *o != key);
                    order.push(key);
                    leases.push((key, lease));
                }
            }
            _ => {
                if !leases.is_empty() {
                    let i = (next() % leases.len() as u64) as usize;
                    leases.swap_remove(i);
                }
            }
        }
        assert_eq!(c.residents().map(|(_, key)| key).collect::<Vec<_>>(), order);
    }
}
