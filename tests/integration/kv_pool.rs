//! The KV pool oversubscribed: more sequences than it holds at full length run at once, so
//! new ones wait for room and running ones are preempted (state saved, dropped, rebuilt from
//! their tokens later). Every request must finish with exactly the greedy tokens it has alone,
//! on attention, latent (MLA) and recurrent models, with prefix reuse on (restarts restore the
//! saved state) and off (restarts recompute it).

use crate::common::*;
use ft_actor::engine::{Engine, EngineConfig, EngineHandle, EngineRequest, GenEvent};
use ft_actor::policy::MoeMode;

/// Long enough that each sequence outgrows the 256 rows its caches start with.
const GEN: usize = 280;
const STREAMS: usize = 5;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

async fn run(engine: &EngineHandle, prompt: Vec<u32>) -> Vec<u32> {
    let mut req = EngineRequest::greedy(prompt, GEN);
    req.ignore_eos = true;
    let mut stream = engine.generate(req).await.expect("request accepted");
    let mut ids = vec![];
    while let Some(ev) = stream.next().await {
        match ev {
            GenEvent::Token { id, .. } => ids.push(id),
            GenEvent::Done(_) => break,
            GenEvent::Error(e) => panic!("a running request failed: {e}"),
        }
    }
    ids
}

fn config(name: &str, reuse: bool, kv_budget: Option<u64>) -> EngineConfig {
    let mut c = pipeline_config(fixture(name).join("checkpoint"), 0, MoeMode::Cpu);
    c.max_active = STREAMS;
    c.ctx_size = Some(512);
    c.step_tokens = 32;
    c.kv_budget = kv_budget;
    if !reuse {
        c.prefix_cache_budget = 0;
    }
    c
}

fn check(name: &str, reuse: bool) {
    rt().block_on(async {
        let ps: Vec<Vec<u32>> = prompts(&reference_json(name)).into_iter().cycle().take(STREAMS).enumerate()
            .map(|(i, mut p)| {
                // Distinct prompts, so no two share all their state.
                p.push(10 + i as u32);
                p
            })
            .collect();
        let mut alone = vec![];
        let mut bytes_per_token = 0;
        for p in &ps {
            let engine = Engine::spawn(config(name, reuse, None), None).await.unwrap();
            bytes_per_token = engine.info().stats.kv_bytes_per_token;
            alone.push(run(&engine, p.clone()).await);
            engine.shutdown().await;
        }
        // Two sequences fit while their caches have their first 256 rows; the first to grow
        // past them (to prompt + GEN rows) no longer leaves room for the second.
        let pool = bytes_per_token * 530;
        let engine = Engine::spawn(config(name, reuse, Some(pool)), None).await.unwrap();
        let handles: Vec<_> = ps
            .iter()
            .map(|p| {
                let (e, p) = (engine.clone(), p.clone());
                tokio::spawn(async move { run(&e, p).await })
            })
            .collect();
        let mut together = vec![];
        for h in handles {
            together.push(h.await.unwrap());
        }
        let stats = engine.stats().await.unwrap();
        engine.shutdown().await;
        for (i, (a, t)) in alone.iter().zip(&together).enumerate() {
            assert_eq!(a.len(), GEN, "{name}: request {i} alone");
            assert_eq!(a, t, "{name} reuse={reuse}: request {i} differs when the pool is oversubscribed");
        }
        assert!(stats.preemptions > 0, "{name}: the pool never filled ({stats:?})");
        assert_eq!(stats.kv_pool_bytes, pool);
        assert_eq!(stats.kv_waiting, 0);
        // Pages: taken as tokens came, all given back when the requests ended (with reuse on,
        // the saved prefixes keep theirs).
        assert!(stats.kv_pages_max > 0 && stats.kv_page_rows == ft_actor::kv::PAGE_ROWS as u64, "{stats:?}");
        if !reuse {
            assert_eq!(stats.kv_pages_used, 0, "{name}: pages outlive their sequences");
        }
        eprintln!("{name} reuse={reuse}: {} preemptions, {} steps, max batch {}", stats.preemptions, stats.steps, stats.max_batch);
    });
}

#[test]
fn attention_model_finishes_every_request_with_the_same_tokens() {
    check("qwen3_moe", true);
    check("qwen3_moe", false);
}

#[test]
fn latent_attention_model_finishes_every_request_with_the_same_tokens() {
    check("deepseek_v3", true);
}

#[test]
fn recurrent_model_finishes_every_request_with_the_same_tokens() {
    check("qwen3_5_moe", true);
    check("qwen3_5_moe", false);
}

/// The pool limits one sequence's context: a prompt longer than it holds is refused up front
/// (HTTP 400 at the server), not failed half-way.
#[test]
fn a_prompt_longer_than_the_pool_is_refused_at_admission() {
    rt().block_on(async {
        let name = "qwen3_moe";
        let probe = Engine::spawn(config(name, true, None), None).await.unwrap();
        let bpt = probe.info().stats.kv_bytes_per_token;
        probe.shutdown().await;
        let mut c = config(name, true, Some(bpt * 1100));
        c.ctx_size = Some(4096);
        let engine = Engine::spawn(c, None).await.unwrap();
        assert_eq!(engine.info().context, 1100);
        let r = engine.generate(EngineRequest::greedy(vec![5; 1200], 4)).await;
        let e = r.err().expect("refused");
        assert!(e.to_string().contains("1100"), "{e}");
        // Below the least a sequence needs, the engine does not start, and says why.
        let mut c = config(name, true, Some(bpt * 100));
        c.ctx_size = Some(4096);
        let e = Engine::spawn(c, None).await.err().expect("refused to start");
        assert!(e.to_string().contains("KV pool"), "{e}");
        engine.shutdown().await;
    });
}
