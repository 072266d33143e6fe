//! DeepSeek-V4 against the transformers reference in `tests/fixtures/deepseek_v4`.
//!
//! Tolerances (the fixture README's): logits, decode-step logits and router logits max abs
//! diff <= 1e-3; hidden states (all 4 hyper-connection streams) and compressed entries <= 1e-3
//! relative to their largest magnitude; router ids identical as sets, weights within 1e-4;
//! indexer choices identical; 16 greedy tokens identical; incremental decode vs full recompute
//! <= 1e-4.

use crate::common::*;
use ft_actor::kv::SequenceState;
use ft_actor::model::{Logits, Trace};

const NAME: &str = "deepseek_v4";
const LOGIT_TOL: f32 = 1e-3;

fn rel_close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want.iter().fold(1f32, |m, v| m.max(v.abs()));
    let d = max_abs_diff(got, want);
    assert!(d <= 1e-3 * scale, "{what}: differs by {d} (scale {scale})");
}

#[test]
fn deepseek_v4_matches_transformers() {
    let model = load(NAME);
    let r = reference_json(NAME);
    let refs = reference_tensors(NAME);
    let cfg = model.config().clone();
    let (h, hc) = (cfg.hidden_size, cfg.v4.as_ref().unwrap().hc_mult);
    let mut worst = [0f32; 3];
    for (p, ids) in prompts(&r).iter().enumerate() {
        let t = ids.len();
        let mut state = SequenceState::new(&model, t + 16).unwrap();
        let mut trace = Trace::default();
        let logits = model.forward_traced(&mut state, ids, Logits::All, Some(&mut trace)).unwrap();
        let d = max_abs_diff(&logits, &tensor(&refs, &format!("logits.p{p}")));
        assert!(d <= LOGIT_TOL, "p{p}: logits max abs diff {d}");
        worst[0] = worst[0].max(d);

        // The four streams after every layer.
        let hidden = tensor(&refs, &format!("hidden_states.p{p}"));
        let per = t * hc * h;
        for l in 0..cfg.num_layers {
            rel_close(&trace.hidden[l], &hidden[(l + 1) * per..(l + 2) * per], &format!("p{p}: streams after layer {l}"));
        }

        // Router logits and choices of every layer, hash layers included.
        let routers = r["router"][p].as_array().unwrap();
        assert_eq!(routers.len(), trace.routing.len());
        for (rj, ((layer, routing), (_, raw))) in routers.iter().zip(trace.routing.iter().zip(&trace.router_logits)) {
            let module = rj["module"].as_str().unwrap();
            assert!(module.contains(&format!("layers.{layer}.")));
            let d = max_abs_diff(raw, &tensor(&refs, &format!("router_logits.p{p}.{module}")));
            assert!(d <= LOGIT_TOL, "p{p} {module}: router logits differ by {d}");
            let k = routing.top_k;
            for (tok, (want_ids, want_w)) in rj["topk_ids"].as_array().unwrap().iter().zip(rj["topk_weights"].as_array().unwrap()).enumerate() {
                for (wi, ww) in want_ids.as_array().unwrap().iter().zip(want_w.as_array().unwrap()) {
                    let id = wi.as_u64().unwrap() as u32;
                    let pos = routing.ids[tok * k..(tok + 1) * k].iter().position(|g| *g == id).unwrap_or_else(|| panic!("p{p} {module} token {tok}: expert {id} not chosen"));
                    let got = routing.weights[tok * k + pos];
                    assert!((got - ww.as_f64().unwrap() as f32).abs() <= 1e-4, "p{p} {module} token {tok}: weight {got} vs {ww}");
                }
            }
        }

        // Compressed entries of every CSA/HCA compressor, the indexer's keys and its choices.
        for (layer, entries) in &trace.compressed {
            let want = tensor(&refs, &format!("compressed_kv.p{p}.model.layers.{layer}.self_attn.compressor"));
            rel_close(entries, &want, &format!("p{p}: compressed entries of layer {layer}"));
        }
        assert_eq!(trace.compressed.len(), 3, "every CSA/HCA layer compresses");
        let indexers = r["indexer"][p].as_array().unwrap();
        assert_eq!(indexers.len(), trace.indexer.len());
        for (ij, (layer, keys, chosen)) in indexers.iter().zip(&trace.indexer) {
            let module = ij["module"].as_str().unwrap();
            assert!(module.contains(&format!("layers.{layer}.")));
            rel_close(keys, &tensor(&refs, &format!("indexer_keys.p{p}.{module}")), &format!("p{p} {module}: indexer keys"));
            for (tok, want) in ij["selected"].as_array().unwrap().iter().enumerate() {
                let mut got = chosen[tok].clone();
                got.sort();
                let want: Vec<usize> = want.as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect();
                assert_eq!(got, want, "p{p} {module} token {tok}: indexer choice");
            }
        }

        // Greedy decode with the state, and token by token vs the whole sequence at once.
        let (steps, incremental) = check_greedy_decode(&model, NAME, p, ids);
        worst[1] = worst[1].max(steps);
        worst[2] = worst[2].max(incremental);
    }
    eprintln!("deepseek_v4: max |Δ| logits {:.2e}, decode steps {:.2e}, incremental vs full {:.2e}", worst[0], worst[1], worst[2]);
}

