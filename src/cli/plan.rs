//! `ft-actor plan`: will a model run on this machine, in what memory, and how fast — from its
//! config and tensor index alone (safetensors headers, a GGUF header), before the weights are
//! read or downloaded.
//!
//! The memory plan is the engine's own ([`plan_engine_memory`]). The decode prediction
//! ([`crate::policy::fit`]) prices the bytes a token reads at rates measured now: the CPU
//! kernels streaming each weight format this model uses ([`cpu_stream_rate`]), and for a GPU
//! the bandwidths given on the command line; expert cache hits come from a simulated routing
//! trace over the cache the plan leaves.

use crate::bench::stream::{cpu_stream_rate, ExpertShape, StreamRate};
use crate::engine::memory::{plan_engine_memory, PlanDevice, PlanFacts};
use crate::engine::{EngineConfig, QuantDot};
use crate::kv::SequenceState;
use crate::model::footprint::{footprint, Footprint};
use crate::policy::fit::{predict_cpu, predict_gpu, simulate_hit_rate, GpuRates, Prediction, TokenReads, TraceShape};
use crate::policy::{format_bytes, parse_bytes, MemoryPlan, ResolvedMode};
use anyhow::{bail, Context, Result};
use clap::Args;
use ft_backend::{DType, MemoryInfo};
use std::path::PathBuf;

