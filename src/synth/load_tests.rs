//! Every known shape, shrunk to toy sizes but with its real structure (tensor names and
//! layouts, config keys, layer pattern), written to disk and run by the engine: the
//! checkpoints `synth` writes are ones the engine loads without leftovers, and `info`'s
//! parameter count agrees with the plan's.

use super::*;
use crate::kv::SequenceState;
use crate::model::{info, Logits, Model};
use std::sync::Arc;

/// The real shape of `name` with every width cut down; counts that shape the structure
/// (layers up to the first MoE layer and beyond, layer pattern, top-k) are kept.
fn toy(name: &str) -> ShapeSpec {
    let mut s = *find_shape(name).expect("known shape");
    s.layers = s.first_dense_layers + 2;
    if let ArchSpec::Hybrid(l) = s.spec {
        // One full-attention layer after the linear ones, plus one more linear layer.
        s.layers = l.full_attention_interval + 1;
    }
    s.hidden = 64;
    s.vocab = TOKENIZER_VOCAB;
    s.experts = 8;
    s.top_k = s.top_k.min(4);
    s.heads = 4;
    s.kv_heads = if s.kv_heads == s.heads { 4 } else { 2 };
    s.head_dim = if s.arch.head_dim_in_config() {
        16
    } else {
        s.hidden / s.heads
    };
    s.moe_intermediate = 32;
    s.intermediate = if s.arch == Arch::GptOss { 32 } else { 96 };
    if s.shared_intermediate > 0 {
        // GLM and DeepSeek size their shared expert as n_shared × moe_intermediate.
        s.shared_intermediate = match s.arch {
            Arch::Glm4Moe | Arch::DeepseekV3 => s.moe_intermediate,
            _ => 48,
        };
    }
    s.spec = match s.spec {
        ArchSpec::Plain => ArchSpec::Plain,
        ArchSpec::Hybrid(l) => ArchSpec::Hybrid(HybridSpec {
            k_heads: 2,
            v_heads: 4,
            k_head_dim: 16,
            v_head_dim: 8,
            ..l
        }),
        ArchSpec::Mla(m) => {
            s.head_dim = 8;
            ArchSpec::Mla(MlaSpec {
                q_lora_rank: Some(24),
                kv_lora_rank: 16,
                qk_nope_head_dim: 8,
                qk_rope_head_dim: 8,
                v_head_dim: 12,
                n_group: 4,
                topk_group: 2,
                ..m
            })
        }
        ArchSpec::GptOss(g) => ArchSpec::GptOss(GptOssSpec {
            sliding_window: 3,
            ..g
        }),
        ArchSpec::V4(v) => {
            // Four layers: HCA, HCA, HCA, CSA; windows that close within 8 tokens.
            s.layers = 4;
            s.kv_heads = 1;
            s.head_dim = 32;
            s.shared_intermediate = s.moe_intermediate;
            ArchSpec::V4(V4Spec {
                q_lora_rank: 24,
                o_groups: 2,
                o_lora_rank: 16,
                index_heads: 4,
                index_head_dim: 16,
                index_topk: 2,
                sliding_window: 4,
                csa_rate: 2,
                hca_rate: 4,
                hash_layers: 2,
                qk_rope_head_dim: 8,
                ..v
            })
        }
    };
    s
}

#[test]
fn every_known_shape_loads_and_runs_in_the_engine() {
    let be: Arc<dyn ft_backend::Backend> = Arc::new(
        ft_backend_cpu::CpuBackend::new(ft_backend_cpu::CpuOptions {
            threads: Some(2),
            ..Default::default()
        })
        .expect("cpu backend"),
    );
    for known in known_shapes() {
        let shape = toy(known.name);
        let out = std::env::temp_dir().join(format!(
            "ft-synth-load-{}-{}",
            known.name,
            std::process::id()
        ));
        let opts = SynthOptions {
            like: known.name.into(),
            dtype: "bf16".into(),
            out: out.clone(),
            shard_bytes: 1 << 20,
            overwrite: true,
            ..SynthOptions::default()
        };
        let plan = plan_shape(shape, &opts).expect("plan");
        let (total, active) = (plan.total_params, plan.active_params);
        write_plan(plan, &opts, &mut |_, _| {}).expect("write");

        let model = Model::load(&out, be.clone(), &mut |_, _| {})
            .unwrap_or_else(|e| panic!("{}: {e}", known.name));
        assert_eq!(
            model.config().arch.model_type(),
            known.arch.model_type(),
            "{}",
            known.name
        );
        assert!(
            model.files().unused().is_empty(),
            "{}: unused tensors {:?}",
            known.name,
            model.files().unused()
        );
        let stats = info::stats(&model);
        assert_eq!(
            stats.total_params, total,
            "{}: info and synth disagree on the parameter count",
            known.name
        );
        let embed_row = shape.hidden as u64;
        assert_eq!(
            stats.active_params,
            active + embed_row,
            "{}: active parameters",
            known.name
        );

        let tokens = [1u32, 500, 17, 1000, 3, 42, 7, 901];
        let mut state = SequenceState::new(&model, tokens.len()).expect("state");
        let logits = model
            .forward(&mut state, &tokens, Logits::All)
            .unwrap_or_else(|e| panic!("{}: {e}", known.name));
        assert_eq!(logits.len(), tokens.len() * shape.vocab);
        assert!(
            logits.iter().all(|v| v.is_finite()),
            "{}: non-finite logits",
            known.name
        );
        std::fs::remove_dir_all(&out).ok();
    }
}
