//! Per-sequence state snapshots: taken after N tokens and restored later (into a state that
//! has meanwhile run something else), a sequence continues exactly as if never interrupted.
//! Covered for every kind of layer state: KV caches (full and sliding), the MLA latent
//! cache and the hybrid models' convolution + recurrent state.

use crate::common::*;
use ft_actor::kv::SequenceState;
use ft_actor::model::{Logits, Model};

/// Greedy continuation: the logits of feeding `tail` (one forward) and then `steps` greedy
/// tokens one at a time.
fn continue_greedy(model: &Model, state: &mut SequenceState, tail: &[u32], steps: usize) -> Vec<Vec<f32>> {
    let mut out = vec![model.forward(state, tail, Logits::Last).unwrap()];
    for _ in 0..steps {
        let next = argmax(out.last().unwrap());
        out.push(model.forward(state, &[next], Logits::Last).unwrap());
    }
    out
}

fn check_snapshot_resume(name: &str) {
    let model = load(name);
    let r = reference_json(name);
    let ids = &prompts(&r)[1];
    let (head, tail) = ids.split_at(7);
    let steps = 6;

    // Uninterrupted: head, then tail and greedy steps.
    let mut a = SequenceState::new(&model, ids.len() + steps).unwrap();
    model.forward(&mut a, head, Logits::None).unwrap();
    let snap = a.snapshot().unwrap();
    assert_eq!(snap.len(), head.len());
    assert!(snap.size_bytes() > 0);
    let want = continue_greedy(&model, &mut a, tail, steps);

    // Interrupted: another state (larger) runs unrelated tokens, then takes the snapshot over.
    let mut b = SequenceState::new(&model, ids.len() + steps + 40).unwrap();
    let other = &prompts(&r)[2];
    model.forward(&mut b, &other[..20], Logits::None).unwrap();
    b.restore(&snap).unwrap();
    assert_eq!(b.len(), head.len());
    let got = continue_greedy(&model, &mut b, tail, steps);
    for (s, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g, w, "{name}: step {s} after restore differs from the uninterrupted run");
    }

    // The original state, rewound by restoring its own snapshot, also continues identically.
    a.restore(&snap).unwrap();
    let again = continue_greedy(&model, &mut a, tail, steps);
    assert_eq!(again, want, "{name}: rewinding by snapshot");

    // A snapshot moved to host memory (as anchors are when device room runs out) restores
    // to the same state, and so does one downloaded straight to the host.
    a.restore(&snap).unwrap();
    let mut host = a.snapshot().unwrap();
    host.move_to_host(model.backend()).unwrap();
    assert!(!host.on_device());
    let mut e = SequenceState::new(&model, ids.len() + steps).unwrap();
    e.restore(&host).unwrap();
    assert_eq!(continue_greedy(&model, &mut e, tail, steps), want, "{name}: host snapshot");
    let mut a2 = SequenceState::new(&model, ids.len() + steps).unwrap();
    model.forward(&mut a2, head, Logits::None).unwrap();
    let direct = a2.snapshot_to_host().unwrap();
    // In host memory only the rows are kept; on the device, the whole pages holding them.
    assert!(direct.size_bytes() > 0 && direct.size_bytes() <= snap.size_bytes(), "{name}");
    assert_eq!(a2.snapshot_bytes(), snap.size_bytes());
    e.restore(&direct).unwrap();
    assert_eq!(continue_greedy(&model, &mut e, tail, steps), want, "{name}: direct host snapshot");

    // A longer attention-only snapshot serves any shorter prefix; recurrent state cannot be cut.
    let mut long = SequenceState::new(&model, ids.len() + steps).unwrap();
    model.forward(&mut long, &ids[..ids.len() - 1], Logits::None).unwrap();
    let long_snap = long.snapshot().unwrap();
    let mut f = SequenceState::new(&model, ids.len() + steps).unwrap();
    if f.has_recurrent_layers() {
        assert!(f.restore_prefix(&long_snap, head.len()).is_err());
    } else {
        f.restore_prefix(&long_snap, head.len()).unwrap();
        assert_eq!(f.len(), head.len());
        // The kept keys were computed in a longer chunk, so sums may round differently: close,
        // not bit-identical.
        for (s, (g, w)) in continue_greedy(&model, &mut f, tail, steps).iter().zip(&want).enumerate() {
            let d = max_abs_diff(g, w);
            assert!(d <= 1e-4, "{name}: step {s} after restoring a prefix differs by {d}");
        }
    }

    // And resuming with a multi-token chunk agrees with one pass over the whole prompt.
    let mut c = SequenceState::new(&model, ids.len()).unwrap();
    let full = model.forward(&mut c, ids, Logits::Last).unwrap();
    let d = max_abs_diff(&want[0], &full);
    assert!(d <= 1e-4, "{name}: resumed prefill vs one pass differs by {d}");
}

