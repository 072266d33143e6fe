//! GGUF files as llama.cpp lays them out, written from the shared fixtures (and a synthetic
//! model whose rows fit the 256-value K-quant blocks) by `tests/python/hf_to_gguf.py` with
//! PyPI's `gguf` package, against:
//! - the transformers reference, for f32 GGUFs (tolerances as in `fixture_models.rs`: logits
//!   within 1e-3, 16 greedy tokens identical);
//! - their dequantized f32 twins, for every block type (the twin's values are decoded by
//!   gguf-py's numpy reference, not by the engine): logits within 1e-3 of the largest logit
//!   magnitude (at least 1e-3 absolute), the kernels computing the f32 product of the
//!   dequantized weights, 16 greedy tokens identical.
//!
//! Without Python and `gguf` the tests say so and pass, unless `FT_REQUIRE_GGUF_PY=1` (CI).

use crate::common::*;
use ft_actor::kv::SequenceState;
use ft_actor::model::embedding::Embedding;
use ft_actor::model::{Logits, Model};
use ft_actor::tokenizer::Tokenizer;
use ft_actor::engine::{Engine, EngineRequest, GenEvent};
use ft_actor::policy::MoeMode;
use ft_backend::DType;
use std::path::{Path, PathBuf};

/// Logits of every prompt agree within 1e-3 of their scale and greedy tokens are identical.
fn assert_same_model(what: &str, a: &Model, b: &Model, prompts: &[Vec<u32>]) {
    assert_close_model(what, a, b, prompts, 1e-3);
}

/// Logits of every prompt agree within `tol` of their scale and greedy tokens are identical.
fn assert_close_model(what: &str, a: &Model, b: &Model, prompts: &[Vec<u32>], tol: f32) {
    for (p, ids) in prompts.iter().enumerate() {
        let mut sa = SequenceState::new(a, ids.len()).unwrap();
        let mut sb = SequenceState::new(b, ids.len()).unwrap();
        let la = a.forward(&mut sa, ids, Logits::All).unwrap();
        let lb = b.forward(&mut sb, ids, Logits::All).unwrap();
        let scale = lb.iter().fold(1f32, |m, v| m.max(v.abs()));
        let d = max_abs_diff(&la, &lb);
        assert!(d <= tol * scale, "{what} p{p}: logits differ by {d} (scale {scale}, tolerance {tol})");
        assert_eq!(greedy(a, ids, 16), greedy(b, ids, 16), "{what} p{p}: greedy tokens");
    }
}

/// (fixture, GGUF type, the dtype its experts must keep).
const FIXTURE_CASES: &[(&str, &str, DType)] = &[
    ("qwen3_moe", "q8_0", DType::Q8_0),
    ("qwen3_moe", "q4_0", DType::Q4_0),
    ("qwen3_moe", "mxfp4", DType::Mxfp4),
    ("qwen3_moe", "bf16", DType::BF16),
    ("qwen3_moe", "f16", DType::F16),
    ("qwen2_moe", "q8_0", DType::Q8_0),
    ("qwen2_moe", "q4_0", DType::Q4_0),
    ("mixtral", "q8_0", DType::Q8_0),
    ("mixtral", "q4_0", DType::Q4_0),
    ("deepseek_v3", "q8_0", DType::Q8_0),
    ("deepseek_v3", "q4_0", DType::Q4_0),
    ("glm4_moe", "q8_0", DType::Q8_0),
    ("glm4_moe", "q4_0", DType::Q4_0),
    ("gpt_oss", "mxfp4", DType::Mxfp4),
    ("gpt_oss", "q8_0", DType::Q8_0),
    ("qwen3_next", "q8_0", DType::Q8_0),
    ("qwen3_next", "q4_0", DType::Q4_0),
    ("qwen3_5_moe", "q8_0", DType::Q8_0),
    ("qwen3_5_moe", "q4_0", DType::Q4_0),
];

/// Fixtures with Gated DeltaNet layers. Their tiny random weights make them far more sensitive
/// than the others: rounding the weights to Q8_0 alone moves their logits by up to 1.05 of their
/// scale against the f32 checkpoint (Q4_0: 1.4; qwen3_moe: 0.15), the recurrent state carrying
/// each step's error on, and one int8 pass moves them by up to 0.56 (Q4_0), so
/// [`INT8_TOL`] cannot tell rounding from a fault there. Their exact kernels are held to the
/// twin like every family's; the int8 kernels must run on their packed tensors.
const HYBRID: &[&str] = &["qwen3_next", "qwen3_5_moe"];

