//! Every supported architecture against the transformers reference in `tests/fixtures`.
//!
//! Tolerances (from the fixture README): logits and decode-step logits max abs diff <= 1e-3
//! (f32 compute; bf16 weights are upcast exactly); hidden states <= 1e-3 relative to their
//! largest magnitude; router ids identical as sets and weights within 1e-4; 16 greedy tokens
//! identical; incremental decode vs. full recompute <= 1e-4.

use crate::common::*;
use ft_actor::kv::SequenceState;
use ft_actor::model::{Logits, Trace};

const LOGIT_TOL: f32 = 1e-3;
const ROUTER_W_TOL: f32 = 1e-4;

fn check_fixture(name: &str) {
    let model = load(name);
    let r = reference_json(name);
    let refs = reference_tensors(name);
    let h = model.config().hidden_size;
    // Worst differences over all prompts: full logits, decode steps, incremental vs full.
    let mut worst = [0f32; 3];
    for (p, ids) in prompts(&r).iter().enumerate() {
        // Full-sequence logits, router choices and hidden states.
        let mut state = SequenceState::new(&model, ids.len() + 16).unwrap();
        let mut trace = Trace::default();
        let logits = model.forward_traced(&mut state, ids, Logits::All, Some(&mut trace)).unwrap();
        let want = tensor(&refs, &format!("logits.p{p}"));
        let d = max_abs_diff(&logits, &want);
        assert!(d <= LOGIT_TOL, "{name} p{p}: logits max abs diff {d}");
        worst[0] = worst[0].max(d);

        let hidden_ref = tensor(&refs, &format!("hidden_states.p{p}"));
        let t = ids.len();
        let n_layers = model.config().num_layers;
        for l in 0..n_layers - 1 {
            let want = &hidden_ref[(l + 1) * t * h..(l + 2) * t * h];
            let scale = want.iter().fold(1f32, |m, v| m.max(v.abs()));
            let d = max_abs_diff(&trace.hidden[l], want);
            assert!(d <= 1e-3 * scale, "{name} p{p}: hidden state after layer {l} differs by {d} (scale {scale})");
        }
        let last_ref = tensor(&refs, &format!("last_layer_output.p{p}"));
        let scale = last_ref.iter().fold(1f32, |m, v| m.max(v.abs()));
        assert!(max_abs_diff(&trace.hidden[n_layers - 1], &last_ref) <= 1e-3 * scale, "{name} p{p}: last layer output");

        let routers = r["router"][p].as_array().unwrap();
        assert_eq!(routers.len(), trace.routing.len(), "{name}: number of MoE layers");
        for (rj, (layer, routing)) in routers.iter().zip(&trace.routing) {
            let module = rj["module"].as_str().unwrap();
            assert!(module.contains(&format!("layers.{layer}.")), "{name}: router {module} vs layer {layer}");
            let raw = tensor(&refs, &format!("router_logits.p{p}.{module}"));
            let (_, logits) = trace.router_logits.iter().find(|(l, _)| l == layer).unwrap();
            assert!(max_abs_diff(logits, &raw) <= LOGIT_TOL, "{name} p{p} {module}: router logits");
            for (tok, (want_ids, want_w)) in rj["topk_ids"].as_array().unwrap().iter().zip(rj["topk_weights"].as_array().unwrap()).enumerate() {
                let k = routing.top_k;
                let got_ids = &routing.ids[tok * k..(tok + 1) * k];
                let got_w = &routing.weights[tok * k..(tok + 1) * k];
                for (wi, ww) in want_ids.as_array().unwrap().iter().zip(want_w.as_array().unwrap()) {
                    let e = ww.as_f64().unwrap() as f32;
                    let id = wi.as_u64().unwrap() as u32;
                    let pos = got_ids.iter().position(|g| *g == id).unwrap_or_else(|| {
                        panic!("{name} p{p} {module} token {tok}: expert {id} not chosen (got {got_ids:?})")
                    });
                    assert!((got_w[pos] - e).abs() <= ROUTER_W_TOL, "{name} p{p} {module} token {tok}: weight {} vs {e}", got_w[pos]);
                }
            }
        }

        // Greedy decode with the KV cache, and incremental decode vs a full recompute.
        let (steps, incremental) = check_greedy_decode(&model, name, p, ids);
        worst[1] = worst[1].max(steps);
        worst[2] = worst[2].max(incremental);
    }
    eprintln!(
        "{name}: max |Δ| logits {:.2e}, decode steps {:.2e}, incremental vs full {:.2e}",
        worst[0], worst[1], worst[2]
    );
}