#[test]
fn hybrid_qwen3_next_resumes_from_a_snapshot() {
    check_snapshot_resume("qwen3_next");
}

#[test]
fn hybrid_qwen3_5_moe_resumes_from_a_snapshot() {
    check_snapshot_resume("qwen3_5_moe");
}

#[test]
fn mla_deepseek_v3_resumes_from_a_snapshot() {
    check_snapshot_resume("deepseek_v3");
}

#[test]
fn sliding_window_gpt_oss_resumes_from_a_snapshot() {
    check_snapshot_resume("gpt_oss");
}

#[test]
fn attention_qwen3_moe_resumes_from_a_snapshot() {
    check_snapshot_resume("qwen3_moe");
}

#[test]
fn recurrent_state_refuses_to_roll_back_but_attention_caches_do() {
    let r = reference_json("qwen3_next");
    let ids = &prompts(&r)[1];
    let model = load("qwen3_next");
    let mut s = SequenceState::new(&model, ids.len()).unwrap();
    model.forward(&mut s, ids, Logits::None).unwrap();
    assert!(s.has_recurrent_layers());
    let e = s.truncate(3).unwrap_err().to_string();
    assert!(e.contains("snapshot"), "{e}");
    s.truncate(ids.len()).unwrap();
    assert_eq!(s.len(), ids.len());

    let model = load("deepseek_v3");
    let mut s = SequenceState::new(&model, ids.len()).unwrap();
    model.forward(&mut s, ids, Logits::None).unwrap();
    s.truncate(3).unwrap();
    assert_eq!(s.len(), 3);
}

#[test]
fn a_snapshot_only_restores_into_a_matching_state() {
    let r = reference_json("qwen3_next");
    let ids = &prompts(&r)[0];
    let hybrid = load("qwen3_next");
    let mut s = SequenceState::new(&hybrid, ids.len()).unwrap();
    hybrid.forward(&mut s, ids, Logits::None).unwrap();
    let snap = s.snapshot().unwrap();

    // Too small a context for it.
    let mut small = SequenceState::new(&hybrid, ids.len() - 1).unwrap();
    assert!(small.restore(&snap).is_err());
    // Another model's state.
    let mla = load("deepseek_v3");
    let mut other = SequenceState::new(&mla, ids.len()).unwrap();
    let e = other.restore(&snap).unwrap_err().to_string();
    assert!(e.contains("snapshot"), "{e}");
    assert_eq!(other.len(), 0);
}

