//! Quantized checkpoints in the publishers' layouts (block-scaled FP8, ModelOpt NVFP4, gpt-oss
//! MXFP4), written from the shared fixtures by `ft_actor::quantize`, against their dequantized
//! f32 twins (the exact values the quantized files decode to, per the publishers' formulas).
//!
//! Tolerances: logits within 1e-3 of the twin's (the kernels compute the f32 product of the
//! dequantized weights; only summation order differs), 16 greedy tokens identical, also
//! through the actor pipeline in every MoE mode and with expert cache slots.

use crate::common::*;
use ft_actor::engine::{Engine, EngineRequest, GenEvent};
use ft_actor::kv::SequenceState;
use ft_actor::model::{Logits, Model};
use ft_actor::policy::MoeMode;
use ft_actor::quantize::{quantize_checkpoint, QuantFormat, QuantizeOptions};
use ft_backend::DType;
use std::path::{Path, PathBuf};

const LOGIT_TOL: f32 = 1e-3;

const CASES: [(&str, QuantFormat, DType); 7] = [
    ("qwen3_moe", QuantFormat::Fp8, DType::F8E4M3),
    ("qwen3_moe", QuantFormat::Nvfp4, DType::Nvfp4),
    ("deepseek_v3", QuantFormat::Fp8, DType::F8E4M3),
    ("deepseek_v3", QuantFormat::Nvfp4, DType::Nvfp4),
    ("qwen3_5_moe", QuantFormat::Fp8, DType::F8E4M3),
    ("qwen3_5_moe", QuantFormat::Nvfp4, DType::Nvfp4),
    ("gpt_oss", QuantFormat::Mxfp4, DType::Mxfp4),
];

fn scratch(what: &str) -> PathBuf {
    scratch_dir("ft-actor-quant-", what)
}

/// Writes `name` in `format` and its twin; returns (quantized, twin) folders.
/// `test` keeps the folders of tests running at the same time apart.
fn quantized(test: &str, name: &str, format: QuantFormat) -> (PathBuf, PathBuf) {
    let base = scratch(&format!("{test}-{name}-{format:?}"));
    let (out, twin) = (base.join("q"), base.join("twin"));
    let opts = QuantizeOptions { model: fixture(name).join("checkpoint"), out: out.clone(), format, overwrite: true, twin: Some(twin.clone()) };
    let report = quantize_checkpoint(&opts, |_, _| {}).unwrap_or_else(|e| panic!("{name} {format:?}: {e}"));
    assert!(report.quantized > 0 && report.bytes_out < report.bytes_in, "{name} {format:?}: {report:?}");
    (out, twin)
}

#[test]
fn quantized_fixtures_match_their_dequantized_twins() {
    for (name, format, dtype) in CASES {
        let (q, twin) = quantized("twins", name, format);
        let (mq, mt) = (load_path(&q), load_path(&twin));
        let layer = mq.config().moe_layers.iter().position(|m| *m).unwrap();
        let e = &mq.experts(layer)[0];
        assert_eq!((e.gate.dtype, e.down.dtype), (dtype, dtype), "{name} {format:?}: experts stay packed");
        assert_eq!(mt.experts(layer)[0].gate.dtype, DType::F32);
        // Packed sizes are whole blocks per row (the tiny fixture rows are mostly padding; at
        // real sizes a 4-bit expert is ~0.28× and FP8 ~0.52× of bf16, see `packed_sizes`).
        let (h, i) = (mq.config().hidden_size, mq.config().moe_intermediate_size);
        let biases = e.biases.as_ref().map_or(0, |b| b.gate.len() + b.up.len() + b.down.len());
        assert_eq!(e.size_bytes(), 2 * i * dtype.row_bytes(h) + h * dtype.row_bytes(i) + biases, "{name} {format:?}");
        let r = reference_json(name);
        for (p, ids) in prompts(&r).iter().enumerate() {
            let mut sq = SequenceState::new(&mq, ids.len()).unwrap();
            let mut st = SequenceState::new(&mt, ids.len()).unwrap();
            let lq = mq.forward(&mut sq, ids, Logits::All).unwrap();
            let lt = mt.forward(&mut st, ids, Logits::All).unwrap();
            let d = max_abs_diff(&lq, &lt);
            assert!(d <= LOGIT_TOL, "{name} {format:?} p{p}: logits differ by {d}");
            assert_eq!(greedy(&mq, ids, 16), greedy(&mt, ids, 16), "{name} {format:?} p{p}: greedy tokens");
        }
        if dtype != DType::F8E4M3 {
            assert_int8_model(&format!("{name} {format:?} int8"), &load_path_int8(&q), &mt, &prompts(&r));
        }
        let _ = std::fs::remove_dir_all(q.parent().unwrap());
    }
}