/// The int8 activation path runs every prompt, one token per step (so the decode-sized
/// products, where int8 applies, are the ones run), to finite logits.
fn assert_int8_runs(what: &str, m: &Model, prompts: &[Vec<u32>]) {
    for (p, ids) in prompts.iter().enumerate() {
        let mut state = SequenceState::new(m, ids.len()).unwrap();
        for (i, t) in ids.iter().enumerate() {
            let logits = m.forward(&mut state, &[*t], Logits::Last).unwrap();
            assert_eq!(logits.len(), m.config().vocab_size, "{what} p{p} step {i}: logits");
            assert!(logits.iter().all(|x| x.is_finite()), "{what} p{p} step {i}: non-finite logits");
        }
    }
}

#[test]
fn gguf_block_types_match_their_dequantized_twins() {
    let Some(py) = gguf_python() else { return };
    for &(name, kind, dtype) in FIXTURE_CASES {
        let (gguf, twin) = gguf_convert(&py, &fixture(name).join("checkpoint"), &format!("{name}-{kind}"), kind, &[]);
        let (mg, mt) = (load_path(&gguf), load_path(&twin));
        let layer = mg.config().moe_layers.iter().position(|m| *m).unwrap();
        let e = &mg.experts(layer)[0];
        assert_eq!((e.gate.dtype, e.up.dtype, e.down.dtype), (dtype, dtype, dtype), "{name} {kind}: experts stay packed");
        let (h, i) = (mg.config().hidden_size, mg.config().moe_intermediate_size);
        let bias_bytes = if e.biases.is_some() { 4 * (2 * i + h) } else { 0 };
        assert_eq!(e.size_bytes(), 2 * i * dtype.row_bytes(h) + h * dtype.row_bytes(i) + bias_bytes, "{name} {kind}: expert bytes");
        let emb = mg.embedding();
        if emb.dtype().is_quantized() {
            // Left packed in host memory (not dequantized to an f32 table at load).
            assert!(matches!(emb, Embedding::Host { .. }), "{name} {kind}: {} embedding", emb.dtype());
            assert_eq!(emb.size_bytes(), mg.config().vocab_size * emb.dtype().row_bytes(h), "{name} {kind}: embedding bytes");
        }
        assert_same_model(&format!("{name} {kind}"), &mg, &mt, &prompts(&reference_json(name)));
        if dtype.is_quantized() {
            let mi = load_path_int8(&gguf);
            if HYBRID.contains(&name) {
                assert_int8_runs(&format!("{name} {kind} int8"), &mi, &prompts(&reference_json(name)));
            } else {
                assert_int8_model(&format!("{name} {kind} int8"), &mi, &mt, &prompts(&reference_json(name)));
            }
        }
    }
}

/// A GGUF without `output.weight` (tied embeddings) whose `token_embd` is Q8_0: the packed
/// table, kept on the host for lookups, is also the output projection, and the model equals
/// its dequantized twin.
#[test]
fn tied_quantized_embedding_is_the_output_projection() {
    let Some(py) = gguf_python() else { return };
    let src = fixture("qwen3_moe").join("checkpoint");
    let tied = gguf_scratch("tied-src");
    let mut cfg: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    cfg["tie_word_embeddings"] = serde_json::json!(true);
    std::fs::write(tied.join("config.json"), cfg.to_string()).unwrap();
    for f in std::fs::read_dir(&src).unwrap().flatten() {
        let name = f.file_name();
        let weights = name.to_string_lossy().ends_with(".safetensors") || name == "model.safetensors.index.json";
        if name != "config.json" && !weights {
            std::fs::copy(f.path(), tied.join(&name)).unwrap();
        }
    }
    let files = ft_actor::model::WeightFiles::open(&src).unwrap();
    let owned: Vec<(String, Vec<usize>, Vec<u8>)> = files
        .names()
        .filter(|n| *n != "lm_head.weight")
        .map(|n| {
            let t = files.get(n).unwrap();
            (n.to_string(), t.shape.clone(), bytemuck::cast_slice(&t.to_f32()).to_vec())
        })
        .collect();
    let views = owned.iter().map(|(n, s, b)| (n.clone(), safetensors::tensor::TensorView::new(safetensors::tensor::Dtype::F32, s.clone(), b).unwrap()));
    safetensors::serialize_to_file(views, None, &tied.join("model.safetensors")).unwrap();
    let (gguf, twin) = gguf_convert(&py, &tied, "tied-q8_0", "q8_0", &[]);
    let (mg, mt) = (load_path(&gguf), load_path(&twin));
    assert!(mg.config().tie_word_embeddings);
    assert!(matches!(mg.embedding(), Embedding::Host { dtype: DType::Q8_0, .. }), "{}", mg.embedding().dtype());
    assert_same_model("tied q8_0", &mg, &mt, &prompts(&reference_json("qwen3_moe")));
}