/// A snapshot taken mid-window (pending compressor rows, an overlap carried) and restored
/// into a fresh state continues exactly as the original; it cannot be cut to a prefix.
#[test]
fn deepseek_v4_snapshot_restores_mid_window() {
    let model = load(NAME);
    let r = reference_json(NAME);
    let ids = &prompts(&r)[2];
    let vocab = model.config().vocab_size;
    let mut whole = SequenceState::new(&model, ids.len()).unwrap();
    let full = model.forward(&mut whole, ids, Logits::All).unwrap();
    // 13 tokens: CSA windows of 4 and HCA windows of 8 are both part-way.
    let cut = 13;
    let mut first = SequenceState::new(&model, ids.len()).unwrap();
    model.forward(&mut first, &ids[..cut], Logits::None).unwrap();
    let snap = first.snapshot_to_host().unwrap();
    let mut resumed = SequenceState::new(&model, ids.len()).unwrap();
    resumed.restore(&snap).unwrap();
    let rest = model.forward(&mut resumed, &ids[cut..], Logits::All).unwrap();
    let d = max_abs_diff(&rest, &full[cut * vocab..]);
    assert!(d <= 1e-4, "restored state differs from a fresh prefill by {d}");
    assert!(resumed.restore_prefix(&snap, cut - 1).is_err(), "compressor state cannot be cut");
}

