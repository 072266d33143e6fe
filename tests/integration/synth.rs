//! Integration tests of `ft_actor::synth`: synthesised checkpoints must parse with the
//! `safetensors` crate, match the planned names/shapes/dtypes, carry a complete index and
//! a config with the real model's keys.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use crate::common::test_backend;
use ft_actor::synth::{plan, synth, SynthError, SynthOptions, SynthReport, TensorPlan};
use half::{bf16, f16};
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;

/// Tensor name -> (shape, dtype) as read back from the shards.
type Found = BTreeMap<String, (Vec<usize>, Dtype)>;

/// A unique directory under the system temp dir, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let dir = std::env::temp_dir().join(format!(
            "ft-actor-synth-{tag}-{}-{nanos}",
            std::process::id()
        ));
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn st_dtype(t: &TensorPlan) -> Dtype {
    match t.dtype.size() {
        4 => Dtype::F32,
        _ if t.dtype == ft_actor::synth::SynthDtype::Bf16 => Dtype::BF16,
        _ => Dtype::F16,
    }
}

fn to_f32(dtype: Dtype, data: &[u8]) -> Vec<f32> {
    match dtype {
        Dtype::F32 => data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        Dtype::BF16 => data
            .chunks_exact(2)
            .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        Dtype::F16 => data
            .chunks_exact(2)
            .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        other => panic!("unexpected dtype {other:?}"),
    }
}

fn mean_std(v: &[f32]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().map(|&x| x as f64).sum::<f64>() / n;
    let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n;
    (mean, var.sqrt())
}

/// Runs synth, then checks every file against the plan and returns
/// (report, config, name -> (shape, dtype)).
fn synth_and_verify(opts: &SynthOptions) -> (SynthReport, Value, Found) {
    let expected = plan(opts).expect("plan");
    let mut last = (0, 0);
    let mut calls = 0;
    let report = synth(opts, |done, total| {
        assert!(
            done >= last.0 && done <= total,
            "progress went backwards or past total"
        );
        last = (done, total);
        calls += 1;
    })
    .expect("synth");
    assert!(calls > 1);
    assert_eq!(last, (report.bytes, report.bytes));
    assert_eq!(report.bytes, expected.total_bytes);
    for f in &report.files {
        assert!(f.is_file(), "{} missing", f.display());
    }

    // Every shard parses and holds exactly its planned tensors, each 8-byte aligned
    // relative to the file start for f32.
    let mut found = Found::new();
    let mut file_of: BTreeMap<String, String> = BTreeMap::new();
    for (file, _) in &expected.shards {
        let path = opts.out.join(file);
        let f = File::open(&path).expect("open shard");
        let map = unsafe { memmap2::Mmap::map(&f) }.expect("mmap");
        let (header_len, meta) = SafeTensors::read_metadata(&map).expect("header");
        assert_eq!((8 + header_len) % 8, 0, "data section not 8-byte aligned");
        let format = meta
            .metadata()
            .as_ref()
            .and_then(|m| m.get("format").cloned());
        assert_eq!(format.as_deref(), Some("pt"));
        let st = SafeTensors::deserialize(&map).expect("parse shard");
        for (name, view) in st.tensors() {
            let offset = view.data().as_ptr() as usize - map.as_ptr() as usize;
            assert_eq!(
                offset % (view.dtype().bitsize() / 8),
                0,
                "{name} misaligned"
            );
            let values = to_f32(view.dtype(), view.data());
            assert!(
                values.iter().all(|v| v.is_finite()),
                "{name} has non-finite values"
            );
            found.insert(name.clone(), (view.shape().to_vec(), view.dtype()));
            file_of.insert(name, file.clone());
        }
    }
    let planned: Found = expected
        .tensors
        .iter()
        .map(|t| (t.name.clone(), (t.shape.clone(), st_dtype(t))))
        .collect();
    assert_eq!(found, planned);

    // The index maps every tensor to the shard holding it; no index for a single file.
    let index = opts.out.join("model.safetensors.index.json");
    if expected.shards.len() > 1 {
        let idx = read_json(&index);
        assert_eq!(idx["metadata"]["total_size"].as_u64(), Some(report.bytes));
        let wm: BTreeMap<String, String> =
            serde_json::from_value(idx["weight_map"].clone()).expect("weight_map");
        assert_eq!(wm, file_of);
        assert!(!opts.out.join("model.safetensors").exists());
    } else {
        assert!(!index.exists());
        assert!(opts.out.join("model.safetensors").is_file());
    }

    for name in [
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        "special_tokens_map.json",
        "generation_config.json",
    ] {
        assert!(opts.out.join(name).is_file(), "{name} missing");
    }
    read_json(&opts.out.join("generation_config.json"));
    assert_eq!(read_json(&opts.out.join("synth.json"))["synthetic"], true);
    let config = read_json(&opts.out.join("config.json"));
    (report, config, found)
}

