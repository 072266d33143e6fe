//! `ft-actor plan`: the sizes it reads from a checkpoint's headers equal those of the loaded
//! model on every fixture and format (so its memory plan is the engine's), and the command
//! gives a plan and predictions for the CPU and for a GPU, with clear errors.
//!
//! Tolerances: bytes per expert and expert bytes exact; non-expert bytes and bytes read per
//! token within 2 % (the loader widens a few small tensors, norms and biases, to f32).

use crate::common::*;
use ft_actor::model::footprint::footprint;
use ft_actor::model::info::stats;
use ft_actor::model::{open_checkpoint, Model};
use ft_actor::quantize::{quantize_checkpoint, QuantFormat, QuantizeOptions};
use std::path::{Path, PathBuf};
use std::process::Command;

fn close(what: &str, got: u64, want: u64, tol: f64) {
    let rel = (got as f64 - want as f64).abs() / (want as f64).max(1.0);
    assert!(rel <= tol, "{what}: footprint {got} vs loaded {want} ({:.2} %)", rel * 100.0);
}

fn check(label: &str, path: &Path) {
    let (cfg, files, scheme) = open_checkpoint(path).unwrap_or_else(|e| panic!("{label}: {e}"));
    let fp = footprint(&files, &cfg, &scheme);
    let model = Model::load(path, cpu_backend(), &mut |_, _| {}).unwrap_or_else(|e| panic!("{label}: {e}"));
    let st = stats(&model);
    assert_eq!(fp.bytes_per_expert, st.bytes_per_expert, "{label}: bytes per expert");
    assert_eq!(fp.expert_bytes, st.expert_bytes, "{label}: expert bytes");
    assert_eq!(fp.total_experts, st.total_experts, "{label}: experts");
    close(&format!("{label}: non-expert bytes"), fp.non_expert_bytes, st.non_expert_bytes, 0.02);
    close(&format!("{label}: bytes per token"), fp.bytes_per_token, st.bytes_per_token, 0.02);
    eprintln!("{label}: footprint matches ({} B per token, {} B per expert)", fp.bytes_per_token, fp.bytes_per_expert);
}

#[test]
fn header_sizes_equal_the_loaded_model_on_every_fixture() {
    for name in ["qwen3_moe", "qwen2_moe", "mixtral", "glm4_moe", "deepseek_v3", "qwen3_next", "qwen3_5_moe", "gpt_oss", "deepseek_v4"] {
        check(name, &fixture(name).join("checkpoint"));
    }
}

#[test]
fn header_sizes_equal_the_loaded_model_in_quantized_formats() {
    let base = scratch_dir("ft-actor-plan-", "quant");
    for (name, format) in [("qwen3_moe", QuantFormat::Fp8), ("qwen3_moe", QuantFormat::Nvfp4), ("gpt_oss", QuantFormat::Mxfp4)] {
        let out = base.join(format!("{name}-{format:?}"));
        let opts = QuantizeOptions { model: fixture(name).join("checkpoint"), out: out.clone(), format, overwrite: true, twin: None };
        quantize_checkpoint(&opts, |_, _| {}).unwrap_or_else(|e| panic!("{name} {format:?}: {e}"));
        check(&format!("{name} {format:?}"), &out);
    }
    let Some(py) = gguf_python() else { return };
    for kind in ["q8_0", "q4_k_m"] {
        let (gguf, _) = gguf_convert(&py, &fixture("qwen3_moe").join("checkpoint"), &format!("plan-{kind}"), kind, &[]);
        check(&format!("qwen3_moe GGUF {kind}"), &gguf);
    }
}

fn plan(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ft-actor")).arg("plan").args(args).env_remove("FT_MODEL").output().expect("run ft-actor plan")
}

fn json(o: &std::process::Output) -> serde_json::Value {
    assert!(o.status.success(), "plan failed: {}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&o.stdout)))
}

#[test]
fn plan_predicts_for_the_cpu_and_a_gpu() {
    let dir: PathBuf = fixture("qwen3_moe").join("checkpoint");
    let d = dir.to_str().unwrap();
    // CPU: the rates are measured (one probe per format the model reads).
    let v = json(&plan(&["--model", d, "--json", "--cpu-threads", "2", "--ram", "8GiB", "--probe-seconds", "0.3"]));
    assert_eq!(v["fits"], true);
    let rates = v["cpu_rates"].as_array().unwrap();
    assert!(!rates.is_empty() && rates.iter().all(|r| r["bytes_per_s"].as_f64().unwrap() > 1e8), "{rates:?}");
    let p = &v["predictions"].as_array().unwrap()[0];
    assert_eq!(p["mode"], "cpu");
    // The prediction is the bytes over the measured rate (one format here), plus the KV reads.
    let bpt = v["footprint"]["bytes_per_token"].as_f64().unwrap();
    let rate = rates[0]["bytes_per_s"].as_f64().unwrap();
    let tps = p["tokens_per_s"].as_f64().unwrap();
    assert!(tps > 0.0 && tps <= rate / bpt * 1.0001, "{tps} vs {}", rate / bpt);

    // A GPU: three modes, hybrid no slower than the other two, a hit-rate curve that rises.
    let v = json(&plan(&["--model", d, "--json", "--vram", "1GiB", "--gpu-bandwidth", "900", "--pcie-bandwidth", "25", "--cpu-bandwidth", "20"]));
    let modes: Vec<(String, f64)> = v["predictions"].as_array().unwrap().iter().map(|p| (p["mode"].as_str().unwrap().to_string(), p["tokens_per_s"].as_f64().unwrap())).collect();
    assert_eq!(modes.iter().map(|m| m.0.as_str()).collect::<Vec<_>>(), ["offload", "hybrid", "cpu"]);
    assert!(modes[1].1 >= modes[0].1 * 0.999 && modes[1].1 >= modes[2].1 * 0.999, "{modes:?}");
    let curve: Vec<f64> = v["hit_rate_curve"].as_array().unwrap().iter().map(|c| c["hit_rate"].as_f64().unwrap()).collect();
    assert!(curve.windows(2).all(|w| w[1] >= w[0]) && curve.last() == Some(&1.0), "{curve:?}");
    assert!(v["memory_plan"]["cache_slots"].as_u64().unwrap() > 0);

    // Text output names the figures' sources.
    let o = plan(&["--model", d, "--cpu-bandwidth", "20"]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success() && text.contains("fits             yes") && text.contains("tokens/s"), "{text}");

    // Errors.
    let o = plan(&["--model", d, "--vram", "8GiB"]);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("--gpu-bandwidth"));
    let o = plan(&["--model", "/nonexistent/model"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("/nonexistent/model") && !err.contains("panicked"), "{err}");
    // A model that does not fit: the plan says so (exit status 0: the question was answered).
    let v = json(&plan(&["--model", d, "--json", "--ram", "1MiB", "--cpu-bandwidth", "20"]));
    assert_eq!(v["fits"], false);
}
