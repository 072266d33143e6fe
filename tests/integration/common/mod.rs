//! Shared helpers for integration tests: fixture paths, reference tensors, comparisons.
#![allow(dead_code)]

use ft_actor::model::{Model, WeightFiles};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

/// The repository root: `$FT_REPO_DIR` where a test binary runs away from the tree it was
/// built in (scripts/gpu-check.sh with prebuilt binaries), else the crate's own folder.
pub fn repo_dir() -> PathBuf {
    std::env::var_os("FT_REPO_DIR").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

/// `tests/fixtures/<name>`.
pub fn fixture(name: &str) -> PathBuf {
    repo_dir().join("tests/fixtures").join(name)
}

/// The parsed `reference.json` of a fixture. Python's json writes an unbounded margin as a
/// bare `Infinity`, which JSON does not have: it reads as null.
pub fn reference_json(name: &str) -> serde_json::Value {
    let path = fixture(name).join("reference.json");
    let text = std::fs::read_to_string(&path).expect("reference.json").replace(": Infinity", ": null");
    serde_json::from_str(&text).expect("reference.json parses")
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

/// The CPU backend with int8-quantized activations in block-quantized products (the
/// engine's default `quant_dot`), SIMD auto, 2 threads.
pub fn cpu_backend_int8() -> Arc<dyn ft_backend::Backend> {
    let opts = ft_backend_cpu::CpuOptions { threads: Some(2), quant_dot: ft_backend_cpu::QuantDot::Int8, ..Default::default() };
    Arc::new(ft_backend_cpu::CpuBackend::new(opts).expect("cpu backend"))
}

/// Loads `path` on [`cpu_backend_int8`].
pub fn load_path_int8(path: &Path) -> Model {
    Model::load(path, cpu_backend_int8(), &mut |_, _| {}).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
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
/// prefill, equal measured bandwidths (so the hybrid split sends half of the misses each way),
/// f32 activations and f32 KV caches, so that its logits compare with the f32 reference at 1e-3
/// (tests/integration/kv_dtype.rs checks the default f16 caches; tests/batching/batching.rs, quantized.rs and
/// gguf.rs the default reduced-precision activations).
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
        kv_dtype: ft_backend::DType::F32,
        quant_dot: ft_actor::engine::QuantDot::Exact,
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

/// The scratch folders this process made, removed when it exits.
static MADE: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());

extern "C" {
    fn atexit(f: extern "C" fn()) -> std::os::raw::c_int;
}

extern "C" fn remove_scratch() {
    if let Ok(made) = MADE.lock() {
        for d in made.iter() {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// `<temp>/<prefix><pid>-<what>`, a scratch folder of this test process, removed when the
/// process exits (libtest has no teardown; the C runtime's exit handlers run after its last test,
/// pass or fail). The GGUF and quantized tests write ~2 GB a run: left behind until the next
/// run's sweep, they filled a nearly full CI disk. The first call still removes the folders of
/// earlier runs whose process has ended (killed runs never reach their exit handlers).
pub fn scratch_dir(prefix: &str, what: &str) -> PathBuf {
    static REGISTER: std::sync::Once = std::sync::Once::new();
    // SAFETY: `atexit` takes a plain function pointer; `remove_scratch` only takes a lock and
    // removes folders.
    REGISTER.call_once(|| unsafe {
        atexit(remove_scratch);
    });
    static SWEPT: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let tmp = std::env::temp_dir();
    if let Ok(mut swept) = SWEPT.lock() {
        if !swept.iter().any(|p| p == prefix) {
            swept.push(prefix.to_string());
            for entry in std::fs::read_dir(&tmp).into_iter().flatten().flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let pid = name.strip_prefix(prefix).and_then(|rest| rest.split('-').next()).and_then(|p| p.parse::<u32>().ok());
                // Only where /proc tells which processes are alive (Linux); elsewhere nothing goes.
                let ended = |p: u32| Path::new("/proc/self").exists() && !Path::new(&format!("/proc/{p}")).exists();
                if pid.is_some_and(|p| p != std::process::id() && ended(p)) {
                    let _ = std::fs::remove_dir_all(entry.path());
                }
            }
        }
    }
    let d = tmp.join(format!("{prefix}{}-{what}", std::process::id()));
    std::fs::create_dir_all(&d).expect("scratch dir");
    if let Ok(mut made) = MADE.lock() {
        made.push(d.clone());
    }
    d
}

/// A scratch folder of this test process for GGUF files.
pub fn gguf_scratch(what: &str) -> PathBuf {
    scratch_dir("ft-actor-gguf-", what)
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

/// With int8-quantized activations (the engine's default `quant_dot`), against the exact
/// product: the prompt but its last token is prefilled (more than 4 tokens take bf16
/// activations and bf16-rounded weights on CPUs with AVX-512 BF16, the exact path elsewhere),
/// then each decode step is one pass of int8 products. Its logits
/// must stay within [`INT8_TOL`] of their scale, and greedy tokens must be identical until a
/// step where the exact model's two best logits are closer than twice the logit difference
/// seen there (a near-tie the rounding may flip; the sequences part, so the comparison stops).
///
/// The tolerance is loose because these tiny random-weight MoE models are chaotic: rounding
/// the weights to Q8_0 alone moves their logits by 1.6e-2 to 1.2e-1 of their scale against the
/// transformers reference (qwen3_moe, mixtral), and a small change can flip a router choice.
/// Measured here: 1e-2 to 1.2e-1 of the scale per step, 2.7e-1 once (deepseek_v3 Q4_0, a
/// single int8 pass), 2.8e-1 for qwen3_5_moe NVFP4 p1 after an exact prefill and 3.9e-1 after
/// a bf16 one (its gated-delta state carries the prefill's rounding into every step). A wrong
/// scale or code moves logits by their whole scale and more; the precise checks are the kernel
/// tests in `ft-backend-cpu` (exact on int8-representable activations, within the rounding
/// bound otherwise, bf16 products within f32 accumulation of the rounded reference).
pub const INT8_TOL: f32 = 0.5;

pub fn assert_int8_model(what: &str, a: &Model, b: &Model, prompts: &[Vec<u32>]) {
    for (p, ids) in prompts.iter().enumerate() {
        let n = 8;
        let mut sa = ft_actor::kv::SequenceState::new(a, ids.len() + n).unwrap();
        let mut sb = ft_actor::kv::SequenceState::new(b, ids.len() + n).unwrap();
        let (head, last) = ids.split_at(ids.len() - 1);
        if !head.is_empty() {
            a.forward(&mut sa, head, ft_actor::model::Logits::Last).unwrap();
            b.forward(&mut sb, head, ft_actor::model::Logits::Last).unwrap();
        }
        let (mut worst, mut next) = (0f32, last[0]);
        for step in 0..n {
            let la = a.forward(&mut sa, &[next], ft_actor::model::Logits::Last).unwrap();
            let lb = b.forward(&mut sb, &[next], ft_actor::model::Logits::Last).unwrap();
            let scale = lb.iter().fold(1f32, |m, v| m.max(v.abs()));
            let d = max_abs_diff(&la, &lb);
            worst = worst.max(d / scale);
            assert!(d <= INT8_TOL * scale, "{what} p{p} step {step}: logits differ by {d} (scale {scale})");
            let (ta, tb) = (argmax(&la), argmax(&lb));
            if ta != tb {
                let mut sorted = lb.clone();
                sorted.sort_by(|x, y| y.total_cmp(x));
                let margin = sorted[0] - sorted[1];
                assert!(margin <= 2.0 * d, "{what} p{p}: greedy token {step} differs ({ta} vs {tb}) with margin {margin} > 2 × {d}");
                println!("{what} p{p}: greedy parts at step {step}, a near-tie (margin {margin:.2e}, logit difference {d:.2e})");
                break;
            }
            next = tb;
        }
        println!("{what} p{p}: per-step logits differ by up to {worst:.2e} of their scale");
    }
}

/// 16 greedy decode steps of fixture `name`'s prompt `p` with the model's state: every step's
/// logits within 1e-3 of transformers' and the tokens identical; then token-by-token equals a
/// full recompute over prompt + generated tokens within 1e-4. Returns the worst differences
/// (decode steps, incremental vs full).
pub fn check_greedy_decode(model: &Model, name: &str, p: usize, ids: &[u32]) -> (f32, f32) {
    use ft_actor::kv::SequenceState;
    use ft_actor::model::Logits;
    let (r, refs) = (reference_json(name), reference_tensors(name));
    let vocab = model.config().vocab_size;
    let mut state = SequenceState::new(model, ids.len() + 16).unwrap();
    let mut step = model.forward(&mut state, ids, Logits::Last).unwrap();
    let gen_ref = tensor(&refs, &format!("gen_logits.p{p}"));
    let want: Vec<u32> = r["generation"][p]["new_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
    let (mut got, mut steps, mut worst) = (vec![], vec![], (0f32, 0f32));
    for s in 0..16 {
        let d = max_abs_diff(&step, &gen_ref[s * vocab..(s + 1) * vocab]);
        assert!(d <= 1e-3, "{name} p{p}: decode step {s} logits differ by {d}");
        worst.0 = worst.0.max(d);
        let next = argmax(&step);
        got.push(next);
        steps.push(step.clone());
        if s < 15 {
            step = model.forward(&mut state, &[next], Logits::Last).unwrap();
        }
    }
    assert_eq!(got, want, "{name} p{p}: greedy tokens");
    let mut all = ids.to_vec();
    all.extend(&got[..15]);
    let mut state = SequenceState::new(model, all.len()).unwrap();
    let full = model.forward(&mut state, &all, Logits::All).unwrap();
    for (s, inc) in steps.iter().enumerate() {
        let row = &full[(ids.len() - 1 + s) * vocab..(ids.len() + s) * vocab];
        let d = max_abs_diff(inc, row);
        assert!(d <= 1e-4, "{name} p{p}: incremental step {s} vs full recompute differs by {d}");
        worst.1 = worst.1.max(d);
    }
    worst
}