fn assert_keys(config: &Value, keys: &[&str]) {
    for k in keys {
        assert!(config.get(k).is_some(), "config.json lacks {k}: {config}");
    }
}

const COMMON_KEYS: &[&str] = &[
    "model_type",
    "architectures",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "num_experts_per_tok",
    "rms_norm_eps",
    "rope_theta",
    "max_position_embeddings",
    "vocab_size",
    "tie_word_embeddings",
    "torch_dtype",
    "bos_token_id",
    "eos_token_id",
];

fn shape_of(found: &Found, name: &str) -> Vec<usize> {
    found
        .get(name)
        .unwrap_or_else(|| panic!("{name} missing"))
        .0
        .clone()
}

#[test]
fn qwen3_30b_tiny_sharded() {
    let dir = TempDir::new("qwen3");
    let opts = SynthOptions {
        like: "qwen3-30b-a3b".into(),
        layers: Some(2),
        experts: Some(4),
        hidden: Some(512),
        vocab: Some(1024),
        dtype: "bf16".into(),
        out: dir.0.clone(),
        seed: 7,
        shard_bytes: 8 << 20,
        ..SynthOptions::default()
    };
    let (report, config, found) = synth_and_verify(&opts);
    let shards = report
        .files
        .iter()
        .filter(|f| f.extension().is_some_and(|e| e == "safetensors"))
        .count();
    assert!(shards > 1, "expected several shards, got {shards}");

    assert_keys(&config, COMMON_KEYS);
    assert_keys(
        &config,
        &[
            "moe_intermediate_size",
            "head_dim",
            "num_experts",
            "norm_topk_prob",
            "decoder_sparse_step",
            "mlp_only_layers",
        ],
    );
    assert_eq!(config["model_type"], "qwen3_moe");
    assert_eq!(config["architectures"][0], "Qwen3MoeForCausalLM");
    assert_eq!(config["num_experts"], 4);
    assert_eq!(config["num_experts_per_tok"], 4);
    assert_eq!(config["num_hidden_layers"], 2);
    assert_eq!(config["head_dim"], 128);
    assert_eq!(config["rope_theta"].as_f64(), Some(1e6));
    assert_eq!(config["torch_dtype"], "bfloat16");
    assert_eq!(config["max_position_embeddings"], 40960);

    // 1 embed + per layer (2 norms + 4 proj + 2 qk-norms + router + 4 experts x 3) + norm + head.
    assert_eq!(found.len(), 3 + 2 * (2 + 4 + 2 + 1 + 12));
    assert_eq!(shape_of(&found, "model.embed_tokens.weight"), [1024, 512]);
    assert_eq!(
        shape_of(&found, "model.layers.1.self_attn.q_proj.weight"),
        [32 * 128, 512]
    );
    assert_eq!(
        shape_of(&found, "model.layers.1.self_attn.k_proj.weight"),
        [4 * 128, 512]
    );
    assert_eq!(
        shape_of(&found, "model.layers.1.self_attn.o_proj.weight"),
        [512, 32 * 128]
    );
    assert_eq!(
        shape_of(&found, "model.layers.0.self_attn.q_norm.weight"),
        [128]
    );
    assert_eq!(shape_of(&found, "model.layers.0.mlp.gate.weight"), [4, 512]);
    assert_eq!(
        shape_of(&found, "model.layers.1.mlp.experts.3.gate_proj.weight"),
        [768, 512]
    );
    assert_eq!(
        shape_of(&found, "model.layers.1.mlp.experts.3.down_proj.weight"),
        [512, 768]
    );
    assert_eq!(shape_of(&found, "lm_head.weight"), [1024, 512]);
    assert!(found.values().all(|(_, d)| *d == Dtype::BF16));

    // Value scales: weights ~N(0, 0.02), norms ~1, router spread ~1/sqrt(hidden).
    let shard_with = |name: &str| -> Vec<f32> {
        let idx = read_json(&dir.0.join("model.safetensors.index.json"));
        let file = idx["weight_map"][name]
            .as_str()
            .expect("indexed")
            .to_string();
        let bytes = std::fs::read(dir.0.join(file)).expect("read");
        let st = SafeTensors::deserialize(&bytes).expect("parse");
        let v = st.tensor(name).expect("tensor");
        to_f32(v.dtype(), v.data())
    };
    let (m, s) = mean_std(&shard_with("model.layers.0.self_attn.q_proj.weight"));
    assert!(
        m.abs() < 1e-3 && (s - 0.02).abs() < 1e-3,
        "q_proj mean {m} std {s}"
    );
    let (m, s) = mean_std(&shard_with("model.layers.0.input_layernorm.weight"));
    assert!((m - 1.0).abs() < 0.01 && s < 0.05, "norm mean {m} std {s}");
    let (_, s) = mean_std(&shard_with("model.layers.0.mlp.gate.weight"));
    let want = 1.0 / (512f64).sqrt();
    assert!((s - want).abs() < 0.1 * want, "router std {s}, want {want}");
}

