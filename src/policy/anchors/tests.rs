//! Tests of the anchor index.
use super::*;

fn run(start: u32, n: u32) -> Vec<u32> {
    (start..start + n).collect()
}

fn cat(parts: &[&[u32]]) -> Vec<u32> {
    parts.concat()
}

fn index() -> AnchorIndex<&'static str> {
    AnchorIndex::new(1 << 30)
}

#[test]
fn insert_and_longest_prefix_match() {
    let mut ix = index();
    let a = ix.insert(&[1, 2, 3], "a", 10, true).unwrap().id;
    let b = ix.insert(&[1, 2, 3, 4, 5], "b", 10, true).unwrap().id;
    let m = ix.longest_match(&[1, 2, 3, 4, 5, 6], false).unwrap();
    assert_eq!((m.id, m.len, *m.payload), (b, 5, "b"));
    let m = ix.longest_match(&[1, 2, 3, 4], false).unwrap();
    assert_eq!((m.id, m.len), (a, 3));
    assert!(ix.longest_match(&[1, 2], false).is_none());
    assert!(ix.longest_match(&[9], false).is_none());
    let s = ix.stats();
    assert_eq!((s.anchors, s.bytes, s.hits, s.misses), (2, 20, 2, 2));
    assert_eq!(
        ix.get(b).unwrap().prefix_hash,
        prefix_hash(&[1, 2, 3, 4, 5])
    );
    assert_ne!(prefix_hash(&[1, 2]), prefix_hash(&[2, 1]));
}

#[test]
fn two_conversations_share_system_prompt() {
    let mut ix = index();
    let sys = run(1, 50);
    let (ua, ub) = (run(100, 20), run(200, 20));
    let s = ix.insert(&sys, "sys", 1, true).unwrap().id;
    let a = ix.insert(&cat(&[&sys, &ua]), "a", 1, true).unwrap().id;
    let b = ix.insert(&cat(&[&sys, &ub]), "b", 1, true).unwrap().id;
    assert_eq!(
        ix.longest_match(&cat(&[&sys, &ub, &[7]]), false)
            .unwrap()
            .id,
        b
    );
    assert_eq!(ix.longest_match(&cat(&[&sys, &ua]), false).unwrap().id, a);
    assert_eq!(
        ix.longest_match(&cat(&[&sys, &run(300, 5)]), false)
            .unwrap()
            .id,
        s
    );
    assert_eq!(
        ix.longest_common_prefix(&cat(&[&sys, &ua[..3], &[999]])),
        53
    );
}

#[test]
fn appended_turn_reuses_previous_turn() {
    let mut ix = index();
    let t1 = run(1, 30);
    let id = ix.insert(&t1, "t1", 1, true).unwrap().id;
    let m = ix
        .longest_match(&cat(&[&t1, &run(100, 10)]), false)
        .unwrap();
    assert_eq!((m.id, m.len), (id, 30));
}

#[test]
fn truncated_tool_output_falls_back_to_anchor_before_edit() {
    let mut ix = index();
    let (t1, tool, t2) = (run(1, 20), run(100, 40), run(200, 10));
    let a1 = ix.insert(&t1, "t1", 1, true).unwrap().id;
    ix.insert(&cat(&[&t1, &tool]), "tool", 1, true).unwrap();
    ix.insert(&cat(&[&t1, &tool, &t2]), "t2", 1, true).unwrap();
    let edited = cat(&[&t1, &tool[..15], &[5000, 5001], &t2]);
    let m = ix.longest_match(&edited, false).unwrap();
    assert_eq!((m.id, m.len), (a1, 20));
    assert_eq!(ix.longest_common_prefix(&edited), 35);
}

#[test]
fn removed_thinking_block_falls_back_to_user_turn() {
    let mut ix = index();
    let (user, think, answer) = (run(1, 10), run(100, 30), run(200, 10));
    let u = ix.insert(&user, "user", 1, true).unwrap().id;
    ix.insert(&cat(&[&user, &think]), "think", 1, true).unwrap();
    ix.insert(&cat(&[&user, &think, &answer]), "answer", 1, true)
        .unwrap();
    let m = ix
        .longest_match(&cat(&[&user, &answer, &run(300, 5)]), false)
        .unwrap();
    assert_eq!((m.id, m.len), (u, 10));
}

