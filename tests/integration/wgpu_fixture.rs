//! The fixture models on the wgpu backend (Mesa lavapipe in CI) against the transformers
//! reference: greedy tokens identical, full-prompt and decode-step logits within
//! [`LOGIT_TOL`], through the library and through `ft-actor generate --backend wgpu`.
//!
//! Every fixture runs, the hybrid ones (qwen3_next, qwen3_5_moe) included: the wgpu backend
//! has all ops of the trait, Gated DeltaNet's causal_conv1d and gated_delta_rule too.
//!
//! Without a wgpu adapter the tests print a skip line and pass, unless `FT_REQUIRE_WGPU=1`
//! (CI), where a missing adapter fails them.

use crate::common::*;
use ft_actor::device::{create_backend, BackendChoice, DeviceOptions};
use ft_actor::kv::SequenceState;
use ft_actor::model::{Logits, Model};
use ft_backend::{Backend, BackendKind};
use std::process::Command;
use std::sync::{Arc, OnceLock};

/// Max abs difference of logits, as in tests/integration/fixture_models.rs (f32 compute everywhere).
const LOGIT_TOL: f32 = 1e-3;

/// The wgpu backend as `--backend wgpu` builds it, shared by the tests of this file; `None`
/// (after a skip line) when this machine has no adapter.
fn wgpu(test: &str) -> Option<Arc<dyn Backend>> {
    static B: OnceLock<Result<Arc<dyn Backend>, String>> = OnceLock::new();
    let b = B.get_or_init(|| {
        create_backend(&DeviceOptions { backend: BackendChoice::Wgpu, ..Default::default() }).map_err(|e| e.to_string())
    });
    match b {
        Ok(b) => Some(b.clone()),
        Err(e) if std::env::var("FT_REQUIRE_WGPU").is_ok_and(|v| v == "1") => {
            panic!("{test}: FT_REQUIRE_WGPU=1 but the wgpu backend did not open: {e}")
        }
        Err(e) => {
            println!("skipped: {test}: {e}");
            None
        }
    }
}