#[test]
fn other_shapes_one_layer() {
    struct Case {
        like: &'static str,
        layers: usize,
        hidden: usize,
        dtype: &'static str,
        model_type: &'static str,
        keys: &'static [&'static str],
        must_have: &'static [(&'static str, &'static [usize])],
    }
    let cases = [
        Case {
            like: "qwen3-235b-a22b",
            layers: 1,
            hidden: 256,
            dtype: "bf16",
            model_type: "qwen3_moe",
            keys: &[
                "num_experts",
                "moe_intermediate_size",
                "head_dim",
                "norm_topk_prob",
            ],
            must_have: &[
                ("model.layers.0.self_attn.q_proj.weight", &[64 * 128, 256]),
                ("model.layers.0.mlp.experts.1.up_proj.weight", &[1536, 256]),
            ],
        },
        Case {
            like: "qwen2-57b-a14b",
            layers: 1,
            hidden: 224, // 28 heads x head_dim 8
            dtype: "f32",
            model_type: "qwen2_moe",
            keys: &[
                "num_experts",
                "moe_intermediate_size",
                "shared_expert_intermediate_size",
                "norm_topk_prob",
            ],
            must_have: &[
                ("model.layers.0.self_attn.q_proj.bias", &[224]),
                ("model.layers.0.self_attn.k_proj.bias", &[4 * 8]),
                (
                    "model.layers.0.mlp.experts.1.down_proj.weight",
                    &[224, 2560],
                ),
                (
                    "model.layers.0.mlp.shared_expert.gate_proj.weight",
                    &[20480, 224],
                ),
                ("model.layers.0.mlp.shared_expert_gate.weight", &[1, 224]),
            ],
        },
        Case {
            like: "mixtral-8x7b",
            layers: 1,
            hidden: 256, // 32 heads x head_dim 8
            dtype: "f16",
            model_type: "mixtral",
            keys: &["num_local_experts"],
            must_have: &[
                ("model.layers.0.block_sparse_moe.gate.weight", &[2, 256]),
                (
                    "model.layers.0.block_sparse_moe.experts.1.w1.weight",
                    &[14336, 256],
                ),
                (
                    "model.layers.0.block_sparse_moe.experts.1.w2.weight",
                    &[256, 14336],
                ),
                (
                    "model.layers.0.block_sparse_moe.experts.1.w3.weight",
                    &[14336, 256],
                ),
                ("model.layers.0.self_attn.k_proj.weight", &[8 * 8, 256]),
            ],
        },
        Case {
            // Layer 0 is dense (first_k_dense_replace = 1), so two layers to get a MoE one.
            like: "glm-4.5-air",
            layers: 2,
            hidden: 256,
            dtype: "bf16",
            model_type: "glm4_moe",
            keys: &[
                "n_routed_experts",
                "n_shared_experts",
                "first_k_dense_replace",
                "partial_rotary_factor",
                "routed_scaling_factor",
                "n_group",
                "topk_group",
                "use_qk_norm",
                "attention_bias",
                "head_dim",
            ],
            must_have: &[
                ("model.layers.0.mlp.gate_proj.weight", &[10944, 256]),
                ("model.layers.0.mlp.down_proj.weight", &[256, 10944]),
                ("model.layers.1.self_attn.q_proj.weight", &[96 * 128, 256]),
                ("model.layers.1.self_attn.v_proj.bias", &[8 * 128]),
                ("model.layers.1.mlp.gate.weight", &[2, 256]),
                ("model.layers.1.mlp.gate.e_score_correction_bias", &[2]),
                (
                    "model.layers.1.mlp.experts.1.gate_proj.weight",
                    &[1408, 256],
                ),
                (
                    "model.layers.1.mlp.shared_experts.down_proj.weight",
                    &[256, 1408],
                ),
            ],
        },
    ];
    for case in cases {
        let dir = TempDir::new(case.model_type);
        let opts = SynthOptions {
            like: case.like.into(),
            layers: Some(case.layers),
            experts: Some(2),
            hidden: Some(case.hidden),
            vocab: Some(1024),
            dtype: case.dtype.into(),
            out: dir.0.clone(),
            seed: 1,
            shard_bytes: 32 << 20,
            ..SynthOptions::default()
        };
        let (_, config, found) = synth_and_verify(&opts);
        assert_eq!(config["model_type"], case.model_type, "{}", case.like);
        assert_keys(&config, COMMON_KEYS);
        assert_keys(&config, case.keys);
        assert_eq!(
            config["num_hidden_layers"].as_u64(),
            Some(case.layers as u64)
        );
        for (name, shape) in case.must_have {
            assert_eq!(shape_of(&found, name), *shape, "{}: {name}", case.like);
        }
        if case.model_type == "glm4_moe" {
            let bias = &found["model.layers.1.mlp.gate.e_score_correction_bias"];
            assert_eq!(bias.1, Dtype::F32, "routing bias must stay f32");
            assert!(!found.contains_key("model.layers.0.mlp.gate.weight"));
            assert!(!found.contains_key("model.layers.0.self_attn.q_norm.weight"));
        }
        if case.model_type == "mixtral" {
            assert!(config.get("num_experts").is_none());
            assert_eq!(config["intermediate_size"], 14336);
        }
    }
}

