//! The `ft-actor` binary end to end: outputs on the fixtures, and one clear error (never a
//! panic) for each kind of bad input.

use crate::common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn ft(args: &[&str]) -> Output {
    ft_env(args, &[])
}

fn ft_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ft-actor"))
        .args(args)
        .env("XDG_CACHE_HOME", std::env::temp_dir().join("ft-actor-test-cache"))
        .env_remove("FT_MODEL")
        .envs(env.iter().copied())
        .output()
        .expect("run ft-actor")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Asserts the command failed with one clear message containing every `needle`.
fn assert_clean_error(o: &Output, needles: &[&str]) {
    let err = stderr(o);
    assert!(!o.status.success(), "expected failure, got success; stderr: {err}");
    assert_eq!(o.status.code(), Some(1), "exit code; stderr: {err}");
    assert!(!err.contains("panicked"), "panic instead of an error: {err}");
    assert!(err.contains("error:"), "no error line: {err}");
    for n in needles {
        assert!(err.contains(n), "error message lacks `{n}`: {err}");
    }
}

/// A scratch copy of a fixture checkpoint that a test may break.
struct Scratch(PathBuf);

impl Scratch {
    fn of(fixture_name: &str, tag: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("ft-cli-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for e in std::fs::read_dir(fixture(fixture_name).join("checkpoint")).unwrap() {
            let p = e.unwrap().path();
            std::fs::copy(&p, dir.join(p.file_name().unwrap())).unwrap();
        }
        Scratch(dir)
    }
    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Rewrites the JSON header of a safetensors file with `edit`, keeping the data bytes.
fn edit_header(file: &Path, edit: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>)) {
    let bytes = std::fs::read(file).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    edit(&mut header);
    let mut h = serde_json::to_vec(&header).unwrap();
    while h.len() % 8 != 0 {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend(h);
    out.extend(&bytes[8 + n..]);
    std::fs::write(file, out).unwrap();
}

fn ids_json(o: &Output) -> Vec<u32> {
    let line = stdout(o).lines().last().unwrap_or_default().to_string();
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("stdout is not a JSON id list ({e}): {line}"))
}