#[test]
fn quantized_fixtures_through_the_pipeline_in_every_mode() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    for (name, format) in [("qwen3_moe", QuantFormat::Nvfp4), ("deepseek_v3", QuantFormat::Fp8), ("gpt_oss", QuantFormat::Mxfp4)] {
        let (q, _twin) = quantized("pipeline", name, format);
        let prompt = prompts(&reference_json(name))[2].clone();
        // The engine runs its default int8 activations (bf16 ones for FP8 on AVX-512 VBMI
        // CPUs, exact without): the direct forward
        // pass on the int8 backend is what every pipeline mode must reproduce.
        let want = greedy(&load_path_int8(&q), &prompt, 12);
        let cfg = ft_actor::model::ModelConfig::from_dir(&q).unwrap();
        let all = (cfg.num_experts * cfg.num_moe_layers()) as u64;
        for slots in [0, all / 2] {
            for mode in [MoeMode::Offload, MoeMode::Cpu, MoeMode::Hybrid] {
                let what = format!("{name} {format:?} slots={slots} mode={mode}");
                let mut config = pipeline_config(q.clone(), slots, mode);
                config.quant_dot = ft_actor::engine::QuantDot::Int8;
                let got = rt.block_on(async {
                    let engine = Engine::spawn(config, None).await.unwrap_or_else(|e| panic!("{what}: {e}"));
                    let mut req = EngineRequest::greedy(prompt.clone(), 12);
                    req.ignore_eos = true;
                    let mut stream = engine.generate(req).await.unwrap();
                    let mut got = vec![];
                    while let Some(ev) = stream.next().await {
                        match ev {
                            GenEvent::Token { id, .. } => got.push(id),
                            GenEvent::Done(_) => break,
                            GenEvent::Error(e) => panic!("{what}: {e}"),
                        }
                    }
                    got
                });
                assert_eq!(got, want, "{what}: tokens");
            }
        }
        let _ = std::fs::remove_dir_all(q.parent().unwrap());
    }
}

/// Rewrites `file` with `edit` applied to its tensors (name, dtype, shape, bytes).
fn rewrite(file: &Path, edit: impl Fn(&mut Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)>)) {
    let data = std::fs::read(file).unwrap();
    let st = safetensors::SafeTensors::deserialize(&data).unwrap();
    let mut tensors: Vec<_> = st.tensors().into_iter().map(|(n, v)| (n, v.dtype(), v.shape().to_vec(), v.data().to_vec())).collect();
    edit(&mut tensors);
    let views: Vec<_> = tensors.iter().map(|(n, d, s, b)| (n.clone(), safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap())).collect();
    safetensors::serialize_to_file(views, None, file).unwrap();
}

fn set_quant_config(dir: &Path, qc: serde_json::Value) {
    let path = dir.join("config.json");
    let mut c: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    c["quantization_config"] = qc;
    std::fs::write(&path, serde_json::to_string(&c).unwrap()).unwrap();
}