#[test]
fn rewind_to_earlier_turn() {
    let mut ix = index();
    let (t1, t2, t3) = (run(1, 10), run(100, 10), run(200, 10));
    ix.insert(&t1, "t1", 1, true).unwrap();
    let a2 = ix.insert(&cat(&[&t1, &t2]), "t2", 1, true).unwrap().id;
    ix.insert(&cat(&[&t1, &t2, &t3]), "t3", 1, true).unwrap();
    let m = ix
        .longest_match(&cat(&[&t1, &t2, &run(900, 4)]), false)
        .unwrap();
    assert_eq!((m.id, m.len, *m.payload), (a2, 20, "t2"));
}

#[test]
fn require_snapshot_skips_anchors_without_state() {
    let mut ix = index();
    let toks = run(1, 30);
    let snap = ix.insert(&toks[..10], "snap", 1, true).unwrap().id;
    let kv_only = ix.insert(&toks[..20], "kv", 1, false).unwrap().id;
    assert_eq!(ix.longest_match(&toks, true).unwrap().id, snap);
    assert_eq!(ix.longest_match(&toks, false).unwrap().id, kv_only);
    ix.remove(snap);
    assert!(ix.longest_match(&toks, true).is_none());
}

#[test]
fn eviction_is_lru_then_shortest_prefix() {
    let mut ix = AnchorIndex::new(300);
    ix.insert(&[1], "a", 100, true).unwrap();
    ix.tick();
    ix.insert(&[2], "b", 100, true).unwrap();
    ix.tick();
    ix.insert(&[3], "c", 100, true).unwrap();
    // A hit on "a" makes "b" the least recently used.
    assert_eq!(*ix.longest_match(&[1, 9], false).unwrap().payload, "a");
    let ins = ix.insert(&[4], "d", 100, true).unwrap();
    assert_eq!(ins.evicted, vec!["b"]);
    assert!(ix.longest_match(&[2], false).is_none());

    // Same epoch: the shorter prefix goes first; both evicted payloads come back.
    let mut ix = AnchorIndex::new(300);
    ix.insert(&[1, 2, 3], "long", 100, true).unwrap();
    ix.insert(&[1], "short", 100, true).unwrap();
    ix.insert(&[1, 2], "mid", 100, true).unwrap();
    let ins = ix.insert(&[5], "big", 200, true).unwrap();
    assert_eq!(ins.evicted, vec!["short", "mid"]);
    let s = ix.stats();
    assert_eq!(
        (s.anchors, s.bytes, s.budget, s.evictions),
        (2, 300, 300, 2)
    );
    assert_eq!(ix.longest_match(&[1, 2, 3], false).unwrap().len, 3);
    // The lookup just touched "long", so the older "big" goes when the budget shrinks.
    assert_eq!(ix.set_budget(100), vec!["big"]);
}

#[test]
fn divergence_inside_compressed_edge() {
    let mut ix = index();
    let toks = run(1, 10);
    ix.insert(&toks, "full", 1, true).unwrap();
    let short = ix.insert(&toks[..2], "short", 1, true).unwrap().id;
    let prompt = [1, 2, 3, 4, 99];
    let m = ix.longest_match(&prompt, false).unwrap();
    assert_eq!((m.id, m.len), (short, 2));
    assert_eq!(ix.longest_common_prefix(&prompt), 4);
    // A prompt that ends mid-edge is not a match for the deeper anchor either.
    assert_eq!(ix.longest_match(&toks[..6], false).unwrap().len, 2);
    assert_eq!(ix.longest_common_prefix(&toks[..6]), 6);
}

#[test]
fn empty_prompt_and_empty_anchor() {
    let mut ix = index();
    ix.insert(&[1, 2], "a", 1, true).unwrap();
    assert!(ix.longest_match(&[], false).is_none());
    assert_eq!(ix.longest_common_prefix(&[]), 0);
    assert_eq!(ix.stats().misses, 1);
    assert_eq!(ix.insert(&[], "e", 1, true), Err(AnchorError::EmptyPrefix));
}

#[test]
fn anchor_larger_than_budget_is_rejected_without_side_effects() {
    let mut ix = AnchorIndex::new(50);
    ix.insert(&[1], "a", 40, true).unwrap();
    let err = ix.insert(&[2], "huge", 51, true).unwrap_err();
    assert_eq!(
        err,
        AnchorError::TooLarge {
            bytes: 51,
            budget: 50
        }
    );
    let s = ix.stats();
    assert_eq!((s.anchors, s.bytes, s.evictions), (1, 40, 0));
    assert_eq!(ix.longest_common_prefix(&[2]), 0);
}