#[test]
fn generate_output_ids_match_transformers_greedy_tokens() {
    let r = reference_json("qwen3_moe");
    let ids = prompts(&r)[1].iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",");
    let dir = fixture("qwen3_moe").join("checkpoint");
    let o = ft(&["generate", "--model", dir.to_str().unwrap(), "--backend", "cpu", "--prompt-ids", &ids,
        "--max-tokens", "16", "--temperature", "0", "--output-ids", "--ignore-eos"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let want: Vec<u32> = r["generation"][1]["new_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
    assert_eq!(ids_json(&o), want);
}

#[test]
fn logits_npy_matches_reference() {
    let r = reference_json("mixtral");
    let ids = prompts(&r)[0].iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",");
    let out = std::env::temp_dir().join(format!("ft-cli-logits-{}.npy", std::process::id()));
    let dir = fixture("mixtral").join("checkpoint");
    let o = ft(&["logits", "--model", dir.to_str().unwrap(), "--prompt-ids", &ids, "--out", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let bytes = std::fs::read(&out).unwrap();
    std::fs::remove_file(&out).ok();
    let hlen = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    let header = std::str::from_utf8(&bytes[10..10 + hlen]).unwrap();
    assert!(header.contains("'descr': '<f4'") && header.contains("(5, 1024)"), "{header}");
    let got: Vec<f32> = bytes[10 + hlen..].chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    let want = tensor(&reference_tensors("mixtral"), "logits.p0");
    assert!(max_abs_diff(&got, &want) <= 1e-3);
}

#[test]
fn generate_runs_on_the_builtin_demo_model_with_chat() {
    let o = ft(&["generate", "--prompt", "Hello!", "--chat", "--system", "Be brief.", "--max-tokens", "8", "--seed", "1"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("new tokens"), "{}", stderr(&o));
    // Which backend ran is said on stderr (with `auto`, the CPU here: no GPU in CI).
    assert!(stderr(&o).lines().any(|l| l.starts_with("running on ") && l.contains("MoE mode")), "{}", stderr(&o));
}

#[test]
fn info_reports_sizes_and_plan() {
    let dir = fixture("glm4_moe").join("checkpoint");
    let o = ft(&["info", "--model", dir.to_str().unwrap(), "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["architecture"], "glm4_moe");
    assert_eq!(v["layers"], 3);
    assert_eq!(v["moe_layers"], 2);
    // 3 matrices of 32×64 f32 per expert.
    assert_eq!(v["bytes_per_expert"], 3 * 32 * 64 * 4);
    assert!(v["active_params"].as_u64().unwrap() < v["total_params"].as_u64().unwrap());
    let o = ft(&["info", "--model", dir.to_str().unwrap()]);
    assert!(stdout(&o).contains("memory plan"), "{}", stdout(&o));
}

#[test]
fn missing_folder_is_a_clear_error() {
    let o = ft(&["generate", "--model", "/nonexistent/model", "--prompt-ids", "1,2"]);
    assert_clean_error(&o, &["/nonexistent/model", "does not exist"]);
}

#[test]
fn missing_config_is_a_clear_error() {
    let s = Scratch::of("mixtral", "noconfig");
    std::fs::remove_file(s.0.join("config.json")).unwrap();
    assert_clean_error(&ft(&["info", "--model", s.path()]), &["config.json"]);
}

#[test]
fn malformed_config_is_a_clear_error() {
    let s = Scratch::of("mixtral", "badjson");
    std::fs::write(s.0.join("config.json"), "{\"model_type\": \"mixtral\",").unwrap();
    assert_clean_error(&ft(&["info", "--model", s.path()]), &["config.json", "not valid JSON"]);
}

#[test]
fn unknown_model_type_lists_the_supported_ones() {
    let s = Scratch::of("mixtral", "unknownarch");
    let cfg = std::fs::read_to_string(s.0.join("config.json")).unwrap().replace("\"mixtral\"", "\"llama_moe_xl\"");
    std::fs::write(s.0.join("config.json"), cfg).unwrap();
    assert_clean_error(&ft(&["info", "--model", s.path()]), &["llama_moe_xl", "qwen3_moe", "glm4_moe"]);
}

#[test]
fn missing_config_key_names_the_key() {
    let s = Scratch::of("mixtral", "nokey");
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(s.0.join("config.json")).unwrap()).unwrap();
    v.as_object_mut().unwrap().remove("hidden_size");
    std::fs::write(s.0.join("config.json"), v.to_string()).unwrap();
    assert_clean_error(&ft(&["info", "--model", s.path()]), &["hidden_size"]);
}

#[test]
fn missing_tensor_is_named() {
    let s = Scratch::of("mixtral", "notensor");
    edit_header(&s.0.join("model.safetensors"), |h| {
        h.remove("model.layers.1.self_attn.k_proj.weight");
    });
    assert_clean_error(&ft(&["info", "--model", s.path()]), &["model.layers.1.self_attn.k_proj.weight", "not found"]);
}

#[test]
fn wrong_shape_names_tensor_and_both_shapes() {
    let s = Scratch::of("mixtral", "shape");
    edit_header(&s.0.join("model.safetensors"), |h| {
        h["model.layers.0.self_attn.q_proj.weight"]["shape"] = serde_json::json!([32, 128]);
    });
    assert_clean_error(&ft(&["info", "--model", s.path()]), &["model.layers.0.self_attn.q_proj.weight", "[32, 128]", "[64, 64]"]);
}

#[test]
fn unsupported_dtype_is_named() {
    let s = Scratch::of("mixtral", "dtype");
    edit_header(&s.0.join("model.safetensors"), |h| {
        h["model.norm.weight"]["dtype"] = serde_json::json!("I32");
    });
    assert_clean_error(&ft(&["info", "--model", s.path()]), &["model.norm.weight", "I32"]);
}

#[test]
fn truncated_safetensors_is_reported() {
    let s = Scratch::of("mixtral", "trunc");
    let f = s.0.join("model.safetensors");
    let bytes = std::fs::read(&f).unwrap();
    std::fs::write(&f, &bytes[..bytes.len() / 2]).unwrap();
    assert_clean_error(&ft(&["info", "--model", s.path()]), &["model.safetensors", "truncated"]);
}

#[test]
fn missing_shard_is_named() {
    let s = Scratch::of("qwen3_moe", "shard");
    std::fs::remove_file(s.0.join("model-00002-of-00002.safetensors")).unwrap();
    assert_clean_error(&ft(&["info", "--model", s.path()]), &["model-00002-of-00002.safetensors"]);
}

#[test]
fn prompt_longer_than_context_is_refused() {
    let dir = fixture("mixtral").join("checkpoint");
    let o = ft(&["generate", "--model", dir.to_str().unwrap(), "--ctx-size", "4", "--prompt-ids", "1,2,3,4,5"]);
    assert_clean_error(&o, &["5 tokens", "context holds 4"]);
}

#[test]
fn token_id_outside_vocabulary_is_refused() {
    let dir = fixture("mixtral").join("checkpoint");
    let o = ft(&["generate", "--model", dir.to_str().unwrap(), "--prompt-ids", "1,99999"]);
    assert_clean_error(&o, &["99999", "vocabulary"]);
}

#[test]
fn missing_tokenizer_is_named_when_text_is_given() {
    let s = Scratch::of("mixtral", "notok");
    std::fs::remove_file(s.0.join("tokenizer.json")).unwrap();
    assert_clean_error(&ft(&["generate", "--model", s.path(), "--prompt", "hi"]), &["tokenizer.json"]);
}

#[test]
fn a_tokenizer_that_does_not_parse_is_named_not_called_missing() {
    let s = Scratch::of("mixtral", "badtok");
    std::fs::write(s.0.join("tokenizer.json"), "{\"model\": {\"type\": \"BPE\", \"vocab\": 7}}").unwrap();
    // Even a run on token ids refuses: a tokenizer that is there but broken is not an absent one.
    for args in [&["generate", "--model", s.path(), "--prompt", "hi"][..], &["generate", "--model", s.path(), "--prompt-ids", "1,2"]] {
        let o = ft(args);
        assert_clean_error(&o, &["tokenizer.json", "malformed"]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!err.contains("has no tokenizer"), "{err}");
    }
}

#[test]
fn unavailable_backend_is_one_clear_error() {
    let dir = fixture("mixtral").join("checkpoint");
    // Linux has no Metal adapter, so asking wgpu for one is an unavailable backend here even
    // where a Vulkan driver (as in CI) makes `--backend wgpu` work.
    let o = ft_env(&["generate", "--model", dir.to_str().unwrap(), "--backend", "wgpu", "--prompt-ids", "1,2"], &[("WGPU_BACKEND", "metal")]);
    assert_clean_error(&o, &["wgpu"]);
}

#[test]
fn cuda_without_a_driver_is_one_clear_error_for_every_model_command() {
    if ft_backend_cuda::find_driver().is_some() {
        eprintln!("skipped: an NVIDIA driver is present on this machine");
        return;
    }
    let dir = fixture("mixtral").join("checkpoint");
    let d = dir.to_str().unwrap();
    let out = std::env::temp_dir().join("ft-cli-cuda.npy");
    for args in [
        vec!["generate", "--model", d, "--backend", "cuda", "--prompt-ids", "1,2"],
        vec!["logits", "--model", d, "--backend", "cuda", "--prompt-ids", "1,2", "--out", out.to_str().unwrap()],
        vec!["info", "--model", d, "--backend", "cuda"],
        vec!["bench", "--model", d, "--backend", "cuda"],
    ] {
        assert_clean_error(&ft(&args), &["NVIDIA driver", "--backend"]);
    }
    let o = ft(&["generate", "--model", d, "--backend", "auto", "--prompt-ids", "1,2", "--max-tokens", "2", "--output-ids"]);
    assert!(o.status.success(), "auto must fall back to the CPU: {}", stderr(&o));
}

/// `bench --json` reports measured figures: the spread of repeated runs, weight bytes per token
/// from the read counter (which must agree with what the model's shape implies for a plain
/// f32 model, where every routed expert is computed once per token), and the probe's spread.
#[test]
fn bench_reports_counted_bytes_and_spread() {
    let dir = fixture("qwen3_moe").join("checkpoint");
    let o = ft(&[
        "bench", "--model", dir.to_str().unwrap(), "--backend", "cpu", "--json", "--repeat", "2", "--prompt-len", "8", "--gen-tokens", "4",
        "--bandwidth-mib", "16", "--bandwidth-passes", "3",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(stdout(&o).lines().next().unwrap()).unwrap();
    assert_eq!(v["runs"], 2);
    let counted = v["bytes_per_token_counted"].as_f64().unwrap();
    let model = v["bytes_per_token_model"].as_f64().unwrap();
    // The shape's figure includes norms and one embedding row, which the counter leaves out.
    assert!(counted > 0.9 * model && counted <= 1.01 * model, "counted {counted} vs model {model}");
    for key in ["prefill_tok_s", "decode_tok_s", "decode_gb_s"] {
        let s = &v[key];
        let (lo, mid, hi) = (s["min"].as_f64().unwrap(), s["median"].as_f64().unwrap(), s["max"].as_f64().unwrap());
        assert!(0.0 < lo && lo <= mid && mid <= hi, "{key}: {s}");
    }
    assert_eq!(v["memory_gb_s"]["passes"], 3);
    if cfg!(target_os = "linux") {
        // How much of the probe's buffer the kernel backed with huge pages, from smaps.
        let huge = v["memory_gb_s"]["huge_page_fraction"].as_f64().expect("huge page share on Linux");
        assert!((0.0..=1.0).contains(&huge), "huge page share {huge}");
    }
    assert!(v["roofline_fraction"].as_f64().unwrap() > 0.0);
    // The step split is timed (every decode step runs MoE layers), and on Linux the pool's
    // busy share comes from the kernel's per-thread CPU accounting.
    let experts = v["step_expert_fraction"].as_f64().unwrap();
    assert!(experts > 0.0 && experts < 1.0, "expert phase fraction {experts}");
    assert!((experts + v["step_rest_fraction"].as_f64().unwrap() - 1.0).abs() < 1e-9);
    if cfg!(target_os = "linux") {
        let busy = v["pool_busy_fraction"].as_f64().expect("pool busy on Linux");
        assert!(busy > 0.0 && busy <= 1.05, "pool busy {busy}");
    }
    // The experts run as pooled decode-sized products on the CPU: timed, with their bytes.
    let share = v["cpu_products_fraction"].as_f64().expect("CPU products timed");
    assert!(share > 0.0 && share <= 1.0, "share of decode in CPU products {share}");
    assert!(v["cpu_products_gb_s"].as_f64().expect("their rate") > 0.0);
}

/// `bench --concurrency` measures streams decoding together in batched steps: several
/// sequences share each step (mean batch above 1 at 3 streams), the aggregate rate and bytes
/// per step are counted, and `--arrival-prompt` times a long prompt arriving beside
/// `--arrival-streams` decoding ones.
#[test]
fn bench_measures_streams_decoding_together() {
    let dir = fixture("qwen3_moe").join("checkpoint");
    let o = ft(&[
        "bench", "--model", dir.to_str().unwrap(), "--backend", "cpu", "--json", "--repeat", "1", "--prompt-len", "8", "--gen-tokens", "12",
        "--bandwidth-mib", "16", "--bandwidth-passes", "1", "--concurrency", "1,3", "--arrival-prompt", "40", "--arrival-streams", "2",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let lines: Vec<serde_json::Value> = stdout(&o).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let level = |n: u64| lines.iter().find(|v| v["streams"] == n).unwrap_or_else(|| panic!("no {n}-stream row: {lines:?}"));
    let (one, three) = (level(1), level(3));
    assert!(one["aggregate_tok_s"]["median"].as_f64().unwrap() > 0.0);
    assert!(three["mean_batch"].as_f64().unwrap() > 1.5, "3 streams must share steps: {three}");
    assert!(three["bytes_per_step"].as_f64().unwrap() > 0.0 && three["speedup_vs_1"].as_f64().is_some());
    let arrival = lines.iter().find(|v| v.get("arrival_prompt").is_some()).expect("arrival line");
    assert_eq!(arrival["arrival_prompt"], 40);
    assert_eq!(arrival["streams"], 2);
    assert_eq!(arrival["runs"], 1);
    let (p50, p99) = (arrival["ttft_p50_s"].as_f64().unwrap(), arrival["ttft_p99_s"].as_f64().unwrap());
    assert!(p50 > 0.0 && p50 <= p99 && arrival["longest_pause_s"].as_f64().unwrap() > 0.0, "{arrival}");
    // The engine's step timer: a stream's longest pause is at least the longest step.
    let step = arrival["longest_step_s"].as_f64().unwrap();
    assert!(step > 0.0 && step <= arrival["longest_pause_s"].as_f64().unwrap() + 1e-3, "{arrival}");
}

/// `bench-replay --subagents` runs the transcript beside subagent conversations at once and
/// one after another: the table has both rows, the steps were shared (max batch above 1), and
/// each request's tokens are the same both ways.
#[test]
fn bench_replay_runs_subagents_together() {
    let o = ft(&["bench-replay", "--backend", "cpu", "--turns", "3", "--tool-tokens", "48", "--gen-tokens", "3", "--subagents", "2"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let row = |label: &str| -> Vec<String> {
        let line = out.lines().find(|l| l.starts_with(&format!("| {label} |"))).unwrap_or_else(|| panic!("no {label} row:\n{out}"));
        line.split('|').map(|c| c.trim().to_string()).collect()
    };
    let (together, apart) = (row("together"), row("one after another"));
    let batch = |r: &[String]| r[8].parse::<u64>().unwrap();
    assert!(batch(&together) > 1, "conversations must share steps: {together:?}");
    assert_eq!(batch(&apart), 1, "{apart:?}");
    assert!(out.contains("outputs identical together and one after another: yes"), "{out}");
}