#[test]
fn same_seed_same_bytes_and_single_file() {
    let a = TempDir::new("det-a");
    let b = TempDir::new("det-b");
    let make = |out: &Path, seed: u64| SynthOptions {
        like: "qwen3-30b-a3b".into(),
        layers: Some(1),
        experts: Some(2),
        hidden: Some(64),
        vocab: Some(1024),
        out: out.to_path_buf(),
        seed,
        ..SynthOptions::default()
    };
    synth_and_verify(&make(&a.0, 3));
    synth_and_verify(&make(&b.0, 3));
    let read = |d: &Path| std::fs::read(d.join("model.safetensors")).expect("read");
    assert_eq!(read(&a.0), read(&b.0));

    // A second run into the same folder is refused unless overwrite is set.
    let err = synth(&make(&a.0, 4), |_, _| {}).unwrap_err();
    assert!(matches!(err, SynthError::OutputExists { .. }), "{err}");
    synth(
        &SynthOptions {
            overwrite: true,
            ..make(&a.0, 4)
        },
        |_, _| {},
    )
    .expect("overwrite");
    assert_ne!(read(&a.0), read(&b.0));
}

#[test]
fn errors_are_reported_not_panicked() {
    let dir = TempDir::new("err");
    let base = SynthOptions {
        out: dir.0.clone(),
        layers: Some(1),
        experts: Some(2),
        hidden: Some(64),
        vocab: Some(1024),
        ..SynthOptions::default()
    };

    let err = synth(
        &SynthOptions {
            like: "llama-3-70b".into(),
            ..base.clone()
        },
        |_, _| {},
    )
    .unwrap_err();
    assert!(matches!(err, SynthError::UnknownShape { .. }));
    let msg = err.to_string();
    for known in [
        "qwen3-30b-a3b",
        "qwen3-235b-a22b",
        "qwen2-57b-a14b",
        "mixtral-8x7b",
        "glm-4.5-air",
    ] {
        assert!(msg.contains(known), "{msg}");
    }

    let err = synth(
        &SynthOptions {
            dtype: "int4".into(),
            ..base.clone()
        },
        |_, _| {},
    )
    .unwrap_err();
    assert!(matches!(err, SynthError::BadDtype(_)));
    assert!(err.to_string().contains("int4"));

    // An output path below a regular file can never be created.
    std::fs::create_dir_all(&dir.0).expect("mkdir");
    let blocker = dir.0.join("a-file");
    std::fs::write(&blocker, b"x").expect("write");
    let err = synth(
        &SynthOptions {
            out: blocker.join("sub"),
            ..base.clone()
        },
        |_, _| {},
    )
    .unwrap_err();
    assert!(matches!(err, SynthError::OutDir { .. }), "{err}");
    assert!(err.to_string().contains("a-file"), "{err}");
}

