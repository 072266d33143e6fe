//! `ft-actor info`: what a model is, how it is placed in memory and how misses are split.

use super::{runtime, ModelArgs};
use crate::policy::{format_bytes, q_star};
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

fn count(n: u64) -> String {
    match n {
        n if n >= 1_000_000_000 => format!("{:.2} B", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.2} M", n as f64 / 1e6),
        n => format!("{:.1} K", n as f64 / 1e3),
    }
}

/// `info`.
pub fn run(a: InfoArgs) -> Result<()> {
    let info = runtime()?.block_on(async {
        let engine = a.model.start().await?;
        let info = engine.info().clone();
        engine.shutdown().await;
        anyhow::Ok(info)
    })?;
    let (cfg, st, mem) = (&info.config, &info.stats, &info.memory);
    let m = cfg.top_k;
    let q = q_star(m, info.b_p, info.b_h);
    if a.json {
        let v = serde_json::json!({
            "model_dir": info.model_dir,
            "architecture": cfg.arch.model_type(),
            "layers": cfg.num_layers,
            "moe_layers": cfg.num_moe_layers(),
            "hidden_size": cfg.hidden_size,
            "heads": cfg.num_heads, "kv_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim,
            "experts": cfg.num_experts, "experts_per_token": cfg.top_k,
            "vocab_size": cfg.vocab_size,
            "context": info.context,
            "total_params": st.total_params, "active_params": st.active_params,
            "bytes_per_expert": st.bytes_per_expert, "expert_format": st.expert_format,
            "bytes_by_format": st.bytes_by_format.iter().map(|(f, b)| (f.to_string(), serde_json::json!(b))).collect::<serde_json::Map<_, _>>(),
            "non_expert_bytes": st.non_expert_bytes, "expert_bytes": st.expert_bytes,
            "bytes_per_token": st.bytes_per_token,
            "kv_bytes_per_token": st.kv_bytes_per_token, "kv_dtype": info.kv_dtype.name(),
            "state_bytes_per_sequence": st.state_bytes_per_sequence,
            "layer_kinds": layer_kinds(cfg).into_iter().map(|(k, n)| (k.to_string(), serde_json::json!(n))).collect::<serde_json::Map<_, _>>(),
            "backend": info.backend,
            "b_p": info.b_p, "b_h": info.b_h, "bandwidth_source": info.bandwidth_source,
            "moe_mode": info.moe_mode, "q_star_for_top_k_misses": q,
            "memory_plan": mem,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!("model            {}", info.model_dir.display());
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
    println!("bytes per expert {} ({})", format_bytes(st.bytes_per_expert), st.expert_format);
    println!("weights          {} non-expert (device), {} experts (host pool)", format_bytes(st.non_expert_bytes), format_bytes(st.expert_bytes));
    println!("formats          {}", st.bytes_by_format.iter().map(|(f, b)| format!("{f} {}", format_bytes(*b))).collect::<Vec<_>>().join(", "));
    println!("read per token   {} (decode, batch 1)", format_bytes(st.bytes_per_token));
    println!("KV cache         {} per token ({}); context {}", format_bytes(st.kv_bytes_per_token), info.kv_dtype, info.context);
    if st.state_bytes_per_sequence > 0 {
        let what = if cfg.v4.is_some() { "compressor windows in progress" } else { "linear-attention layers" };
        println!("recurrent state  {} per sequence ({what})", format_bytes(st.state_bytes_per_sequence));
    }
    println!("backend          {}", info.backend);
    println!("bandwidths       B_P {:.2} GB/s host→device, B_H {:.2} GB/s CPU experts ({})", info.b_p / 1e9, info.b_h / 1e9, info.bandwidth_source);
    println!("miss split       {}; q* = {:.2} of {m} misses fetched", info.moe_mode, q);
    println!(
        "memory plan      budget {}: non-expert {}, KV pool {} (a sequence up to {} tokens), scratch {}, {} expert cache slots ({} of {} experts, {}), layer buffers {}",
        format_bytes(mem.budget_bytes),
        format_bytes(mem.non_expert_bytes),
        format_bytes(mem.kv_bytes),
        mem.kv_context,
        format_bytes(mem.scratch_bytes),
        mem.cache_slots,
        mem.cache_slots,
        mem.total_experts,
        format_bytes(mem.cache_bytes),
        format_bytes(mem.stream_buffers_bytes)
    );
    for w in &mem.warnings {
        println!("warning          {w}");
    }
    Ok(())
}

/// How many layers use each token mixer, in a fixed order.
fn layer_kinds(cfg: &crate::model::ModelConfig) -> Vec<(&'static str, usize)> {
    use crate::model::config::{LayerKind, V4Attention};
    if let Some(v4) = &cfg.v4 {
        let n = |k: V4Attention| v4.attention.iter().filter(|a| **a == k).count();
        return [
            ("sliding-window", n(V4Attention::Sliding)),
            ("compressed-sparse (CSA)", n(V4Attention::CompressedSparse)),
            ("heavily-compressed (HCA)", n(V4Attention::HeavilyCompressed)),
        ]
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .collect();
    }
    let full = if cfg.mla.is_some() { "latent-attention" } else { "full-attention" };
    [(full, LayerKind::FullAttention), ("sliding-window", LayerKind::SlidingAttention), ("linear-attention", LayerKind::LinearAttention)]
        .into_iter()
        .map(|(name, k)| (name, cfg.num_layers_of(k)))
        .filter(|(_, n)| *n > 0)
        .collect()
}