/// Files converted with llama.cpp's `--fuse-gate-up-exps` (one `ffn_gate_up_exps [E, 2I, H]`
/// per layer, which llama.cpp reads for DeepSeek-V2/V3, Qwen3-Next and Qwen3.5-MoE): split
/// back into per-expert gate and up views, still packed, equal to their twins.
#[test]
fn fused_gate_up_experts_match_their_twins() {
    let Some(py) = gguf_python() else { return };
    for (name, kind, dtype) in [("qwen3_moe", "q8_0", DType::Q8_0), ("deepseek_v3", "q4_0", DType::Q4_0), ("qwen3_5_moe", "q8_0", DType::Q8_0)] {
        let (gguf, twin) = gguf_convert(&py, &fixture(name).join("checkpoint"), &format!("{name}-{kind}-fused"), kind, &["--fuse-gate-up"]);
        let (mg, mt) = (load_path(&gguf), load_path(&twin));
        let layer = mg.config().moe_layers.iter().position(|m| *m).unwrap();
        let e = &mg.experts(layer)[1];
        assert_eq!((e.gate.dtype, e.up.dtype, e.down.dtype), (dtype, dtype, dtype), "{name} {kind}: experts stay packed");
        assert_eq!((e.gate.rows, e.up.rows), (mg.config().moe_intermediate_size, mg.config().moe_intermediate_size));
        assert_same_model(&format!("{name} {kind} fused gate/up"), &mg, &mt, &prompts(&reference_json(name)));
    }
}

/// Files converted with llama.cpp's `--fuse-qkv` (one `attn_qkv` weight, and bias where the
/// family has them): split back into the query, key and value projections (llama's permuted
/// query/key rows restored), equal to their twins; the bias is still recognised as such.
#[test]
fn fused_qkv_matches_the_twins() {
    let Some(py) = gguf_python() else { return };
    for (name, kind) in [("qwen3_moe", "q8_0"), ("qwen2_moe", "q4_0"), ("mixtral", "q8_0"), ("gpt_oss", "q8_0")] {
        let (gguf, twin) = gguf_convert(&py, &fixture(name).join("checkpoint"), &format!("{name}-{kind}-qkv"), kind, &["--fuse-qkv"]);
        let (mg, mt) = (load_path(&gguf), load_path(&twin));
        assert_eq!(mg.config().qkv_bias, mt.config().qkv_bias, "{name}: bias flag");
        assert_same_model(&format!("{name} {kind} fused q/k/v"), &mg, &mt, &prompts(&reference_json(name)));
    }
}

