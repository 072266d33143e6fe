//! The actor pipeline against the reference: same tokens and logits for every architecture,
//! every `--moe-mode`, cache sizes 0, 1, half and all experts, streaming prefill, a resize in
//! the middle of a generation, and concurrent generations.
//!
//! Tolerances as in `fixture_models.rs`: step logits within 1e-3 of transformers' decode
//! logits, tokens identical.

use crate::common::*;
use ft_actor::engine::{Engine, EngineConfig, EngineHandle, EngineRequest, GenEvent, PrefillMode};
use ft_actor::policy::MoeMode;

const ARCHS: [&str; 10] =
    ["qwen3_moe", "qwen3_moe_bf16", "qwen2_moe", "mixtral", "glm4_moe", "deepseek_v3", "gpt_oss", "qwen3_next", "qwen3_5_moe", "deepseek_v4"];

fn config(name: &str, slots: u64, mode: MoeMode) -> EngineConfig {
    pipeline_config(fixture(name).join("checkpoint"), slots, mode)
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// Generates 16 greedy tokens for prompt `p` and checks tokens and step logits.
async fn check_generation(engine: &EngineHandle, name: &str, p: usize, what: &str) {
    let r = reference_json(name);
    let refs = reference_tensors(name);
    let prompt = prompts(&r)[p].clone();
    let want: Vec<u32> = r["generation"][p]["new_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
    let gen_ref = tensor(&refs, &format!("gen_logits.p{p}"));
    let vocab = gen_ref.len() / 16;
    let mut req = EngineRequest::greedy(prompt, 16);
    req.ignore_eos = true;
    req.return_logits = true;
    let mut stream = engine.generate(req).await.unwrap();
    let mut got = vec![];
    while let Some(ev) = stream.next().await {
        match ev {
            GenEvent::Token { id, logits, .. } => {
                let s = got.len();
                let l = logits.expect("logits requested");
                let d = max_abs_diff(&l, &gen_ref[s * vocab..(s + 1) * vocab]);
                assert!(d <= 1e-3, "{name} {what} p{p}: step {s} logits differ by {d}");
                got.push(id);
            }
            GenEvent::Done(c) => {
                assert_eq!(c.completion_tokens, 16);
                break;
            }
            GenEvent::Error(e) => panic!("{name} {what}: {e}"),
        }
    }
    assert_eq!(got, want, "{name} {what} p{p}: tokens");
}

#[test]
fn every_architecture_mode_and_cache_size_matches_the_reference() {
    rt().block_on(async {
        for name in ARCHS {
            let cfg = ft_actor::model::ModelConfig::from_dir(&fixture(name).join("checkpoint")).unwrap();
            let all = (cfg.num_experts * cfg.num_moe_layers()) as u64;
            for slots in [0, 1, all / 2, all] {
                for mode in [MoeMode::Offload, MoeMode::Cpu, MoeMode::Hybrid, MoeMode::Auto] {
                    let what = format!("slots={slots} mode={mode}");
                    let engine = Engine::spawn(config(name, slots, mode), None).await.unwrap();
                    check_generation(&engine, name, 2, &what).await;
                    let stats = engine.stats().await.unwrap();
                    assert!(stats.total.hits + stats.total.misses > 0, "{what}: no routing recorded");
                    assert_eq!(stats.total.misses, stats.total.fetched + stats.total.cpu_computed, "{what}: every miss computed once");
                    if mode == MoeMode::Cpu || slots == 0 {
                        assert_eq!(stats.total.fetched, 0, "{what}");
                    }
                    if mode == MoeMode::Offload && slots > 1 {
                        assert!(stats.total.fetched > 0 && stats.total.bytes_moved > 0, "{what}: offload fetched nothing");
                    }
                    if mode == MoeMode::Hybrid && slots > 1 {
                        assert!(stats.total.fetched > 0 && stats.total.cpu_computed > 0, "{what}: hybrid must split ({:?})", stats.total);
                    }
                    if slots == all && mode == MoeMode::Offload {
                        assert!(stats.total.hits > 0, "{what}: a full cache must hit");
                    }
                    engine.shutdown().await;
                }
            }
        }
    });
}

#[test]
fn pipeline_logits_equal_the_reference_logits() {
    rt().block_on(async {
        for name in ARCHS {
            let engine = Engine::spawn(config(name, 4, MoeMode::Hybrid), None).await.unwrap();
            let r = reference_json(name);
            for (p, ids) in prompts(&r).into_iter().enumerate() {
                let got = engine.logits(ids).await.unwrap();
                let want = tensor(&reference_tensors(name), &format!("logits.p{p}"));
                assert!(max_abs_diff(&got, &want) <= 1e-3, "{name} p{p}");
            }
            engine.shutdown().await;
        }
    });
}

#[test]
fn streaming_prefill_matches_the_reference() {
    rt().block_on(async {
        for name in ARCHS {
            let mut c = config(name, 2, MoeMode::Hybrid);
            c.prefill = PrefillMode::Stream;
            let engine = Engine::spawn(c, None).await.unwrap();
            check_generation(&engine, name, 1, "stream prefill").await;
            let stats = engine.stats().await.unwrap();
            assert!(stats.total.streamed > 0, "{name}: nothing streamed");
            engine.shutdown().await;
        }
    });
}

#[test]
fn resizing_the_cache_mid_generation_changes_nothing_but_speed() {
    rt().block_on(async {
        let name = "qwen3_moe";
        let engine = Engine::spawn(config(name, 8, MoeMode::Offload), None).await.unwrap();
        let r = reference_json(name);
        let prompt = prompts(&r)[0].clone();
        let want: Vec<u32> = r["generation"][0]["new_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
        let mut req = EngineRequest::greedy(prompt, 16);
        req.ignore_eos = true;
        let mut stream = engine.generate(req).await.unwrap();
        let mut got = vec![];
        let sizes = [2u64, 16, 0, 5];
        while let Some(ev) = stream.next().await {
            match ev {
                GenEvent::Token { id, .. } => {
                    got.push(id);
                    if got.len() % 4 == 0 && got.len() / 4 <= sizes.len() {
                        let n = sizes[got.len() / 4 - 1];
                        assert_eq!(engine.resize_cache(n).await.unwrap(), n);
                        assert_eq!(engine.stats().await.unwrap().cache_slots, n);
                    }
                }
                GenEvent::Done(_) => break,
                GenEvent::Error(e) => panic!("{e}"),
            }
        }
        assert_eq!(got, want);
        engine.shutdown().await;
    });
}

#[test]
fn concurrent_generations_equal_each_alone() {
    rt().block_on(async {
        let name = "mixtral";
        let engine = Engine::spawn(config(name, 6, MoeMode::Hybrid), None).await.unwrap();
        let r = reference_json(name);
        let ps = prompts(&r);
        let run = |p: usize| {
            let engine = engine.clone();
            let prompt = ps[p].clone();
            async move {
                let mut req = EngineRequest::greedy(prompt, 16);
                req.ignore_eos = true;
                engine.generate(req).await.unwrap().collect().await.unwrap().0
            }
        };
        let alone_a = run(0).await;
        let alone_b = run(1).await;
        let (a, b) = tokio::join!(run(0), run(1));
        assert_eq!(a, alone_a);
        assert_eq!(b, alone_b);
        let want_a: Vec<u32> = r["generation"][0]["new_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
        assert_eq!(a, want_a);
        engine.shutdown().await;
    });
}

#[test]
fn cancelling_a_stream_frees_the_engine_for_the_next_request() {
    rt().block_on(async {
        let engine = Engine::spawn(config("qwen2_moe", 4, MoeMode::Hybrid), None).await.unwrap();
        let mut req = EngineRequest::greedy(vec![1, 2, 3], 1000);
        req.ignore_eos = true;
        let mut stream = engine.generate(req).await.unwrap();
        assert!(matches!(stream.next().await, Some(GenEvent::Token { .. })));
        drop(stream);
        let (ids, _, c) = engine.generate(EngineRequest::greedy(vec![4, 5], 3)).await.unwrap().collect().await.unwrap();
        assert!(ids.len() <= 3 && c.completion_tokens == ids.len());
        let s = engine.stats().await.unwrap();
        assert_eq!(s.active, 0, "the cancelled sequence is gone");
        engine.shutdown().await;
    });
}

#[test]
fn bad_requests_are_refused_with_typed_errors() {
    rt().block_on(async {
        let mut c = config("mixtral", 2, MoeMode::Cpu);
        c.ctx_size = Some(8);
        let engine = Engine::spawn(c, None).await.unwrap();
        let e = engine.generate(EngineRequest::greedy(vec![], 4)).await.err().unwrap();
        assert!(e.to_string().contains("empty"), "{e}");
        let e = engine.generate(EngineRequest::greedy(vec![1; 9], 4)).await.err().unwrap();
        assert!(matches!(e, ft_actor::engine::EngineError::PromptTooLong { prompt: 9, context: 8 }), "{e}");
        let e = engine.generate(EngineRequest::greedy(vec![5000], 4)).await.err().unwrap();
        assert!(e.to_string().contains("vocabulary"), "{e}");
        let mut req = EngineRequest::greedy(vec![1], 4);
        req.sampling.top_p = 7.0;
        assert!(engine.generate(req).await.is_err());
        engine.shutdown().await;
    });
}

#[test]
fn bandwidths_are_measured_once_then_read_from_the_profile() {
    rt().block_on(async {
        let dir = std::env::temp_dir().join(format!("ft-profile-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut c = config("qwen3_moe", 4, MoeMode::Auto);
        (c.b_p, c.b_h, c.cache_dir) = (None, None, Some(dir.clone()));
        let first = Engine::spawn(c.clone(), None).await.unwrap();
        assert_eq!(first.info().bandwidth_source, "measured");
        assert!(first.info().b_p > 0.0 && first.info().b_h > 0.0);
        let (b_p, b_h) = (first.info().b_p, first.info().b_h);
        first.shutdown().await;
        let second = Engine::spawn(c.clone(), None).await.unwrap();
        assert_eq!(second.info().bandwidth_source, "profile");
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b.abs();
        assert!(close(second.info().b_p, b_p) && close(second.info().b_h, b_h), "stored values are reused");
        second.shutdown().await;
        // Configured values win over the stored profile.
        c.b_p = Some(123.0);
        c.b_h = Some(456.0);
        let third = Engine::spawn(c, None).await.unwrap();
        assert_eq!((third.info().b_p, third.info().b_h), (123.0, 456.0));
        assert_eq!(third.info().bandwidth_source, "config");
        third.shutdown().await;
        std::fs::remove_dir_all(&dir).ok();
    });
}