/// A copy of the fixture checkpoint with `edit` applied to its config and `drop` left out of
/// its weights; returns the load error.
fn load_error(tag: &str, edit: impl Fn(&mut serde_json::Value), drop: Option<&str>) -> String {
    use safetensors::tensor::TensorView;
    let src = fixture(NAME).join("checkpoint");
    let dir = std::env::temp_dir().join(format!("ft-v4-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["generation_config.json", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let mut cfg: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    edit(&mut cfg);
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let views: Vec<(String, TensorView)> = st.tensors().into_iter().filter(|(n, _)| Some(n.as_str()) != drop).collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
    let err = match ft_actor::model::Model::load(&dir, cpu_backend(), &mut |_, _| {}) {
        Ok(_) => panic!("{tag}: loaded"),
        Err(e) => e.to_string(),
    };
    std::fs::remove_dir_all(&dir).ok();
    err
}

#[test]
fn deepseek_v4_bad_checkpoints_name_the_problem() {
    let e = load_error("short-layer-types", |c| c["layer_types"].as_array_mut().unwrap().truncate(3), None);
    assert!(e.contains("layer_types") && e.contains("lists 3 layers") && e.contains("config.json"), "{e}");
    let e = load_error("short-mlp-types", |c| c["mlp_layer_types"] = serde_json::json!(["moe"]), None);
    assert!(e.contains("mlp_layer_types") && e.contains("lists 1 layers"), "{e}");
    let e = load_error("unknown-kind", |c| c["layer_types"][2] = "full_attention".into(), None);
    assert!(e.contains("`full_attention` is not a DeepSeek-V4 layer type"), "{e}");
    let e = load_error("unknown-mlp", |c| c["mlp_layer_types"][0] = "dense".into(), None);
    assert!(e.contains("`dense` is not a DeepSeek-V4 MLP type"), "{e}");
    let e = load_error("scoring", |c| c["scoring_func"] = "softmax".into(), None);
    assert!(e.contains("scoring_func") && e.contains("sqrtsoftplus"), "{e}");
    let e = load_error("no-compressor", |_| {}, Some("layers.2.attn.compressor.wkv.weight"));
    assert!(e.contains("layers.2.attn.compressor.wkv.weight"), "{e}");
    let e = load_error("no-indexer", |_| {}, Some("layers.1.attn.indexer.compressor.ape"));
    assert!(e.contains("layers.1.attn.indexer.compressor.ape"), "{e}");
    let e = load_error("no-hash", |_| {}, Some("layers.0.ffn.gate.tid2eid"));
    assert!(e.contains("layers.0.ffn.gate.tid2eid"), "{e}");
}

/// The published configs' legacy keys (`compress_ratios`, `num_hash_layers`,
/// `qk_rope_head_dim`, flat yarn `rope_scaling` + `compress_rope_theta`) give the same model.
#[test]
fn deepseek_v4_legacy_config_keys_read_the_same() {
    let path = fixture(NAME).join("checkpoint/config.json");
    let mut c: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let modern = ft_actor::model::ModelConfig::from_json(&c, &path).unwrap();
    let o = c.as_object_mut().unwrap();
    let compress = o["rope_parameters"]["compress"].clone();
    for k in ["layer_types", "mlp_layer_types", "rope_parameters", "partial_rotary_factor", "compress_rates"] {
        o.remove(k);
    }
    o.insert("compress_rate_csa".into(), 4.into());
    o.insert("compress_rate_hca".into(), 8.into());
    let mut scaling = compress.as_object().unwrap().clone();
    scaling.remove("rope_theta");
    scaling.remove("partial_rotary_factor");
    scaling.remove("attention_factor");
    o.insert("rope_scaling".into(), scaling.into());
    let legacy = ft_actor::model::ModelConfig::from_json(&c, &path).unwrap();
    assert_eq!(legacy, modern);
}

/// DeepSeek-V4's published layout (FP8 with E8M0 `.scale` per 128×128 block, FP4 routed
/// experts with an E8M0 `.scale` per 32, compressor and indexer projections kept unquantized)
/// written from the fixture: experts stay packed as MXFP4, and the logits equal those of the
/// f32 twin holding exactly the decoded values (1e-3, f32 products of the dequantized weights),
/// with identical greedy tokens.
#[test]
fn deepseek_v4_published_fp8_fp4_layout_matches_its_twin() {
    use ft_actor::quantize::{quantize_checkpoint, QuantFormat, QuantizeOptions};
    let base = std::env::temp_dir().join(format!("ft-v4-fp8fp4-{}", std::process::id()));
    let (out, twin) = (base.join("q"), base.join("twin"));
    let opts = QuantizeOptions { model: fixture(NAME).join("checkpoint"), out: out.clone(), format: QuantFormat::Fp8Fp4, overwrite: true, twin: Some(twin.clone()) };
    let report = quantize_checkpoint(&opts, |_, _| {}).unwrap();
    assert!(report.quantized > 0 && report.bytes_out < report.bytes_in, "{report:?}");
    let files = ft_actor::model::WeightFiles::open(&out).unwrap();
    let tag = |n: &str| files.get_raw(n).unwrap().dtype.tag();
    assert_eq!(tag("layers.0.attn.wq_a.weight"), "F8_E4M3");
    assert_eq!(tag("layers.0.attn.wq_a.scale"), "F8_E8M0");
    assert_eq!(tag("layers.2.ffn.experts.3.w2.weight"), "I8");
    assert_eq!(tag("layers.1.attn.compressor.wkv.weight"), "F32", "compressor projections stay unquantized");
    let (mq, mt) = (
        ft_actor::model::Model::load(&out, cpu_backend(), &mut |_, _| {}).unwrap(),
        ft_actor::model::Model::load(&twin, cpu_backend(), &mut |_, _| {}).unwrap(),
    );
    assert_eq!(mq.experts(2)[0].gate.dtype, ft_backend::DType::Mxfp4, "experts stay packed");
    assert_eq!(ft_actor::model::info::stats(&mq).expert_format, "mxfp4");
    let r = reference_json(NAME);
    for (p, ids) in prompts(&r).iter().enumerate() {
        let mut sq = SequenceState::new(&mq, ids.len() + 16).unwrap();
        let mut st = SequenceState::new(&mt, ids.len() + 16).unwrap();
        let lq = mq.forward(&mut sq, ids, Logits::All).unwrap();
        let lt = mt.forward(&mut st, ids, Logits::All).unwrap();
        let d = max_abs_diff(&lq, &lt);
        assert!(d <= LOGIT_TOL, "p{p}: quantized vs twin logits differ by {d}");
        let (mut a, mut b) = (argmax(&lq[lq.len() - mq.config().vocab_size..]), argmax(&lt[lt.len() - mt.config().vocab_size..]));
        for s in 0..16 {
            assert_eq!(a, b, "p{p}: greedy token {s}");
            a = argmax(&mq.forward(&mut sq, &[a], Logits::Last).unwrap());
            b = argmax(&mt.forward(&mut st, &[b], Logits::Last).unwrap());
        }
    }
    std::fs::remove_dir_all(&base).ok();
}