fn load_err(dir: &Path) -> String {
    match Model::load(dir, cpu_backend(), &mut |_, _| {}) {
        Ok(_) => panic!("{} loaded", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_quantized_checkpoints_fail_with_the_tensor_and_file_named() {
    let (q, _) = quantized("bad", "qwen3_moe", QuantFormat::Fp8);
    let shard = q.join("model-00002-of-00002.safetensors");
    let orig_config = std::fs::read_to_string(q.join("config.json")).unwrap();

    // An unknown quant_method names the method and what is supported.
    set_quant_config(&q, serde_json::json!({"quant_method": "gptq", "bits": 4}));
    let e = load_err(&q);
    assert!(e.contains("`gptq`") && e.contains("supported: fp8"), "{e}");
    // A column block the engine's FP8 layout cannot hold.
    set_quant_config(&q, serde_json::json!({"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 64]}));
    let e = load_err(&q);
    assert!(e.contains("weight_block_size [128, 64]") && e.contains("weight_scale_inv"), "{e}");
    // A block size that does not divide the shapes as the scale tensors say.
    set_quant_config(&q, serde_json::json!({"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [16, 128]}));
    let e = load_err(&q);
    assert!(e.contains("weight_scale_inv") && e.contains("shape") && e.contains(".safetensors"), "{e}");
    std::fs::write(q.join("config.json"), &orig_config).unwrap();

    // A scale tensor of the wrong shape.
    let backup = std::fs::read(&shard).unwrap();
    let target = {
        let st = safetensors::SafeTensors::deserialize(&backup).unwrap();
        st.names().into_iter().find(|n| n.ends_with("weight_scale_inv")).unwrap().to_string()
    };
    rewrite(&shard, |ts| {
        let t = ts.iter_mut().find(|t| t.0 == target).unwrap();
        t.2 = vec![t.2[0] + 1, t.2[1]];
        t.3.extend(std::iter::repeat_n(0u8, 4 * t.2[1]));
    });
    let e = load_err(&q);
    assert!(e.contains(&target) && e.contains("model-00002-of-00002.safetensors") && e.contains("shape"), "{e}");
    // Packed data cut short: the file says more bytes than it holds.
    std::fs::write(&shard, &backup[..backup.len() - 100]).unwrap();
    let e = load_err(&q);
    assert!(e.contains("model-00002-of-00002.safetensors") && e.contains("truncated"), "{e}");
    // FP8 codes whose shape disagrees with the config.
    std::fs::write(&shard, &backup).unwrap();
    let weight = target.trim_end_matches("_scale_inv").to_string();
    rewrite(&shard, |ts| {
        let t = ts.iter_mut().find(|t| t.0 == weight).unwrap();
        t.2 = vec![t.2[0] / 2, t.2[1] * 2];
    });
    let e = load_err(&q);
    assert!(e.contains(&weight) && e.contains("shape"), "{e}");
    let _ = std::fs::remove_dir_all(q.parent().unwrap());
}

/// Bytes of a Qwen3-30B-A3B expert (hidden 2048, intermediate 768) in each format.
#[test]
fn packed_sizes() {
    let bytes = |d: DType| 2 * 768 * d.row_bytes(2048) + 2048 * d.row_bytes(768);
    let bf16 = bytes(DType::BF16) as f64;
    for (d, lo, hi) in [(DType::F8E4M3, 0.51, 0.52), (DType::Nvfp4, 0.28, 0.29), (DType::Mxfp4, 0.26, 0.27)] {
        let r = bytes(d) as f64 / bf16;
        assert!((lo..hi).contains(&r), "{d}: {r:.4} of bf16");
    }
}

#[test]
fn quantize_refuses_to_overwrite_and_names_unsupported_formats() {
    let (q, _) = quantized("overwrite", "qwen3_moe", QuantFormat::Nvfp4);
    let opts = QuantizeOptions { model: fixture("qwen3_moe").join("checkpoint"), out: q.clone(), format: QuantFormat::Nvfp4, overwrite: false, twin: None };
    let e = quantize_checkpoint(&opts, |_, _| {}).unwrap_err().to_string();
    assert!(e.contains("--overwrite"), "{e}");
    let opts = QuantizeOptions { format: QuantFormat::Mxfp4, overwrite: true, ..opts };
    let e = quantize_checkpoint(&opts, |_, _| {}).unwrap_err().to_string();
    assert!(e.contains("gpt-oss") && e.contains("qwen3_moe"), "{e}");
    // ModelOpt's hf_quant_config.json alone (no quantization_config) is recognised too.
    let cfg = q.join("config.json");
    let mut c: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&cfg).unwrap()).unwrap();
    c.as_object_mut().unwrap().remove("quantization_config");
    std::fs::write(&cfg, serde_json::to_string(&c).unwrap()).unwrap();
    let m = load_path(&q);
    let layer = m.config().moe_layers.iter().position(|m| *m).unwrap();
    assert_eq!(m.experts(layer)[0].gate.dtype, DType::Nvfp4);
    let _ = std::fs::remove_dir_all(q.parent().unwrap());
}

/// The compressed-tensors NVFP4 naming (`weight_packed`, `weight_global_scale` as a divisor)
/// loads to the same model as ModelOpt's.
#[test]
fn compressed_tensors_nvfp4_matches_modelopt() {
    let (q, twin) = quantized("ct", "qwen3_moe", QuantFormat::Nvfp4);
    for entry in std::fs::read_dir(&q).unwrap().flatten() {
        if entry.path().extension().is_some_and(|x| x == "safetensors") {
            rewrite(&entry.path(), |ts| {
                let globals: Vec<String> = ts.iter().filter(|t| t.0.ends_with(".weight_scale_2")).map(|t| t.0.clone()).collect();
                for g in globals {
                    let base = g.trim_end_matches(".weight_scale_2").to_string();
                    for t in ts.iter_mut() {
                        if t.0 == g {
                            let v = f32::from_le_bytes(t.3[..4].try_into().unwrap());
                            t.0 = format!("{base}.weight_global_scale");
                            t.2 = vec![1];
                            t.3 = (1.0 / v).to_le_bytes().to_vec();
                        } else if t.0 == format!("{base}.weight") {
                            t.0 = format!("{base}.weight_packed");
                        }
                    }
                }
            });
        }
    }
    let _ = std::fs::remove_file(q.join("model.safetensors.index.json"));
    let _ = std::fs::remove_file(q.join("hf_quant_config.json"));
    set_quant_config(&q, serde_json::json!({"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized", "ignore": ["lm_head"]}));
    let (mq, mt) = (load_path(&q), load_path(&twin));
    let layer = mq.config().moe_layers.iter().position(|m| *m).unwrap();
    assert_eq!(mq.experts(layer)[0].gate.dtype, DType::Nvfp4);
    let ids = &prompts(&reference_json("qwen3_moe"))[0];
    let mut sq = SequenceState::new(&mq, ids.len()).unwrap();
    let mut st = SequenceState::new(&mt, ids.len()).unwrap();
    let d = max_abs_diff(&mq.forward(&mut sq, ids, Logits::All).unwrap(), &mt.forward(&mut st, ids, Logits::All).unwrap());
    assert!(d <= LOGIT_TOL, "compressed-tensors NVFP4: logits differ by {d}");
    let _ = std::fs::remove_dir_all(q.parent().unwrap());
}