/// `synth --dtype fp8|nvfp4|mxfp4|fp8-fp4` in one step: the checkpoint comes out in the
/// publisher's layout (its quantized weight dtypes and `quantization_config`), loads, and
/// runs a forward pass to finite logits; the temporary bf16 folder is gone afterwards; an
/// occupied output is refused before anything is written.
#[test]
fn synth_writes_published_quantized_layouts() {
    use ft_actor::quantize::QuantFormat;
    use ft_actor::synth::synth_quantized;
    let cases = [
        ("qwen3-30b-a3b", QuantFormat::Fp8, "F8_E4M3"),
        ("qwen3-30b-a3b", QuantFormat::Nvfp4, "U8"),
        ("gpt-oss-20b", QuantFormat::Mxfp4, "U8"),
        ("deepseek-v4-flash", QuantFormat::Fp8Fp4, "F8_E4M3"),
    ];
    for (like, format, dtype) in cases {
        let dir = TempDir::new(&format!("q-{like}"));
        let opts = SynthOptions {
            like: like.into(),
            layers: Some(1),
            dtype: "bf16".into(),
            out: dir.0.join("model"),
            seed: 3,
            experts: Some(4),
            hidden: Some(256),
            vocab: Some(ft_actor::synth::TOKENIZER_VOCAB),
            ..Default::default()
        };
        let report = synth_quantized(&opts, format, |_, _| {}).unwrap_or_else(|e| panic!("{like} {format:?}: {e}"));
        assert!(report.bytes > 0 && !report.files.is_empty());
        let siblings: Vec<_> = std::fs::read_dir(&dir.0).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(siblings.len(), 1, "{like}: the temporary bf16 folder is left: {siblings:?}");
        let config = read_json(&opts.out.join("config.json"));
        assert!(config.get("quantization_config").is_some(), "{like} {format:?}: no quantization_config");
        let headers: String = report.files.iter().filter(|f| f.extension().is_some_and(|e| e == "safetensors")).map(|f| {
            let bytes = std::fs::read(f).unwrap();
            let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
            String::from_utf8_lossy(&bytes[8..8 + n]).into_owned()
        }).collect();
        assert!(headers.contains(&format!("\"{dtype}\"")), "{like} {format:?}: no {dtype} tensor");
        let model = ft_actor::model::Model::load(&opts.out, test_backend(), &mut |_, _| {}).unwrap_or_else(|e| panic!("{like} {format:?}: {e}"));
        let mut state = ft_actor::kv::SequenceState::new(&model, 16).unwrap();
        let logits = model.forward(&mut state, &[1, 2, 3], ft_actor::model::Logits::Last).unwrap();
        assert!(logits.iter().all(|x| x.is_finite()), "{like} {format:?}: logits not finite");
        // An occupied output is refused, and nothing is written beside it.
        let again = synth_quantized(&opts, format, |_, _| {});
        assert!(again.is_err(), "{like}: an existing checkpoint must be refused");
        assert_eq!(std::fs::read_dir(&dir.0).unwrap().count(), 1);
    }
}
