//! Each shipped configuration planned against the model it is written for — the synthetic
//! Qwen3-30B-A3B shape in bf16 (48 layers × 128 experts; sizes from the synthesiser's tensor
//! plan) — on the hardware it names: it must start (the plan fits), keep an expert cache on a
//! GPU, and give a sequence a usable context.

use ft_actor::config::ServeConfig;
use ft_actor::engine::memory::{plan_engine_memory, PlanDevice, PlanFacts};
use ft_actor::policy::MemoryPlan;
use ft_actor::synth::{plan, SynthOptions, TensorKind};
use ft_backend::MemoryInfo;
use std::path::PathBuf;

const GIB: u64 = 1 << 30;

/// Qwen3-30B-A3B's sizes with bf16 weights and caches of `kv_bytes` a value.
fn qwen3_30b_a3b(kv_bytes: usize) -> (PlanFacts, usize) {
    let p = plan(&SynthOptions::default()).expect("the synthetic shape plans");
    let s = &p.shape;
    let bytes = |k: TensorKind| p.tensors.iter().filter(|t| t.kind == k).map(|t| t.nbytes()).sum::<u64>();
    let experts = (s.layers * s.experts) as u64;
    let facts = PlanFacts {
        non_expert_bytes: bytes(TensorKind::Dense) + bytes(TensorKind::Embedding),
        kv_bytes_per_token: (s.layers * 2 * s.kv_heads * s.head_dim * kv_bytes) as u64,
        state_bytes_per_sequence: 0,
        expert_bytes: bytes(TensorKind::RoutedExpert) / experts,
        experts_per_layer: s.experts as u64,
        moe_layers: s.layers as u64,
    };
    (facts, s.max_position_embeddings)
}

fn config(name: &str) -> ft_actor::engine::EngineConfig {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("configs").join(name);
    ServeConfig::load(Some(&path), Default::default()).unwrap_or_else(|e| panic!("{name}: {e}")).engine
}

fn plan_on(name: &str, total: u64, free: u64, cpu: bool) -> (MemoryPlan, u64) {
    let c = config(name);
    let (facts, max_pos) = qwen3_30b_a3b(c.kv_dtype.size());
    let context = c.ctx_size.unwrap_or(max_pos);
    let device = PlanDevice { memory: MemoryInfo { free, total }, cpu, experts: true };
    let p = plan_engine_memory(&c, &facts, context, &device);
    eprintln!(
        "{name}: fits {} — budget {:.2} GiB, non-expert {:.2} GiB, KV pool {:.2} GiB ({} tokens a sequence of ctx_size {context}), \
         {} expert slots ({:.2} GiB); warnings {:?}; error {:?}",
        p.fits,
        p.budget_bytes as f64 / GIB as f64,
        p.non_expert_bytes as f64 / GIB as f64,
        p.kv_bytes as f64 / GIB as f64,
        p.kv_context,
        p.cache_slots,
        p.cache_bytes as f64 / GIB as f64,
        p.warnings,
        p.error
    );
    (p, context as u64)
}

#[test]
fn the_model_shape_is_the_one_the_configs_name() {
    let (f, _) = qwen3_30b_a3b(2);
    // 48 layers × (2 × 4 KV heads × 128) f16 values per token; experts 3 × 768 × 2048 bf16.
    assert_eq!(f.kv_bytes_per_token, 98_304);
    assert_eq!(config("desktop-24gb.toml").kv_dtype.size(), 2, "the configs keep the default f16 cache");
    assert_eq!(f.expert_bytes, 3 * 768 * 2048 * 2);
    assert!(f.non_expert_bytes > 2 * GIB && f.non_expert_bytes < 4 * GIB, "{}", f.non_expert_bytes);
}

#[test]
fn laptop_8gb_starts_on_an_8_gib_laptop_gpu() {
    // An 8 GiB laptop GPU with the desktop using 0.5 GiB; the config's budget is 6.5 GiB.
    let (p, ctx) = plan_on("laptop-8gb.toml", 8 * GIB, 15 * GIB / 2, false);
    assert!(p.fits, "{:?}", p.error);
    assert!(p.cache_slots > 0, "no expert cache left");
    // The worst case (32k × 2 sequences, 6 GiB of f16 KV) does not fit beside the weights; the
    // pool still gives one sequence most of the context.
    assert!(p.kv_context >= 16384 && p.kv_context <= ctx, "{}", p.kv_context);
    assert!(p.total_bytes() <= p.budget_bytes);
}

#[test]
fn desktop_24gb_starts_on_a_24_gib_card() {
    let (p, ctx) = plan_on("desktop-24gb.toml", 24 * GIB, 23 * GIB, false);
    assert!(p.fits, "{:?}", p.error);
    // 64k × 4 sequences would be 24 GiB of f16 KV; the pool holds one full-context sequence
    // and the expert cache keeps the rest.
    assert_eq!(p.kv_context, ctx);
    assert!(p.kv_bytes < 4 * ctx * 98_304);
    assert!(p.cache_slots >= 1000, "{}", p.cache_slots);
    assert!(p.total_bytes() <= p.budget_bytes);
}

#[test]
fn cpu_only_starts_with_host_memory() {
    // The CPU backend: the device is host memory (here 64 GiB with 56 free).
    let (p, ctx) = plan_on("cpu-only.toml", 64 * GIB, 56 * GIB, true);
    assert!(p.fits, "{:?}", p.error);
    assert_eq!(p.kv_context, ctx);
    assert_eq!(p.cache_slots, 0);
}