#[test]
fn f32_gguf_matches_the_transformers_reference() {
    let Some(py) = gguf_python() else { return };
    for name in ["qwen3_moe", "qwen2_moe", "mixtral", "gpt_oss", "deepseek_v3", "glm4_moe", "qwen3_next", "qwen3_5_moe"] {
        let (gguf, _) = gguf_convert(&py, &fixture(name).join("checkpoint"), &format!("{name}-ref"), "f32", &[]);
        let model = load_path(&gguf);
        let r = reference_json(name);
        let refs = reference_tensors(name);
        for (p, ids) in prompts(&r).iter().enumerate() {
            let mut state = SequenceState::new(&model, ids.len()).unwrap();
            let logits = model.forward(&mut state, ids, Logits::All).unwrap();
            let d = max_abs_diff(&logits, &tensor(&refs, &format!("logits.p{p}")));
            assert!(d <= 1e-3, "{name} p{p}: GGUF logits differ from transformers by {d}");
            let want: Vec<u32> = r["generation"][p]["new_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
            assert_eq!(greedy(&model, ids, want.len()), want, "{name} p{p}: greedy tokens");
        }
    }
}

/// A small Qwen3-MoE-shaped model whose rows are whole 256-value blocks (the fixtures' 64-wide
/// rows cannot hold K-quants; llama-quantize would fall back to Q8_0 for them).
fn synth_k_model() -> PathBuf {
    let out = gguf_scratch("synth-k").join("model");
    let opts = ft_actor::synth::SynthOptions {
        like: "qwen3-30b-a3b".into(),
        layers: Some(4),
        hidden: Some(256),
        experts: Some(8),
        dtype: "f32".into(),
        out: out.clone(),
        overwrite: true,
        ..Default::default()
    };
    ft_actor::synth::synth(&opts, |_, _| {}).expect("synth");
    out
}

#[test]
fn k_quants_match_their_dequantized_twins() {
    let Some(py) = gguf_python() else { return };
    let src = synth_k_model();
    let prompt: Vec<Vec<u32>> = vec![(1..40).map(|i| (i * 37) % 1000).collect()];
    for (kind, dtype) in [("q4_k", DType::Q4K), ("q5_k", DType::Q5K), ("q6_k", DType::Q6K), ("q4_k_m", DType::Q4K)] {
        let (gguf, twin) = gguf_convert(&py, &src, &format!("synth-{kind}"), kind, &[]);
        let (mg, mt) = (load_path(&gguf), load_path(&twin));
        let e = &mg.experts(0)[0];
        assert_eq!((e.gate.dtype, e.up.dtype), (dtype, dtype), "{kind}: experts stay packed");
        assert_same_model(&format!("synth {kind}"), &mg, &mt, &prompt);
        assert_int8_model(&format!("synth {kind} int8"), &load_path_int8(&gguf), &mt, &prompt);
        if kind == "q4_k_m" {
            // llama-quantize's mix: ffn_down in Q6_K for layers 2 and 3 of 4, Q4_K for 0 and 1.
            let downs: Vec<DType> = (0..4).map(|l| mg.experts(l)[0].down.dtype).collect();
            assert_eq!(downs, [DType::Q4K, DType::Q4K, DType::Q6K, DType::Q6K]);
            // Cache slots then hold experts of both kinds in turn. The engine runs its default
            // int8 activations, so the direct forward pass it must equal does too.
            let want = greedy(&load_path_int8(&gguf), &prompt[0], 8);
            for mode in [MoeMode::Offload, MoeMode::Hybrid] {
                assert_eq!(pipeline_tokens(&gguf, 4, mode, &prompt[0], 8), want, "Q4_K_M through {mode} with 4 slots");
            }
        }
    }
}

/// Greedy tokens through the engine's actor pipeline with `slots` expert cache slots and its
/// default int8 activations.
fn pipeline_tokens(model: &Path, slots: u64, mode: MoeMode, prompt: &[u32], n: usize) -> Vec<u32> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let mut config = pipeline_config(model.to_path_buf(), slots, mode);
    config.quant_dot = ft_actor::engine::QuantDot::Int8;
    rt.block_on(async {
        let engine = Engine::spawn(config, None).await.unwrap_or_else(|e| panic!("{mode}: {e}"));
        let mut req = EngineRequest::greedy(prompt.to_vec(), n);
        req.ignore_eos = true;
        let mut stream = engine.generate(req).await.unwrap();
        let mut got = vec![];
        while let Some(ev) = stream.next().await {
            match ev {
                GenEvent::Token { id, .. } => got.push(id),
                GenEvent::Done(_) => break,
                GenEvent::Error(e) => panic!("{mode}: {e}"),
            }
        }
        got
    })
}

fn gguf_single(py: &Path) -> PathBuf {
    gguf_convert(py, &fixture("qwen3_moe").join("checkpoint"), "single", "q8_0", &[]).0
}

