//! `ft-actor info`: what a model is and how it would be placed in memory.

use super::ModelArgs;
use crate::model::info::stats;
use anyhow::Result;
use clap::Args;

/// Arguments of `info`.
#[derive(Args, Debug)]
pub struct InfoArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

fn gib(b: u64) -> String {
    if b >= 1 << 30 {
        format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
    } else {
        format!("{:.2} MiB", b as f64 / (1u64 << 20) as f64)
    }
}

fn count(n: u64) -> String {
    match n {
        n if n >= 1_000_000_000 => format!("{:.2} B", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.2} M", n as f64 / 1e6),
        n => format!("{:.1} K", n as f64 / 1e3),
    }
}

/// `info`.
pub fn run(a: InfoArgs) -> Result<()> {
    let model = a.model.load()?;
    let cfg = model.config();
    let st = stats(&model);
    let be = model.backend();
    let mem = be.memory_info()?;
    let context = a.model.context(&model);
    // Recurrent layers add a fixed-size state per sequence to the per-token caches.
    let kv_reserve = st.kv_bytes_per_token * context as u64 + st.state_bytes_per_sequence;
    // Device memory left after non-expert weights and one full-context KV reserve is what
    // the expert cache may use.
    let cache_bytes = mem.free.saturating_sub(st.non_expert_bytes + kv_reserve);
    let slots = (cache_bytes / st.bytes_per_expert.max(1)).min(st.total_experts);
    if a.json {
        let v = serde_json::json!({
            "model_dir": model.dir(),
            "architecture": cfg.arch.model_type(),
            "layers": cfg.num_layers,
            "moe_layers": cfg.num_moe_layers(),
            "hidden_size": cfg.hidden_size,
            "heads": cfg.num_heads, "kv_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim,
            "experts": cfg.num_experts, "experts_per_token": cfg.top_k,
            "vocab_size": cfg.vocab_size,
            "context": context,
            "total_params": st.total_params, "active_params": st.active_params,
            "bytes_per_expert": st.bytes_per_expert,
            "non_expert_bytes": st.non_expert_bytes, "expert_bytes": st.expert_bytes,
            "bytes_per_token": st.bytes_per_token,
            "kv_bytes_per_token": st.kv_bytes_per_token,
            "state_bytes_per_sequence": st.state_bytes_per_sequence,
            "layer_kinds": layer_kinds(cfg).into_iter().map(|(k, n)| (k.to_string(), serde_json::json!(n))).collect::<serde_json::Map<_, _>>(),
            "backend": be.kind().to_string(), "device": be.device_name(),
            "device_free_bytes": mem.free, "device_total_bytes": mem.total,
            "expert_cache_slots": slots,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!("model            {}", model.dir().display());
    println!("architecture     {} ({} layers, {} MoE)", cfg.arch.model_type(), cfg.num_layers, cfg.num_moe_layers());
    println!("token mixers     {}", layer_kinds(cfg).iter().map(|(k, n)| format!("{n} {k}")).collect::<Vec<_>>().join(", "));
    match &cfg.mla {
        Some(m) => println!(
            "hidden           {}  heads {}, latent attention caching {} latent + {} rotary values per token",
            cfg.hidden_size, cfg.num_heads, m.kv_lora_rank, m.qk_rope_head_dim
        ),
        None => println!("hidden           {}  heads {} / kv {} × {}", cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim),
    }
    if let Some(l) = &cfg.linear_attn {
        println!(
            "linear attention {} key / {} value heads × {}/{}, conv kernel {}",
            l.num_k_heads, l.num_v_heads, l.k_head_dim, l.v_head_dim, l.conv_kernel
        );
    }
    println!("experts          {} per layer, {} per token ({} in all)", cfg.num_experts, cfg.top_k, st.total_experts);
    println!("parameters       {} total, {} active per token", count(st.total_params), count(st.active_params));
    println!("bytes per expert {}", gib(st.bytes_per_expert));
    println!("weights          {} non-expert (device), {} experts (host pool)", gib(st.non_expert_bytes), gib(st.expert_bytes));
    println!("read per token   {} (decode, batch 1)", gib(st.bytes_per_token));
    println!("KV cache         {} per token, {} for a {context}-token context", gib(st.kv_bytes_per_token), gib(kv_reserve));
    if st.state_bytes_per_sequence > 0 {
        println!("recurrent state  {} per sequence (linear-attention layers)", gib(st.state_bytes_per_sequence));
    }
    println!("backend          {} — {}", be.kind(), be.device_name());
    println!("device memory    {} free of {}", gib(mem.free), gib(mem.total));
    println!("memory plan      non-expert {} + KV {} on the device; {} expert slots fit in the rest ({} of {} experts)",
        gib(st.non_expert_bytes), gib(kv_reserve), slots, slots, st.total_experts);
    Ok(())
}

/// How many layers use each token mixer, in a fixed order.
fn layer_kinds(cfg: &crate::model::ModelConfig) -> Vec<(&'static str, usize)> {
    use crate::model::config::LayerKind;
    let full = if cfg.mla.is_some() { "latent-attention" } else { "full-attention" };
    [(full, LayerKind::FullAttention), ("sliding-window", LayerKind::SlidingAttention), ("linear-attention", LayerKind::LinearAttention)]
        .into_iter()
        .map(|(name, k)| (name, cfg.num_layers_of(k)))
        .filter(|(_, n)| *n > 0)
        .collect()
}