#[test]
fn qwen3_moe_matches_transformers() {
    check_fixture("qwen3_moe");
}

#[test]
fn qwen3_moe_bf16_matches_transformers() {
    check_fixture("qwen3_moe_bf16");
}

#[test]
fn qwen2_moe_matches_transformers() {
    check_fixture("qwen2_moe");
}

#[test]
fn mixtral_matches_transformers() {
    check_fixture("mixtral");
}

#[test]
fn glm4_moe_matches_transformers() {
    check_fixture("glm4_moe");
}

#[test]
fn qwen3_next_matches_transformers() {
    check_fixture("qwen3_next");
}

#[test]
fn qwen3_5_moe_matches_transformers() {
    check_fixture("qwen3_5_moe");
}

#[test]
fn deepseek_v3_matches_transformers() {
    check_fixture("deepseek_v3");
}

#[test]
fn gpt_oss_matches_transformers() {
    check_fixture("gpt_oss");
}

/// The fused 3-D expert layout (`experts.gate_up_proj [E, 2I, H]`, `experts.down_proj
/// [E, H, I]`) gives the same logits as the per-expert hub layout it was built from.
#[test]
fn fused_expert_layout_matches_per_expert_layout() {
    use safetensors::tensor::{Dtype, TensorView};
    let src = fixture("qwen2_moe").join("checkpoint");
    let dir = std::env::temp_dir().join(format!("ft-fused-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let files = ft_actor::model::WeightFiles::open(&src).unwrap();
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = vec![];
    let mut names: Vec<String> = files.names().map(String::from).collect();
    names.sort();
    for name in &names {
        if !name.contains(".mlp.experts.") {
            let t = files.get(name).unwrap();
            tensors.push((name.clone(), t.shape.clone(), t.bytes.as_slice().to_vec()));
        }
    }
    let cfg = ft_actor::model::ModelConfig::from_dir(&src).unwrap();
    for layer in (0..cfg.num_layers).filter(|l| cfg.moe_layers[*l]) {
        let (mut gate_up, mut down) = (vec![], vec![]);
        for e in 0..cfg.num_experts {
            let p = format!("model.layers.{layer}.mlp.experts.{e}");
            gate_up.extend(files.get(&format!("{p}.gate_proj.weight")).unwrap().bytes.as_slice());
            gate_up.extend(files.get(&format!("{p}.up_proj.weight")).unwrap().bytes.as_slice());
            down.extend(files.get(&format!("{p}.down_proj.weight")).unwrap().bytes.as_slice());
        }
        let (e, i, h) = (cfg.num_experts, cfg.moe_intermediate_size, cfg.hidden_size);
        tensors.push((format!("model.layers.{layer}.mlp.experts.gate_up_proj"), vec![e, 2 * i, h], gate_up));
        tensors.push((format!("model.layers.{layer}.mlp.experts.down_proj"), vec![e, h, i], down));
    }
    let views: Vec<(String, TensorView)> =
        tensors.iter().map(|(n, s, b)| (n.clone(), TensorView::new(Dtype::F32, s.clone(), b).unwrap())).collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();

    let model = ft_actor::model::Model::load(&dir, cpu_backend(), &mut |_, _| {}).unwrap();
    let r = reference_json("qwen2_moe");
    let ids = &prompts(&r)[2];
    let mut state = SequenceState::new(&model, ids.len()).unwrap();
    let logits = model.forward(&mut state, ids, Logits::All).unwrap();
    let want = tensor(&reference_tensors("qwen2_moe"), "logits.p2");
    std::fs::remove_dir_all(&dir).ok();
    assert!(max_abs_diff(&logits, &want) <= LOGIT_TOL);
}

/// A tied-embedding checkpoint (no `lm_head.weight`) uses the embedding as output matrix.
#[test]
fn tied_embeddings_use_the_embedding_matrix() {
    let src = fixture("mixtral").join("checkpoint");
    let model = load("mixtral");
    let r = reference_json("mixtral");
    let ids = &prompts(&r)[0];
    let dir = std::env::temp_dir().join(format!("ft-tied-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut cfg: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    cfg["tie_word_embeddings"] = serde_json::json!(true);
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    // Same weights, but the lm_head replaced by the embedding matrix.
    let files = ft_actor::model::WeightFiles::open(&src).unwrap();
    let mut owned = vec![];
    for name in files.names().filter(|n| *n != "lm_head.weight") {
        let t = files.get(name).unwrap();
        owned.push((name.to_string(), t.shape.clone(), t.bytes.as_slice().to_vec()));
    }
    let views: Vec<(String, safetensors::tensor::TensorView)> = owned
        .iter()
        .map(|(n, s, b)| (n.clone(), safetensors::tensor::TensorView::new(safetensors::tensor::Dtype::F32, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
    let tied = ft_actor::model::Model::load(&dir, cpu_backend(), &mut |_, _| {}).unwrap();
    let mut s1 = SequenceState::new(&tied, ids.len()).unwrap();
    let got = tied.forward(&mut s1, ids, Logits::Last).unwrap();
    std::fs::remove_dir_all(&dir).ok();
    // Expected: final hidden state (from the untied model's trace) times the embedding.
    let mut s2 = SequenceState::new(&model, ids.len()).unwrap();
    let mut trace = Trace::default();
    model.forward_traced(&mut s2, ids, Logits::Last, Some(&mut trace)).unwrap();
    let h = model.config().hidden_size;
    let last = &trace.hidden.last().unwrap()[(ids.len() - 1) * h..];
    let norm_w = files.get("model.norm.weight").unwrap().to_f32();
    let ms = last.iter().map(|v| v * v).sum::<f32>() / h as f32;
    let normed: Vec<f32> = last.iter().zip(&norm_w).map(|(v, w)| v / (ms + model.config().rms_norm_eps).sqrt() * w).collect();
    let embed = files.get("model.embed_tokens.weight").unwrap().to_f32();
    let want: Vec<f32> = embed.chunks(h).map(|row| row.iter().zip(&normed).map(|(a, b)| a * b).sum()).collect();
    assert!(max_abs_diff(&got, &want) <= 1e-4);
}

/// The engine's default `int8` products meet bf16 weights with `vdpbf16ps` (CPUs with AVX-512
/// BF16), rounding each activation by up to 2⁻⁹ of itself, as transformers does when it
/// computes in bf16. The bound per prompt is how far transformers' own bf16
/// compute (`logits_bf16compute`) lands from its f32 logits (0.10, 0.019, 0.24), and the greedy
/// tokens must be the reference's.
#[test]
fn qwen3_moe_bf16_with_bf16_activations_keeps_the_reference() {
    let name = "qwen3_moe_bf16";
    let model = load_path_int8(&fixture(name).join("checkpoint"));
    let r = reference_json(name);
    let refs = reference_tensors(name);
    for (p, ids) in prompts(&r).iter().enumerate() {
        let mut state = SequenceState::new(&model, ids.len() + 16).unwrap();
        let logits = model.forward(&mut state, ids, Logits::All).unwrap();
        let want = tensor(&refs, &format!("logits.p{p}"));
        let d = max_abs_diff(&logits, &want);
        let bound = max_abs_diff(&tensor(&refs, &format!("logits_bf16compute.p{p}")), &want);
        eprintln!("{name} p{p} ({} tokens): max |Δ| logits {d:.3e}; transformers in bf16: {bound:.3e}", ids.len());
        assert!(d <= bound, "{name} p{p} ({} tokens): logits max abs diff {d} beyond transformers' own bf16 compute ({bound})", ids.len());
        let want: Vec<u32> = r["generation"][p]["new_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
        assert_eq!(greedy(&model, ids, 16), want, "{name} p{p}: greedy tokens");
    }
}