#[test]
fn split_and_blob_gguf_files_open() {
    let Some(py) = gguf_python() else { return };
    let (gguf, twin) = gguf_convert(&py, &fixture("qwen3_moe").join("checkpoint"), "split", "q8_0", &["--split", "3"]);
    let dir = gguf.parent().unwrap();
    let mut parts: Vec<String> = std::fs::read_dir(dir).unwrap().filter_map(|e| e.ok()?.file_name().into_string().ok()).filter(|n| n.ends_with(".gguf")).collect();
    parts.sort();
    assert_eq!(parts, ["split-00001-of-00003.gguf", "split-00002-of-00003.gguf", "split-00003-of-00003.gguf"]);
    let first = dir.join(&parts[0]);
    assert_same_model("split", &load_path(&first), &load_path(&twin), &prompts(&reference_json("qwen3_moe")));
    // Ollama keeps a model as a blob named by its digest, without an extension.
    let blob = dir.join("sha256-0123abcd");
    std::fs::copy(&gguf_single(&py), &blob).unwrap();
    assert_same_model("blob", &load_path(&blob), &load_path(&twin), &prompts(&reference_json("qwen3_moe")));
    let err = Model::load(&dir.join(&parts[1]), cpu_backend(), &mut |_, _| {}).err().expect("a later split is refused").to_string();
    assert!(err.contains("00001"), "the error points at the first split: {err}");
}

#[test]
fn gguf_tokenizer_and_template_equal_the_folders() {
    let Some(py) = gguf_python() else { return };
    let src = fixture("qwen3_moe").join("checkpoint");
    let (gguf, _) = gguf_convert(&py, &src, "tokenizer", "q8_0", &[]);
    let (tg, tf) = (Tokenizer::open(&gguf).expect("GGUF tokenizer"), Tokenizer::from_dir(&src).expect("folder tokenizer"));
    let cases: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(fixture("tokenizer").join("cases.json")).unwrap()).unwrap();
    for case in cases["encode"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let ids = tg.encode(text, false).unwrap();
        assert_eq!(ids, tf.encode(text, false).unwrap(), "{text:?}");
        assert_eq!(tg.decode(&ids, true).unwrap(), tf.decode(&ids, true).unwrap(), "{text:?}");
        assert_eq!(tg.decode(&ids, false).unwrap(), tf.decode(&ids, false).unwrap(), "{text:?}");
    }
    assert_eq!(tg.eos_token_id(), tf.eos_token_id());
    assert_eq!(tg.special_ids(), tf.special_ids());
    let (cg, cf) = (ft_actor::chat::ChatTemplate::from_tokenizer(&tg).unwrap(), ft_actor::chat::ChatTemplate::from_tokenizer(&tf).unwrap());
    assert_eq!(cg.source(), cf.source());
    let req = ft_actor::chat::ChatRequest {
        messages: vec![serde_json::json!({"role": "system", "content": "Be brief."}), serde_json::json!({"role": "user", "content": "Hello"})],
        add_generation_prompt: true,
        ..Default::default()
    };
    assert_eq!(cg.render(&req).unwrap(), cf.render(&req).unwrap());
}

/// Rewrites a copy of `src` with `edit` applied to its bytes.
fn edited(src: &Path, what: &str, edit: impl FnOnce(&mut Vec<u8>)) -> PathBuf {
    let mut bytes = std::fs::read(src).unwrap();
    edit(&mut bytes);
    let out = gguf_scratch("bad").join(format!("{what}.gguf"));
    std::fs::write(&out, bytes).unwrap();
    out
}