fn load_on(name: &str, b: Arc<dyn Backend>) -> Model {
    Model::load(&fixture(name).join("checkpoint"), b, &mut |_, _| {}).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Every prompt of fixture `name`: full logits, then 16 greedy steps with the KV cache.
fn check_fixture(name: &str) {
    let Some(b) = wgpu(name) else { return };
    let model = load_on(name, b);
    assert_eq!(model.backend().kind(), BackendKind::Wgpu, "{name}: the model must run on the wgpu backend");
    let r = reference_json(name);
    let refs = reference_tensors(name);
    let vocab = model.config().vocab_size;
    let mut worst = 0f32;
    for (p, ids) in prompts(&r).iter().enumerate() {
        let mut state = SequenceState::new(&model, ids.len() + 16).unwrap();
        let logits = model.forward(&mut state, ids, Logits::All).unwrap_or_else(|e| panic!("{name} p{p}: {e}"));
        let d = max_abs_diff(&logits, &tensor(&refs, &format!("logits.p{p}")));
        assert!(d <= LOGIT_TOL, "{name} p{p}: prompt logits differ by {d}");
        worst = worst.max(d);

        let mut state = SequenceState::new(&model, ids.len() + 16).unwrap();
        let mut step = model.forward(&mut state, ids, Logits::Last).unwrap();
        let gen_ref = tensor(&refs, &format!("gen_logits.p{p}"));
        let want: Vec<u32> =
            r["generation"][p]["new_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
        let mut got = vec![];
        for s in 0..want.len() {
            let d = max_abs_diff(&step, &gen_ref[s * vocab..(s + 1) * vocab]);
            assert!(d <= LOGIT_TOL, "{name} p{p}: decode step {s} logits differ by {d}");
            worst = worst.max(d);
            let next = argmax(&step);
            got.push(next);
            if s + 1 < want.len() {
                step = model.forward(&mut state, &[next], Logits::Last).unwrap();
            }
        }
        assert_eq!(got, want, "{name} p{p}: greedy tokens");
    }
    eprintln!("{name} on wgpu: max |Δ logits| {worst:.2e}");
}

#[test]
fn qwen3_moe_on_wgpu_matches_transformers() {
    check_fixture("qwen3_moe");
}

#[test]
fn qwen3_moe_bf16_on_wgpu_matches_transformers() {
    check_fixture("qwen3_moe_bf16");
}

#[test]
fn qwen2_moe_on_wgpu_matches_transformers() {
    check_fixture("qwen2_moe");
}

#[test]
fn mixtral_on_wgpu_matches_transformers() {
    check_fixture("mixtral");
}

#[test]
fn glm4_moe_on_wgpu_matches_transformers() {
    check_fixture("glm4_moe");
}

#[test]
fn gpt_oss_on_wgpu_matches_transformers() {
    check_fixture("gpt_oss");
}

#[test]
fn deepseek_v3_on_wgpu_matches_transformers() {
    check_fixture("deepseek_v3");
}

/// DeepSeek-V4's projections, routed and shared experts (clamped SwiGLU) on wgpu; its
/// hyper-connections, compressors and attention run on the host.
#[test]
fn deepseek_v4_on_wgpu_matches_transformers() {
    check_fixture("deepseek_v4");
}

#[test]
fn qwen3_next_on_wgpu_matches_transformers() {
    check_fixture("qwen3_next");
}

#[test]
fn qwen3_5_moe_on_wgpu_matches_transformers() {
    check_fixture("qwen3_5_moe");
}

#[test]
fn cli_generate_on_wgpu_gives_greedy_tokens() {
    if wgpu("cli_generate_on_wgpu").is_none() {
        return;
    }
    let r = reference_json("qwen3_moe");
    let ids = prompts(&r)[1].iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",");
    let dir = fixture("qwen3_moe").join("checkpoint");
    let o = Command::new(env!("CARGO_BIN_EXE_ft-actor"))
        .args(["generate", "--model", dir.to_str().unwrap(), "--backend", "wgpu", "--prompt-ids", &ids])
        .args(["--max-tokens", "16", "--temperature", "0", "--output-ids", "--ignore-eos"])
        .env("XDG_CACHE_HOME", std::env::temp_dir().join("ft-actor-test-cache"))
        .env_remove("FT_MODEL")
        .output()
        .expect("run ft-actor");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "ft-actor generate --backend wgpu failed: {stderr}");
    let stdout = String::from_utf8_lossy(&o.stdout);
    let line = stdout.lines().last().unwrap_or_default();
    let got: Vec<u32> = serde_json::from_str(line).unwrap_or_else(|e| panic!("stdout is not a JSON id list ({e}): {line}"));
    let want: Vec<u32> = r["generation"][1]["new_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
    assert_eq!(got, want, "greedy tokens through the CLI");
}

/// GGUF block types on the wgpu backend (its in-shader block decode): logits equal the CPU
/// backend's on the same file within [`LOGIT_TOL`], greedy tokens identical.
#[test]
fn gguf_block_types_on_wgpu() {
    let Some(be) = wgpu("gguf_block_types_on_wgpu") else { return };
    let Some(py) = gguf_python() else { return };
    let ids = &prompts(&reference_json("qwen3_moe"))[0];
    for kind in ["q8_0", "q4_0", "mxfp4"] {
        let (gguf, _) = gguf_convert(&py, &fixture("qwen3_moe").join("checkpoint"), &format!("wgpu-{kind}"), kind, &[]);
        let on_gpu = Model::load(&gguf, be.clone(), &mut |_, _| {}).unwrap_or_else(|e| panic!("{kind} on wgpu: {e}"));
        let on_cpu = load_path(&gguf);
        let mut sg = SequenceState::new(&on_gpu, ids.len()).unwrap();
        let mut sc = SequenceState::new(&on_cpu, ids.len()).unwrap();
        let d = max_abs_diff(&on_gpu.forward(&mut sg, ids, Logits::All).unwrap(), &on_cpu.forward(&mut sc, ids, Logits::All).unwrap());
        assert!(d <= LOGIT_TOL, "{kind}: wgpu logits differ from the CPU's by {d}");
        assert_eq!(greedy(&on_gpu, ids, 8), greedy(&on_cpu, ids, 8), "{kind}: greedy tokens on wgpu");
    }
}
