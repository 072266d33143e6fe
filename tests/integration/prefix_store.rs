//! The prefix store on a real model: saved states move from device to host memory when the
//! device part of the budget is full and are evicted under the whole budget, and a restore
//! from either place continues exactly like the original sequence.

use crate::common::*;
use ft_actor::kv::reuse::{PrefixStore, ReuseSettings};
use ft_actor::kv::SequenceState;
use ft_actor::model::Logits;

#[test]
fn budget_demotes_to_host_then_evicts_and_restores_stay_exact() {
    let model = load("qwen3_moe");
    let r = reference_json("qwen3_moe");
    let ids = &prompts(&r)[1];
    // A 12-token state holds one page of KV on the device (its rows alone in host memory).
    let page = SequenceState::bytes_per_token(&model) as u64 * ft_actor::kv::PAGE_ROWS as u64;
    // Device room for one such state, total room for three.
    let (budget, device_budget) = (3 * page + page / 2, page + page / 2);
    let settings = ReuseSettings { budget, device_budget, interval: 512, boundary_ids: vec![] };
    let mut store = PrefixStore::new(settings, false, model.backend_arc());

    // Three unrelated 12-token sequences (distinct first tokens), saved one after another.
    let seqs: Vec<Vec<u32>> = (0..3u32).map(|k| ids[..12].iter().map(|t| (t + 97 * (k + 1)) % 1000).collect()).collect();
    let mut want = vec![];
    for s in &seqs {
        let mut st = SequenceState::new(&model, 32).unwrap();
        model.forward(&mut st, s, Logits::None).unwrap();
        store.record(s, &st).unwrap();
        want.push(model.forward(&mut st, &[5], Logits::Last).unwrap());
    }
    let stats = store.stats();
    assert_eq!(stats.recorded, 3);
    assert!(stats.device_bytes <= device_budget, "{stats:?}");
    assert!(stats.demoted >= 2, "older states move to host memory: {stats:?}");
    assert_eq!(stats.index.anchors, 3);

    // Each sequence resumes from its saved state, wherever it lives, with identical logits.
    for (s, w) in seqs.iter().zip(&want) {
        let prompt = [&s[..], &[5]].concat();
        let mut st = SequenceState::new(&model, 32).unwrap();
        assert_eq!(store.restore(&prompt, &mut st), 12);
        let got = model.forward(&mut st, &[5], Logits::Last).unwrap();
        assert_eq!(&got, w, "restored state continues exactly");
    }

    // A fourth state exceeds the whole budget: the least recently used one is evicted.
    let extra: Vec<u32> = ids[..12].iter().map(|t| (t + 500) % 1000).collect();
    let mut st = SequenceState::new(&model, 32).unwrap();
    model.forward(&mut st, &extra, Logits::None).unwrap();
    store.record(&extra, &st).unwrap();
    let stats = store.stats();
    assert_eq!(stats.index.anchors, 3, "{stats:?}");
    assert_eq!(stats.index.evictions, 1);
    assert!(stats.index.bytes <= budget);
    let mut st = SequenceState::new(&model, 32).unwrap();
    assert_eq!(store.restore(&[&seqs[0][..], &[5]].concat(), &mut st), 0, "the oldest was evicted");

    // A state larger than the whole budget is simply not saved.
    let mut big = SequenceState::new(&model, 256).unwrap();
    let long: Vec<u32> = (0..200).map(|i| (i * 7 + 3) % 1000).collect();
    model.forward(&mut big, &long, Logits::None).unwrap();
    store.record(&long, &big).unwrap();
    assert_eq!(store.stats().recorded, 4);
}