#[test]
fn remove_prunes_and_recompresses_tree() {
    let mut ix = index();
    let toks = run(1, 10);
    let deep = ix.insert(&toks, "deep", 1, true).unwrap().id;
    let mid = ix.insert(&toks[..5], "mid", 1, true).unwrap().id;
    let other = ix
        .insert(&cat(&[&toks[..3], &[77]]), "other", 1, true)
        .unwrap()
        .id;
    assert_eq!(ix.live_nodes(), 5);
    assert_eq!(ix.remove(deep), Some("deep"));
    assert_eq!(ix.longest_common_prefix(&toks), 5);
    assert_eq!(ix.remove(other), Some("other"));
    assert_eq!(ix.live_nodes(), 2);
    assert_eq!(ix.longest_match(&toks, false).unwrap().id, mid);
    assert_eq!(ix.remove(deep), None);
    assert!(!ix.touch(deep));
    ix.remove(mid);
    assert_eq!(ix.live_nodes(), 1);
    assert_eq!(ix.stats().bytes, 0);
}

#[test]
fn reinsert_replaces_payload_and_returns_old_one() {
    let mut ix = index();
    let id = ix.insert(&[1, 2], "old", 10, false).unwrap().id;
    let ins = ix.insert(&[1, 2], "new", 30, true).unwrap();
    assert_eq!((ins.id, ins.evicted), (id, vec!["old"]));
    assert_eq!(ix.stats().bytes, 30);
    assert_eq!(*ix.longest_match(&[1, 2], true).unwrap().payload, "new");
}

#[test]
fn shared_prefix_finds_state_covering_the_longest_common_prefix() {
    let mut ix = index();
    let conv = run(1, 40);
    let id = ix.insert(&conv, "conv", 1, false).unwrap().id;
    // A rewind that diverges mid-edge still reuses every common token from that anchor.
    let edited = cat(&[&conv[..25], &[999, 998]]);
    assert_eq!(ix.shared_prefix(&edited), Some((id, 25)));
    // A prompt that is a strict prefix of a stored sequence reuses all of itself.
    assert_eq!(ix.shared_prefix(&conv[..10]), Some((id, 10)));
    // The nearest anchor below the split point is preferred (smallest state to restore).
    let short = ix.insert(&conv[..30], "short", 1, false).unwrap().id;
    assert_eq!(ix.shared_prefix(&edited), Some((short, 25)));
    assert_eq!(ix.shared_prefix(&[500, 1]), None);
    let s = ix.stats();
    assert_eq!((s.hits, s.misses), (3, 1));
}

#[test]
fn find_exact_and_ancestors() {
    let mut ix = index();
    let t = run(1, 20);
    let a = ix.insert(&t[..5], "a", 1, true).unwrap().id;
    let b = ix.insert(&t[..12], "b", 1, true).unwrap().id;
    let c = ix.insert(&t, "c", 1, true).unwrap().id;
    assert_eq!(ix.find_exact(&t[..12]), Some(b));
    assert_eq!(ix.find_exact(&t[..11]), None);
    assert_eq!(ix.find_exact(&[]), None);
    assert_eq!(ix.ancestors(&t), vec![a, b]);
    assert_eq!(ix.ancestors(&cat(&[&t, &[77]])), vec![a, b, c]);
    assert_eq!(ix.ancestors(&cat(&[&t[..7], &[77]])), vec![a]);
}

#[test]
fn eviction_order_is_oldest_then_shortest_and_payloads_can_move() {
    let mut ix: AnchorIndex<Vec<u8>> = AnchorIndex::new(1 << 20);
    let t = run(1, 20);
    let long = ix.insert(&t, vec![1], 1, true).unwrap().id;
    let short = ix.insert(&t[..4], vec![2], 1, true).unwrap().id;
    assert_eq!(ix.eviction_order().collect::<Vec<_>>(), vec![short, long]);
    ix.longest_match(&t, false);
    assert_eq!(ix.eviction_order().collect::<Vec<_>>(), vec![short, long]);
    ix.longest_match(&t[..5], false);
    assert_eq!(ix.eviction_order().collect::<Vec<_>>(), vec![long, short]);
    ix.payload_mut(long).unwrap().push(9);
    assert_eq!(ix.get(long).unwrap().payload, vec![1, 9]);
}
