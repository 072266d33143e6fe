//! Faults in the expert pipeline and cache resizes: a fault fails only its own request, with
//! a typed error, frees its leases and sequence state, and leaves no slot holding garbage (the
//! next request's tokens equal the reference); a resize works from any start state, is
//! bounded by the memory budget, and rolls back when allocation fails.

use crate::common::*;
use ft_actor::actors::faults::FaultCounts;
use ft_actor::engine::{Engine, EngineError, EngineHandle, EngineRequest, GenEvent};
use ft_actor::policy::{MoeMode, VramBudget};

const NAME: &str = "qwen3_moe";

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

fn all_experts() -> u64 {
    let cfg = ft_actor::model::ModelConfig::from_dir(&fixture(NAME).join("checkpoint")).unwrap();
    (cfg.num_experts * cfg.num_moe_layers()) as u64
}

fn want(p: usize) -> Vec<u32> {
    let r = reference_json(NAME);
    r["generation"][p]["new_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

async fn spawn(slots: u64, mode: MoeMode) -> EngineHandle {
    Engine::spawn(pipeline_config(fixture(NAME).join("checkpoint"), slots, mode), None).await.unwrap()
}

/// 16 greedy tokens of reference prompt `p`, or the error that ended the generation. Each
/// step's logits must be within 1e-3 of transformers' (a slot holding garbage shows here even
/// where it does not change a greedy token).
async fn generate(engine: &EngineHandle, p: usize) -> Result<Vec<u32>, EngineError> {
    let gen_ref = tensor(&reference_tensors(NAME), &format!("gen_logits.p{p}"));
    let vocab = gen_ref.len() / 16;
    let mut req = EngineRequest::greedy(prompts(&reference_json(NAME))[p].clone(), 16);
    req.ignore_eos = true;
    req.return_logits = true;
    let mut stream = engine.generate(req).await?;
    let mut ids = vec![];
    while let Some(ev) = stream.next().await {
        match ev {
            GenEvent::Token { id, logits, .. } => {
                let s = ids.len();
                let d = max_abs_diff(&logits.expect("logits"), &gen_ref[s * vocab..(s + 1) * vocab]);
                assert!(d <= 1e-3, "p{p} step {s}: logits differ from the reference by {d}");
                ids.push(id);
            }
            GenEvent::Done(_) => return Ok(ids),
            GenEvent::Error(e) => return Err(e),
        }
    }
    Err(EngineError::Stopped)
}

/// Nothing held between requests: no running sequence, no leased slot.
async fn assert_idle(engine: &EngineHandle, what: &str) {
    let s = engine.stats().await.unwrap();
    assert_eq!((s.active, s.queued, s.sequences, s.cache_leased), (0, 0, 0, 0), "{what}: engine not idle");
}

#[test]
fn a_failed_copy_fails_only_its_request_and_leaves_no_poisoned_slot() {
    rt().block_on(async {
        // Every expert fits: a copy that failed but stayed marked as cached would be hit by
        // the next request and change its tokens.
        let engine = spawn(all_experts(), MoeMode::Offload).await;
        engine.inject_faults(FaultCounts { copy: 1, ..Default::default() });
        let e = generate(&engine, 0).await.expect_err("the injected copy fault fails the request");
        assert!(matches!(e, EngineError::Internal(ref m) if m.contains("injected copy fault") && m.contains("layer")), "{e:?}");
        assert_eq!(engine.pending_faults(), FaultCounts::default());
        assert_idle(&engine, "after a failed copy").await;
        for round in 0..2 {
            assert_eq!(generate(&engine, 0).await.unwrap(), want(0), "round {round} after the fault");
        }
        let s = engine.stats().await.unwrap();
        assert!(s.total.hits > 0, "the retried request reuses the experts that did land");
        engine.shutdown().await;
    });
}

#[test]
fn a_device_out_of_memory_is_typed_and_transient() {
    rt().block_on(async {
        let engine = spawn(8, MoeMode::Offload).await;
        engine.inject_faults(FaultCounts { copy_oom: 1, ..Default::default() });
        let e = generate(&engine, 1).await.expect_err("out of memory");
        assert!(matches!(e, EngineError::OutOfMemory(ref m) if m.contains("out of device memory")), "{e:?}");
        assert_idle(&engine, "after out of memory").await;
        assert_eq!(generate(&engine, 1).await.unwrap(), want(1));
        engine.shutdown().await;
    });
}

/// Two requests of `n` tokens decoding together in batched steps; `faults` is armed once
/// both have a token. Returns each one's tokens, whether it failed (with the injected kernel
/// fault), and the engine's recompute count.
async fn two_running_with(faults: FaultCounts, n: usize) -> ([Vec<u32>; 2], [bool; 2], u64) {
    let engine = spawn(0, MoeMode::Cpu).await;
    let start = |p: usize| {
        let mut req = EngineRequest::greedy(prompts(&reference_json(NAME))[p].clone(), n);
        req.ignore_eos = true;
        engine.generate(req)
    };
    let (mut a, mut b) = (start(0).await.unwrap(), start(1).await.unwrap());
    let mut ids: [Vec<u32>; 2] = [vec![], vec![]];
    let mut failed = [false; 2];
    let mut armed = false;
    let mut done = [false; 2];
    while !(done[0] && done[1]) {
        for (i, s) in [&mut a, &mut b].into_iter().enumerate() {
            if done[i] {
                continue;
            }
            match s.next().await {
                Some(GenEvent::Token { id, .. }) => ids[i].push(id),
                Some(GenEvent::Done(_)) | None => done[i] = true,
                Some(GenEvent::Error(e)) => {
                    assert!(matches!(e, EngineError::Internal(ref m) if m.contains("injected kernel fault")), "{e:?}");
                    failed[i] = true;
                    done[i] = true;
                }
            }
            if !armed && !ids[0].is_empty() && !ids[1].is_empty() {
                engine.inject_faults(faults);
                armed = true;
            }
        }
    }
    engine.clear_faults();
    let recomputes = engine.stats().await.unwrap().recomputes;
    assert_idle(&engine, "after a failed kernel").await;
    assert_eq!(generate(&engine, 0).await.unwrap(), want(0));
    engine.shutdown().await;
    (ids, failed, recomputes)
}

#[test]
fn a_failed_kernel_in_a_batched_step_is_recomputed_and_costs_no_request() {
    rt().block_on(async {
        // One failed CPU job fails the step both sequences share: each is recomputed from its
        // tokens and goes on, with exactly the tokens it would have had.
        let (ids, failed, recomputes) = two_running_with(FaultCounts { cpu: 1, ..Default::default() }, 16).await;
        assert_eq!(failed, [false, false], "a transient fault fails no request");
        assert_eq!(recomputes, 2, "both sequences of the failed step were recomputed");
        assert_eq!(ids[0], want(0));
        assert_eq!(ids[1], want(1));
    });
}

#[test]
fn a_fault_that_persists_fails_the_batch_after_one_recompute() {
    rt().block_on(async {
        // Long requests, so that neither can finish before the fault is armed.
        let (_, failed, recomputes) = two_running_with(FaultCounts { cpu: 1000, ..Default::default() }, 400).await;
        assert_eq!(failed, [true, true], "a fault that stays fails the requests, it does not loop");
        assert_eq!(recomputes, 2);
    });
}

#[test]
fn a_resize_from_no_cache_switches_the_mode_and_the_slots_are_used() {
    rt().block_on(async {
        let engine = spawn(0, MoeMode::Auto).await;
        let s = engine.stats().await.unwrap();
        assert!(s.moe_mode.contains("Cpu"), "{}", s.moe_mode);
        assert_eq!(engine.resize_cache(16).await.unwrap(), 16);
        let s = engine.stats().await.unwrap();
        assert!(s.moe_mode.contains("Hybrid"), "with slots and both bandwidths equal: {}", s.moe_mode);
        assert_eq!(generate(&engine, 2).await.unwrap(), want(2));
        let s = engine.stats().await.unwrap();
        assert!(s.total.fetched > 0 && s.cache_used > 0, "the new slots are used: {:?}", s.total);
        let fetched = s.total.fetched;
        assert_eq!(engine.resize_cache(0).await.unwrap(), 0);
        assert!(engine.stats().await.unwrap().moe_mode.contains("Cpu"));
        assert_eq!(generate(&engine, 2).await.unwrap(), want(2));
        assert_eq!(engine.stats().await.unwrap().total.fetched, fetched, "no fetches without slots");
        engine.shutdown().await;
    });
}

#[test]
fn a_resize_is_bounded_by_the_budget_and_rolls_back_a_failed_allocation() {
    rt().block_on(async {
        // A budget that holds the fixed reservations and exactly 5 expert slots.
        let probe = spawn(0, MoeMode::Auto).await;
        let m = probe.info().memory.clone();
        let expert_bytes = probe.info().stats.bytes_per_expert;
        probe.shutdown().await;
        let mut cfg = pipeline_config(fixture(NAME).join("checkpoint"), 0, MoeMode::Auto);
        cfg.vram_budget = VramBudget::Bytes(m.non_expert_bytes + m.kv_bytes + m.scratch_bytes + 5 * expert_bytes + expert_bytes / 2);
        // The pool as the probe planned it (auto would take its share of the smaller budget).
        cfg.kv_budget = Some(m.kv_bytes);
        let engine = Engine::spawn(cfg, None).await.unwrap();
        assert_eq!(engine.info().memory.max_cache_slots, 5);
        let e = engine.resize_cache(6).await.expect_err("past the budget");
        assert!(matches!(e, EngineError::Conflict(ref m) if m.contains("room for 5 slots")), "{e:?}");

        engine.inject_faults(FaultCounts { alloc: 1, ..Default::default() });
        let e = engine.resize_cache(4).await.expect_err("allocation fails");
        assert!(matches!(e, EngineError::OutOfMemory(_)), "{e:?}");
        let s = engine.stats().await.unwrap();
        assert_eq!(s.cache_slots, 0, "rolled back");
        assert!(s.moe_mode.contains("Cpu"), "{}", s.moe_mode);
        assert_eq!(generate(&engine, 0).await.unwrap(), want(0));

        assert_eq!(engine.resize_cache(5).await.unwrap(), 5);
        assert_eq!(generate(&engine, 0).await.unwrap(), want(0));
        assert_idle(&engine, "after resizes").await;
        engine.shutdown().await;
    });
}