fn load_err(path: &Path) -> String {
    match Model::load(path, cpu_backend(), &mut |_, _| {}) {
        Ok(_) => panic!("{} loaded", path.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_gguf_files_are_clear_errors() {
    let Some(py) = gguf_python() else { return };
    let src = fixture("qwen3_moe").join("checkpoint");
    let (good, _) = gguf_convert(&py, &src, "good", "q8_0", &[]);
    let len = std::fs::metadata(&good).unwrap().len() as usize;

    let truncated = edited(&good, "truncated", |b| b.truncate(len - 1000));
    let e = load_err(&truncated);
    assert!(e.contains("truncated.gguf") && e.contains("past the end"), "{e}");
    let header_only = edited(&good, "header-only", |b| b.truncate(100));
    let e = load_err(&header_only);
    assert!(e.contains("header-only.gguf"), "{e}");
    let not_gguf = edited(&good, "not-gguf", |b| b[..4].copy_from_slice(b"GGML"));
    assert!(load_err(&not_gguf).contains("not a GGUF file"), "{}", load_err(&not_gguf));

    let arch = edited(&good, "arch", |b| {
        let at = b.windows(8).position(|w| w == b"qwen3moe").unwrap();
        b[at..at + 8].copy_from_slice(b"qwen9moe");
    });
    let e = load_err(&arch);
    assert!(e.contains("qwen9moe") && e.contains("qwen3moe"), "names the architecture and the supported ones: {e}");

    let (q41, _) = gguf_convert(&py, &src, "q4_1", "q4_1", &[]);
    let e = load_err(&q41);
    assert!(e.contains("Q4_1") && e.contains("token_embd.weight") && e.contains("q4_1.gguf"), "names the type, the tensor and the file: {e}");

    let no_tokens = edited(&good, "no-tokens", |b| {
        let at = b.windows(21).position(|w| w == b"tokenizer.ggml.tokens").unwrap();
        b[at + 15] = b'X';
    });
    let e = Tokenizer::open(&no_tokens).err().expect("no token list").to_string();
    assert!(e.contains("tokenizer.ggml.tokens") && e.contains("no-tokens.gguf"), "{e}");
}

/// A GGUF model through the actor pipeline — expert cache slots, every miss mode — gives the
/// tokens of the direct forward pass.
#[test]
fn gguf_runs_through_the_pipeline_in_every_moe_mode() {
    let Some(py) = gguf_python() else { return };
    let (gguf, _) = gguf_convert(&py, &fixture("qwen3_moe").join("checkpoint"), "pipeline", "q4_0", &[]);
    let prompt = prompts(&reference_json("qwen3_moe"))[0].clone();
    // The engine's default int8 activations, on both sides.
    let want = greedy(&load_path_int8(&gguf), &prompt, 12);
    for slots in [0, 4] {
        for mode in [MoeMode::Offload, MoeMode::Cpu, MoeMode::Hybrid] {
            assert_eq!(pipeline_tokens(&gguf, slots, mode, &prompt, 12), want, "GGUF slots={slots} mode={mode}: tokens");
        }
    }
}

/// `ft-actor info` on a GGUF reports what it does for the folder the GGUF was made from, plus
/// the bytes per storage format.
#[test]
fn info_on_a_gguf_shows_the_folders_facts() {
    let Some(py) = gguf_python() else { return };
    let src = fixture("qwen3_moe").join("checkpoint");
    let (gguf, _) = gguf_convert(&py, &src, "info", "q8_0", &[]);
    let info = |path: &Path, json: bool| {
        let mut args = vec!["info", "--model", path.to_str().unwrap()];
        if json {
            args.push("--json");
        }
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_ft-actor"))
            .args(&args)
            .env("XDG_CACHE_HOME", std::env::temp_dir().join("ft-actor-test-cache"))
            .output()
            .expect("run ft-actor");
        assert!(o.status.success(), "info {}: {}", path.display(), String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let (g, f): (serde_json::Value, serde_json::Value) = (serde_json::from_str(&info(&gguf, true)).unwrap(), serde_json::from_str(&info(&src, true)).unwrap());
    for key in ["architecture", "layers", "moe_layers", "hidden_size", "heads", "kv_heads", "head_dim", "experts", "experts_per_token", "vocab_size", "total_params", "active_params", "kv_bytes_per_token"] {
        assert_eq!(g[key], f[key], "{key}");
    }
    assert_eq!(g["expert_format"], "q8_0");
    assert_eq!(g["bytes_per_expert"], 2 * 32 * DType::Q8_0.row_bytes(64) + 64 * DType::Q8_0.row_bytes(32));
    let formats = g["bytes_by_format"].as_object().unwrap();
    assert!(formats["q8_0"].as_u64().unwrap() > 0 && formats["f32"].as_u64().unwrap() > 0, "{formats:?}");
    let text = info(&gguf, false);
    assert!(text.contains("formats") && text.contains("q8_0") && text.contains("memory plan"), "{text}");
}

/// A GGUF missing a tensor the architecture needs names it as the file would.
#[test]
fn a_missing_gguf_tensor_is_named_as_in_the_file() {
    let Some(py) = gguf_python() else { return };
    let (good, _) = gguf_convert(&py, &fixture("qwen3_moe").join("checkpoint"), "missing", "q8_0", &[]);
    let renamed = {
        let mut bytes = std::fs::read(&good).unwrap();
        let at = bytes.windows(22).position(|w| w == b"blk.1.attn_k_norm.weig").unwrap();
        bytes[at + 6] = b'X';
        let out = good.with_file_name("missing-k-norm.gguf");
        std::fs::write(&out, bytes).unwrap();
        out
    };
    let e = load_err(&renamed);
    assert!(e.contains("blk.1.attn_k_norm.weight") && e.contains("missing-k-norm.gguf") && e.contains("self_attn.k_norm"), "{e}");
}