/// Per-token caches take pages as tokens arrive: a sequence that runs past several pages (in
/// one prefill, and one token at a time) gives the logits of the same tokens fed to a state
/// whose pages were all taken up front, within 1e-4; it holds exactly the pages its tokens
/// fill; a snapshot of it restores into a fresh one.
#[test]
fn caches_grow_as_tokens_arrive_and_change_nothing() {
    use ft_actor::kv::PAGE_ROWS;
    for name in ["qwen3_moe", "deepseek_v3", "gpt_oss", "qwen3_next"] {
        let model = load(name);
        let vocab = model.config().vocab_size as u32;
        let ids: Vec<u32> = (0..4 * PAGE_ROWS as u32 + 40).map(|i| (i * 7 + 3) % vocab).collect();
        let cap = ids.len() + 8;
        let pages = |s: &SequenceState| s.pages().expect("paged").table().len();
        // Grown: 200 tokens, then one at a time past the pool's first buffers.
        let mut grown = SequenceState::new(&model, cap).unwrap();
        assert_eq!(pages(&grown), 0, "{name}: a fresh state holds no page");
        model.forward(&mut grown, &ids[..200], Logits::None).unwrap();
        assert_eq!(pages(&grown), 200usize.div_ceil(PAGE_ROWS));
        let mut step_logits = vec![];
        for &t in &ids[200..] {
            step_logits.push(model.forward(&mut grown, &[t], Logits::Last).unwrap());
        }
        assert_eq!(pages(&grown), ids.len().div_ceil(PAGE_ROWS), "{name}: pages for the tokens, no more");
        // Never grown: all rows reserved before the first token.
        let mut whole = SequenceState::new(&model, cap).unwrap();
        whole.reserve(cap).unwrap();
        let all = model.forward(&mut whole, &ids, Logits::All).unwrap();
        let v = vocab as usize;
        for (i, l) in step_logits.iter().enumerate() {
            let want = &all[(200 + i) * v..(201 + i) * v];
            let d = max_abs_diff(l, want);
            assert!(d <= 1e-4, "{name}: token {} logits differ by {d} after growing", 200 + i);
        }
        // A snapshot of the grown state resumes in a fresh, small one.
        let snap = grown.snapshot().unwrap();
        let mut fresh = SequenceState::new(&model, cap).unwrap();
        fresh.restore(&snap).unwrap();
        assert!(fresh.allocated() >= ids.len());
        let next = [5u32];
        let a = model.forward(&mut fresh, &next, Logits::Last).unwrap();
        let b = model.forward(&mut grown, &next, Logits::Last).unwrap();
        assert!(max_abs_diff(&a, &b) <= 1e-6, "{name}: restored state differs");
        // Past the capacity: a typed error, the state untouched.
        let before = grown.len();
        assert!(grown.reserve(cap + 1).is_err());
        assert_eq!(grown.len(), before);
    }
}

/// An f16 cache's snapshot (on the device and in host memory) restores into an f16 state and
/// continues exactly as the uninterrupted f16 run, taking half the bytes of an f32 one; it is
/// refused by an f32 state rather than misread.
#[test]
fn a_narrow_cache_snapshot_keeps_its_type() {
    use ft_backend::DType;
    for name in ["qwen3_moe", "deepseek_v3", "qwen3_5_moe"] {
        let model = load(name);
        let ids = &prompts(&reference_json(name))[1];
        let (head, tail) = ids.split_at(7);
        let f16 = |cap: usize| SequenceState::with_rows(&model, cap, 256, DType::F16).unwrap();
        let mut a = f16(ids.len() + 6);
        model.forward(&mut a, head, Logits::None).unwrap();
        let snap = a.snapshot().unwrap();
        let want = continue_greedy(&model, &mut a, tail, 6);
        let mut f32_state = SequenceState::new(&model, ids.len() + 6).unwrap();
        model.forward(&mut f32_state, head, Logits::None).unwrap();
        let wide = f32_state.snapshot().unwrap();
        assert!(snap.size_bytes() < wide.size_bytes(), "{name}: {} vs {}", snap.size_bytes(), wide.size_bytes());
        let mut host = f16(ids.len() + 6);
        model.forward(&mut host, head, Logits::None).unwrap();
        let mut host = host.snapshot().unwrap();
        host.move_to_host(model.backend()).unwrap();
        for s in [&snap, &host] {
            let mut b = f16(ids.len() + 40);
            b.restore(s).unwrap();
            assert_eq!(continue_greedy(&model, &mut b, tail, 6), want, "{name}");
            let mut c = SequenceState::new(&model, ids.len() + 6).unwrap();
            let e = c.restore(s).expect_err("an f32 state refuses an f16 snapshot");
            assert!(e.to_string().contains("cache type"), "{e}");
        }
    }
}

