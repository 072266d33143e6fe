//! Shared helpers for integration tests: fixture paths, reference tensors, comparisons.
#![allow(dead_code)]

use ft_actor::model::{Model, WeightFiles};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

/// `tests/fixtures/<name>`.
pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

/// The parsed `reference.json` of a fixture.
pub fn reference_json(name: &str) -> serde_json::Value {
    let path = fixture(name).join("reference.json");
    serde_json::from_str(&std::fs::read_to_string(&path).expect("reference.json")).expect("reference.json parses")
}

/// The reference tensors of a fixture.
pub fn reference_tensors(name: &str) -> WeightFiles {
    WeightFiles::open_file(&fixture(name).join("reference.safetensors")).expect("reference.safetensors")
}

/// A reference tensor as f32 values.
pub fn tensor(refs: &WeightFiles, key: &str) -> Vec<f32> {
    refs.get(key).unwrap_or_else(|e| panic!("{e}")).to_f32()
}

/// The CPU backend used by tests (SIMD auto, 2 threads).
pub fn cpu_backend() -> Arc<dyn ft_backend::Backend> {
    Arc::new(ft_backend_cpu::CpuBackend::new(ft_backend_cpu::CpuOptions { threads: Some(2), ..Default::default() }).expect("cpu backend"))
}

/// The backend fixtures load on: the CPU, or CUDA device 0 with `FT_TEST_BACKEND=cuda`
/// (scripts/gpu-check.sh).
pub fn test_backend() -> Arc<dyn ft_backend::Backend> {
    match std::env::var("FT_TEST_BACKEND").as_deref() {
        Ok("cuda") => ft_backend_cuda::open(0).unwrap_or_else(|e| panic!("FT_TEST_BACKEND=cuda: {e}")),
        _ => cpu_backend(),
    }
}

/// Loads a fixture checkpoint on [`test_backend`].
pub fn load(name: &str) -> Model {
    Model::load(&fixture(name).join("checkpoint"), test_backend(), &mut |_, _| {}).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// An engine on the CPU backend over `dir` with `slots` expert cache slots in `mode`, decode-path
/// prefill, and equal measured bandwidths (so the hybrid split sends half of the misses each way).
pub fn pipeline_config(dir: PathBuf, slots: u64, mode: ft_actor::policy::MoeMode) -> ft_actor::engine::EngineConfig {
    ft_actor::engine::EngineConfig {
        model: Some(dir),
        backend: ft_actor::device::BackendChoice::Cpu,
        cpu_threads: Some(2),
        expert_cache_slots: Some(slots),
        moe_mode: mode,
        prefill: ft_actor::engine::PrefillMode::Decode,
        b_p: Some(1e9),
        b_h: Some(1e9),
        cache_dir: Some(std::env::temp_dir().join("ft-actor-test-profiles")),
        ..Default::default()
    }
}

/// Largest absolute difference; panics on length mismatch.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// Index of the largest value (first on ties).
pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// Loads a checkpoint folder or GGUF file on the CPU backend.
pub fn load_path(path: &Path) -> Model {
    Model::load(path, cpu_backend(), &mut |_, _| {}).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `n` greedy tokens after `prompt`, decoded step by step with the KV cache.
pub fn greedy(model: &Model, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut state = ft_actor::kv::SequenceState::new(model, prompt.len() + n).unwrap();
    let mut logits = model.forward(&mut state, prompt, ft_actor::model::Logits::Last).unwrap();
    let mut out = vec![];
    for _ in 0..n {
        let t = argmax(&logits);
        out.push(t);
        logits = model.forward(&mut state, &[t], ft_actor::model::Logits::Last).unwrap();
    }
    out
}

/// Prompt ids of a fixture.
pub fn prompts(r: &serde_json::Value) -> Vec<Vec<u32>> {
    r["prompts"]
        .as_array()
        .expect("prompts")
        .iter()
        .map(|p| p["ids"].as_array().expect("ids").iter().map(|x| x.as_u64().expect("id") as u32).collect())
        .collect()
}

/// The Python that writes GGUF test files (gguf-py and numpy): `FT_PYTHON` or `.venv/bin/python`.
/// `None` (with a message) when it cannot import them, a failure with `FT_REQUIRE_GGUF_PY=1`.
pub fn gguf_python() -> Option<PathBuf> {
    let py = std::env::var_os("FT_PYTHON").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python"));
    let ok = Command::new(&py).args(["-c", "import gguf, numpy"]).output().is_ok_and(|o| o.status.success());
    if ok {
        return Some(py);
    }
    assert!(std::env::var("FT_REQUIRE_GGUF_PY").as_deref() != Ok("1"), "FT_REQUIRE_GGUF_PY=1 but {} cannot import gguf (run .ci/install-python.sh)", py.display());
    eprintln!("skipping GGUF tests: {} cannot import gguf and numpy (run .ci/install-python.sh)", py.display());
    None
}

/// A scratch folder of this test process.
pub fn gguf_scratch(what: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ft-actor-gguf-{}-{what}", std::process::id()));
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

/// Converts `src` (a checkpoint folder) with tests/python/hf_to_gguf.py to `<what>.gguf` of `kind` and its twin; returns (gguf, twin).
pub fn gguf_convert(py: &Path, src: &Path, what: &str, kind: &str, extra: &[&str]) -> (PathBuf, PathBuf) {
    let dir = gguf_scratch(what);
    let (gguf, twin) = (dir.join(format!("{what}.gguf")), dir.join("twin"));
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/hf_to_gguf.py");
    let out = Command::new(py).arg(&script).arg(src).arg(&gguf).arg(&twin).arg(kind).args(extra).output().expect("run hf_to_gguf.py");
    assert!(out.status.success(), "hf_to_gguf.py {} {kind}: {}", src.display(), String::from_utf8_lossy(&out.stderr));
    (gguf, twin)
}