/// Arguments of `plan`.
#[derive(Args, Debug)]
pub struct PlanArgs {
    /// Checkpoint folder, GGUF file, or Hugging Face model name (only its config and headers
    /// are fetched).
    #[arg(long, env = "FT_MODEL")]
    model: PathBuf,
    /// GPU memory (e.g. `24GiB`); without it the plan is for the CPU alone.
    #[arg(long, value_parser = parse_size)]
    vram: Option<u64>,
    /// Host memory (default: this machine's).
    #[arg(long, value_parser = parse_size)]
    ram: Option<u64>,
    /// GPU memory bandwidth in GB/s (with --vram; e.g. 936 for an RTX 3090).
    #[arg(long)]
    gpu_bandwidth: Option<f64>,
    /// Host→GPU copy bandwidth in GB/s (with --vram; default 25, PCIe 4.0 x16 in practice).
    #[arg(long)]
    pcie_bandwidth: Option<f64>,
    /// CPU streaming bandwidth in GB/s for every format, instead of measuring the kernels now.
    #[arg(long)]
    cpu_bandwidth: Option<f64>,
    /// Context per sequence the memory plan reserves for (default: the model's maximum).
    #[arg(long)]
    ctx_size: Option<usize>,
    /// Sequences at once.
    #[arg(long, default_value_t = 4)]
    max_active: usize,
    /// Tokens of context the decode prediction reads the cache over.
    #[arg(long, default_value_t = 1024)]
    at_context: usize,
    /// CPU threads of the rate probes (default: all cores).
    #[arg(long, env = "FT_CPU_THREADS")]
    cpu_threads: Option<usize>,
    /// Seconds each rate probe runs (the median pass counts; bandwidth moves from second to second).
    #[arg(long, default_value_t = 2.0)]
    probe_seconds: f64,
    /// CPU products: int8 (activations quantized, the engine's default) or exact.
    #[arg(long, default_value = "int8", env = "FT_QUANT_DOT")]
    quant_dot: QuantDot,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

fn parse_size(s: &str) -> Result<u64, String> {
    parse_bytes(s).map_err(|e| e.to_string())
}

fn gb(x: f64) -> f64 {
    x * 1e9
}

/// This machine's memory: (available, total) bytes.
fn host_memory() -> Option<(u64, u64)> {
    let field = |k: &str| ft_backend_cpu::meminfo_kib(k).map(|kib| kib * 1024);
    Some((field("MemAvailable:")?, field("MemTotal:")?))
}

/// `plan`.
pub fn run(a: PlanArgs) -> Result<()> {
    let path = crate::hub::resolve_index_arg(&a.model)?;
    let (cfg, files, scheme) = crate::model::open_checkpoint(&path).with_context(|| format!("cannot read {}", path.display()))?;
    let fp = footprint(&files, &cfg, &scheme);
    let engine = EngineConfig { ctx_size: a.ctx_size, max_active: a.max_active.max(1), ..EngineConfig::default() };
    // The engine keeps DeepSeek-V4's state in f32 and other caches in its default type.
    let kv_dtype = if cfg.v4.is_some() { DType::F32 } else { engine.kv_dtype };
    let kv_per_token = SequenceState::bytes_per_token_of(&cfg, kv_dtype) as u64;
    let facts = PlanFacts {
        non_expert_bytes: fp.non_expert_bytes,
        kv_bytes_per_token: kv_per_token,
        state_bytes_per_sequence: SequenceState::fixed_bytes_of(&cfg) as u64,
        expert_bytes: fp.bytes_per_expert,
        experts_per_layer: cfg.num_experts as u64,
        moe_layers: fp.moe_layers,
    };
    let context = a.ctx_size.unwrap_or(cfg.max_position_embeddings).max(1);
    let (ram_free, ram_total) = match a.ram {
        Some(r) => (r, r),
        None => host_memory().unwrap_or((0, 0)),
    };
    let gpu = a.vram.is_some();
    let device = match a.vram {
        Some(v) => PlanDevice { memory: MemoryInfo { free: v, total: v }, cpu: false, experts: true },
        None => PlanDevice { memory: MemoryInfo { free: ram_free, total: ram_total }, cpu: true, experts: true },
    };
    let mem = plan_engine_memory(&engine, &facts, context, &device);
    // Host RAM holds the experts, copied or mapped (and, CPU only, everything else and the KV pool); past
    // it every token re-reads experts from disk.
    let host_need = fp.expert_bytes + if gpu { 0 } else { fp.non_expert_bytes + mem.kv_bytes } + (1 << 30);
    let ram_fits = ram_total == 0 || host_need <= ram_total;

    // Rates: each format that is at least 2 % of a token's reads, measured on the CPU kernels.
    let threads = a.cpu_threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let pool = ft_backend_cpu::start_pool(Some(threads)).map_err(|e| anyhow::anyhow!("cannot start the CPU pool: {e}"))?;
    let mut rates: Vec<StreamRate> = Vec::new();
    // Experts of the model's own shape, `top_k` at once, as decoding computes them.
    let probe_shape = ExpertShape {
        hidden: cfg.hidden_size,
        intermediate: if cfg.moe_intermediate_size > 0 { cfg.moe_intermediate_size } else { cfg.intermediate_size },
        parallel: cfg.top_k.max(1),
    };
    let mut rate_of = |d: DType| -> Result<f64> {
        if let Some(bw) = a.cpu_bandwidth {
            return Ok(gb(bw));
        }
        if let Some(r) = rates.iter().find(|r| r.dtype == d) {
            return Ok(r.bytes_per_s);
        }
        if !a.json {
            eprintln!("measuring the CPU kernels on {} weights…", d.name());
        }
        let r = cpu_stream_rate(&pool, a.quant_dot, d, probe_shape, std::time::Duration::from_secs_f64(a.probe_seconds.max(0.1)))
            .map_err(|e| anyhow::anyhow!("rate probe for {}: {e}", d.name()))?;
        rates.push(r);
        Ok(r.bytes_per_s)
    };
    let main_rate_dtype = fp.expert_read.first().or(fp.dense_read.first()).map(|p| p.0).unwrap_or(DType::BF16);
    let mut priced = |parts: &[(DType, u64)]| -> Result<Vec<(u64, f64)>> {
        let mut out = Vec::new();
        for &(d, b) in parts {
            let probe = if b * 50 >= fp.bytes_per_token.max(1) { d } else { main_rate_dtype };
            out.push((b, rate_of(probe)?));
        }
        Ok(out)
    };
    let reads = TokenReads {
        dense: priced(&fp.dense_read)?,
        experts: priced(&fp.expert_read)?,
        expert_bytes: fp.bytes_per_expert,
        top_k: cfg.top_k,
        moe_layers: fp.moe_layers as usize,
        kv_bytes: kv_per_token * a.at_context as u64,
    };
    // With a GPU the modes are offload, hybrid and cpu (hits on the device, misses on the
    // CPU); without one, the CPU alone.
    let mut predictions: Vec<Prediction> = if gpu { Vec::new() } else { vec![predict_cpu(&reads)] };
    let mut curve = Vec::new();
    let mut gpu_rates = None;
    if gpu {
        let Some(memory) = a.gpu_bandwidth else {
            bail!("--vram needs --gpu-bandwidth, the GPU's memory bandwidth in GB/s (e.g. 936 for an RTX 3090, 1008 for an RTX 4090, 1792 for an RTX 5090)")
        };
        let rates = GpuRates { memory: gb(memory), link: gb(a.pcie_bandwidth.unwrap_or(25.0)) };
        gpu_rates = Some(rates);
        let per_layer = (mem.cache_slots / fp.moe_layers.max(1)) as usize;
        let hit = simulate_hit_rate(cfg.num_experts, cfg.top_k, per_layer, TraceShape::default());
        for mode in [ResolvedMode::Offload, ResolvedMode::Hybrid] {
            predictions.push(predict_gpu(&reads, rates, hit, mode));
        }
        // `cpu` with a GPU: hits on the device, misses on the CPU.
        predictions.push(predict_gpu(&reads, rates, hit, ResolvedMode::Cpu));
        for pct in [10usize, 25, 50, 75, 100] {
            let slots = cfg.num_experts * pct / 100;
            curve.push((pct, slots, simulate_hit_rate(cfg.num_experts, cfg.top_k, slots, TraceShape::default())));
        }
    }
    let fits = mem.fits && ram_fits;
    if a.json {
        let v = serde_json::json!({
            "model": path,
            "architecture": cfg.arch.model_type(),
            "fits": fits, "device_plan_fits": mem.fits, "ram_fits": ram_fits,
            "ram_total": ram_total, "host_bytes_needed": host_need,
            "footprint": footprint_json(&fp),
            "kv_bytes_per_token": kv_per_token, "kv_dtype": kv_dtype.name(),
            "memory_plan": mem,
            "cpu_rates": rates, "cpu_bandwidth_override_gbs": a.cpu_bandwidth,
            "gpu": gpu_rates,
            "at_context": a.at_context,
            "predictions": predictions,
            "hit_rate_curve": curve.iter().map(|(p, s, h)| serde_json::json!({"percent": p, "slots_per_layer": s, "hit_rate": h})).collect::<Vec<_>>(),
            "trace": TraceShape::default(),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    print_text(&a, &cfg, &fp, &mem, kv_per_token, kv_dtype, ram_total, host_need, ram_fits, &rates, &predictions, &curve);
    Ok(())
}

fn footprint_json(fp: &Footprint) -> serde_json::Value {
    let parts = |v: &[(DType, u64)]| v.iter().map(|(d, b)| (d.name().to_string(), serde_json::json!(b))).collect::<serde_json::Map<_, _>>();
    serde_json::json!({
        "non_expert_bytes": fp.non_expert_bytes, "expert_bytes": fp.expert_bytes, "bytes_per_expert": fp.bytes_per_expert,
        "total_experts": fp.total_experts, "moe_layers": fp.moe_layers, "bytes_per_token": fp.bytes_per_token,
        "dense_read_per_token": parts(&fp.dense_read), "expert_read_per_token": parts(&fp.expert_read),
        "expert_format": fp.expert_format.map(|d| d.name()),
    })
}

#[allow(clippy::too_many_arguments)]
fn print_text(
    a: &PlanArgs,
    cfg: &crate::model::ModelConfig,
    fp: &Footprint,
    mem: &MemoryPlan,
    kv_per_token: u64,
    kv_dtype: DType,
    ram_total: u64,
    host_need: u64,
    ram_fits: bool,
    rates: &[StreamRate],
    predictions: &[Prediction],
    curve: &[(usize, usize, f64)],
) {
    let fmt = |v: &[(DType, u64)]| v.iter().map(|(d, b)| format!("{} {}", d.name(), format_bytes(*b))).collect::<Vec<_>>().join(", ");
    println!("model            {} ({}, {} layers, {} experts top-{})", a.model.display(), cfg.arch.model_type(), cfg.num_layers, cfg.num_experts, cfg.top_k);
    println!(
        "weights          {} non-expert, {} experts ({} each, {})",
        format_bytes(fp.non_expert_bytes),
        format_bytes(fp.expert_bytes),
        format_bytes(fp.bytes_per_expert),
        fp.expert_format.map_or("none", |d| d.name())
    );
    println!("read per token   {} (non-expert: {}; experts: {})", format_bytes(fp.bytes_per_token), fmt(&fp.dense_read), fmt(&fp.expert_read));
    println!("KV cache         {} per token ({kv_dtype})", format_bytes(kv_per_token));
    let target = match a.vram {
        Some(v) => format!("GPU with {}", format_bytes(v)),
        None => "CPU only".into(),
    };
    println!(
        "memory plan      {target}: budget {}, non-expert {}, KV pool {} (a sequence up to {} tokens), {} expert cache slots ({}), scratch {}",
        format_bytes(mem.budget_bytes),
        format_bytes(mem.non_expert_bytes),
        format_bytes(mem.kv_bytes),
        mem.kv_context,
        mem.cache_slots,
        format_bytes(mem.cache_bytes),
        format_bytes(mem.scratch_bytes)
    );
    println!(
        "host memory      needs {} of {} ({})",
        format_bytes(host_need),
        if ram_total == 0 { "unknown".into() } else { format_bytes(ram_total) },
        if ram_fits { "fits" } else { "does not fit: experts would be re-read from disk every token" }
    );
    match (&mem.error, mem.fits && ram_fits) {
        (Some(e), _) => println!("fits             no: {e}"),
        (None, false) => println!("fits             no: host memory"),
        (None, true) => println!("fits             yes"),
    }
    for w in &mem.warnings {
        println!("warning          {w}");
    }
    match a.cpu_bandwidth {
        Some(bw) => println!("CPU rates        {bw:.1} GB/s for every format (--cpu-bandwidth)"),
        None => println!(
            "CPU rates        {} (measured now: {} experts of this shape at once, one token, {} of weights a pass; median pass, min–max)",
            rates
                .iter()
                .map(|r| format!("{} {:.1} GB/s ({:.1}–{:.1}, {} passes)", r.dtype.name(), r.bytes_per_s / 1e9, r.min_bytes_per_s / 1e9, r.max_bytes_per_s / 1e9, r.passes))
                .collect::<Vec<_>>()
                .join(", "),
            cfg.top_k.max(1),
            format_bytes(rates.first().map_or(0, |r| r.bytes))
        ),
    }
    if !curve.is_empty() {
        println!(
            "hit rate         {} (experts cached per layer → LRU hit rate on a simulated Zipf-{} routing trace)",
            curve.iter().map(|(p, _, h)| format!("{p}% → {:.0}%", h * 100.0)).collect::<Vec<_>>().join(", "),
            TraceShape::default().zipf
        );
    }
    println!("predicted decode at {} tokens of context (one sequence):", a.at_context);
    for p in predictions {
        let b = p.breakdown;
        let extra = if p.mode == "cpu" && a.vram.is_none() { String::new() } else { format!(", hit rate {:.0}%, {:.1} misses fetched per layer", p.hit_rate * 100.0, p.fetched_per_layer) };
        println!(
            "  {:<8} {:>7.1} tokens/s  (ms per token: non-expert {:.2}, experts {:.2}, misses {:.2}, KV {:.2}{extra})",
            p.mode,
            p.tokens_per_s,
            b.dense_s * 1e3,
            b.experts_s * 1e3,
            b.misses_s * 1e3,
            b.kv_s * 1e3
        );
    }
}