/// Pages are shared, not copied: in one pool, a snapshot takes no page of its own, a state
/// restored from it takes none either and writes its next token into a copy of the shared
/// last page only, both continue exactly as the uninterrupted sequence, and every page is
/// free again once the states and the snapshot are gone. Moved to host memory the snapshot
/// gives its pages back and still restores. Pages of 4 rows, so a sequence spans several;
/// f32 caches of every kind of layer, and a Q8_0 one (rows of whole blocks).
#[test]
fn snapshots_share_pages_and_copy_on_write() {
    use ft_actor::kv::{pages::lock, PagePool};
    use ft_backend::DType;
    let cases = [("qwen3_moe", DType::F32), ("deepseek_v3", DType::F32), ("gpt_oss", DType::F32), ("qwen3_next", DType::F32), ("qwen3_moe", DType::Q8_0)];
    for (name, dtype) in cases {
        let model = load(name);
        let ids = &prompts(&reference_json(name))[1];
        let cap = ids.len() + 8;
        let pool = PagePool::new(&model, dtype, 4, 1024).unwrap().shared();
        let used = || lock(&pool).used_pages();
        let mut a = SequenceState::in_pool(&model, cap, &pool).unwrap();
        // An odd length: the last page is partly filled.
        let cut = if ids.len().is_multiple_of(4) { ids.len() - 1 } else { ids.len() };
        model.forward(&mut a, &ids[..cut], Logits::None).unwrap();
        let held = cut.div_ceil(4);
        assert_eq!(used(), held, "{name}");
        let snap = a.snapshot().unwrap();
        assert_eq!(used(), held, "{name}: a snapshot shares the sequence's pages");
        let mut b = SequenceState::in_pool(&model, cap, &pool).unwrap();
        b.restore(&snap).unwrap();
        assert_eq!(used(), held, "{name}: a restore shares the snapshot's pages");
        let la = model.forward(&mut a, &[5], Logits::Last).unwrap();
        assert_eq!(used(), held + 1, "{name}: the writer copies the shared last page, nothing more");
        let lb = model.forward(&mut b, &[5], Logits::Last).unwrap();
        assert_eq!(used(), held + 2, "{name}");
        assert!(max_abs_diff(&la, &lb) == 0.0, "{name}: shared pages changed the numbers");
        // Both continue alike, and match a state that never shared.
        let mut c = SequenceState::with_rows(&model, cap, 1, dtype).unwrap();
        model.forward(&mut c, &ids[..cut], Logits::None).unwrap();
        let lc = model.forward(&mut c, &[5], Logits::Last).unwrap();
        assert!(max_abs_diff(&la, &lc) <= 1e-5, "{name}: paged in a shared pool differs from alone");
        let (na, nb) = (model.forward(&mut a, &[9], Logits::Last).unwrap(), model.forward(&mut b, &[9], Logits::Last).unwrap());
        assert!(max_abs_diff(&na, &nb) == 0.0, "{name}: the copies diverged");
        // Host memory: the pages go back, the rows come along.
        let mut snap = snap;
        let before = used();
        snap.move_to_host(model.backend()).unwrap();
        assert!(!snap.on_device());
        assert!(used() < before, "{name}: a snapshot in host memory holds no page");
        let mut d = SequenceState::in_pool(&model, cap, &pool).unwrap();
        d.restore(&snap).unwrap();
        let ld = model.forward(&mut d, &[5], Logits::Last).unwrap();
        assert!(max_abs_diff(&la, &ld) == 0.0, "{name}: restored from host memory differs");
        drop((a, b, d, snap));
        assert_eq!(used(), 0, "{name}: pages leak");
    }
}

/// Pages come back in order: a sequence that follows a finished one in the same pool gets its
/// pages as one contiguous run again (attention then reads one run, not one per page).
#[test]
fn freed_pages_come_back_in_order() {
    use ft_actor::kv::PagePool;
    use ft_backend::DType;
    let model = load("qwen3_moe");
    let vocab = model.config().vocab_size as u32;
    let pool = PagePool::new(&model, DType::F32, 4, 64).unwrap().shared();
    let ids: Vec<u32> = (0..30).map(|i| (i * 7 + 3) % vocab).collect();
    for round in 0..3 {
        let mut s = SequenceState::in_pool(&model, 64, &pool).unwrap();
        model.forward(&mut s, &ids, Logits::None).unwrap();
        let t = s.pages().unwrap().table().to_vec();
        assert!(t.windows(2).all(|w| w[1] == w[0] + 1), "round {round}: pages {t:?}");
    }
}
