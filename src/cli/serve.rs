//! `ft-actor serve`: the OpenAI/Anthropic-compatible server.

use crate::config::ServeConfig;
use crate::engine::Engine;
use crate::server::{AppState, ServerSettings};
use anyhow::{Context, Result};
use clap::Args;
use serde::Serialize;
use serde_json::{Map, Value};
use std::path::PathBuf;

/// Settings given as flags. Each is optional: an absent flag leaves the value from the
/// config file, the `FT_*` environment or the built-in default. Field names are the keys.
#[derive(Args, Debug, Clone, Default, Serialize)]
pub struct ConfigArgs {
    /// TOML deployment file (see configs/).
    #[arg(long, env = "FT_CONFIG", value_name = "FILE")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Checkpoint folder, GGUF file, or Hugging Face model name (`org/name[:revision]`,
    /// `org/name/file.gguf`). Default: the built-in demo model.
    #[arg(long, value_name = "DIR|FILE|NAME")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Backend: auto, cpu, cuda or wgpu.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    /// CPU threads (default: all cores).
    #[arg(long, value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_threads: Option<usize>,
    /// CPU products with quantized weights: int8 (activations quantized, fast) or exact (f32).
    #[arg(long, value_name = "int8|exact")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quant_dot: Option<String>,
    /// Device memory the engine may use: bytes (e.g. 6GiB) or auto.
    #[arg(long, value_name = "BYTES|auto")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vram_budget: Option<String>,
    /// Expert cache slots, overriding the number derived from the budget.
    #[arg(long, value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expert_cache_slots: Option<u64>,
    /// Where expert cache misses run: auto, offload, cpu or hybrid.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub moe_mode: Option<String>,
    /// Prefill path: auto, decode or stream.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefill: Option<String>,
    /// Context length per sequence (default: the model's maximum).
    #[arg(long, value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ctx_size: Option<usize>,
    /// Sequences generating at once.
    #[arg(long, value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_active: Option<usize>,
    /// Most tokens one batched step runs (decodes first, then prompt chunks).
    #[arg(long, value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step_tokens: Option<usize>,
    /// Bytes of the KV pool the sequences share (e.g. 4GiB), or auto.
    #[arg(long, value_name = "BYTES")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_budget: Option<String>,
    /// Rows per page of the KV pool.
    #[arg(long, value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_page_rows: Option<usize>,
    /// What the KV caches hold: f16 (default), bf16, f32 or q8_0 (CPU backend).
    #[arg(long, value_name = "DTYPE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_dtype: Option<String>,
    /// Requests waiting beyond the active ones before new ones get 429.
    #[arg(long, value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_queue: Option<usize>,
    /// Host→device bandwidth in bytes/s (e.g. 25GB), instead of measuring it.
    #[arg(long, value_name = "BYTES")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub b_p: Option<String>,
    /// CPU expert streaming rate in bytes/s (e.g. 40GB), instead of measuring it.
    #[arg(long, value_name = "BYTES")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub b_h: Option<String>,
    /// Folder for bandwidth profiles.
    #[arg(long, value_name = "DIR")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_dir: Option<String>,
    /// Bytes of saved conversation state for prefix reuse (e.g. 4GiB; 0 turns reuse off).
    #[arg(long, value_name = "BYTES")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix_cache_budget: Option<String>,
    /// Of those, bytes kept in device memory: bytes or auto.
    #[arg(long, value_name = "BYTES|auto")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix_cache_device_budget: Option<String>,
    /// Recurrent models: anchor every N tokens of a stretch without a boundary token.
    #[arg(long, value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub anchor_interval: Option<usize>,
    /// Address to listen on.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Port to listen on.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// Model id reported to and accepted from clients.
    #[arg(long, value_name = "NAME")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub served_model_name: Option<String>,
    /// A further accepted model id (repeatable).
    #[arg(long = "model-alias", value_name = "NAME")]
    #[serde(rename = "model_aliases", skip_serializing_if = "Vec::is_empty")]
    pub model_aliases: Vec<String>,
    /// Require this key (Authorization: Bearer KEY or x-api-key).
    #[arg(long, value_name = "KEY")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_key: Option<String>,
    /// Largest request body (e.g. 32MiB).
    #[arg(long, value_name = "BYTES")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_body_bytes: Option<String>,
    /// New tokens when a request sets no limit (default: the rest of the context).
    #[arg(long, value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_max_tokens: Option<usize>,
    /// Most new tokens any request generates, however many it asks for.
    #[arg(long, value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tokens_limit: Option<usize>,
    /// Reasoning split: auto, think or none.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_parser: Option<String>,
    /// Tool-call format: auto, hermes, qwen3_coder, deepseek, deepseek_dsml, kimi, minimax, mistral, harmony or none.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_parser: Option<String>,
    /// Answer 400 to unknown request fields (true) or ignore them (false).
    #[arg(long, value_name = "BOOL")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reject_unknown_fields: Option<bool>,
    /// Responses kept for GET /v1/responses/{id}.
    #[arg(long, value_name = "N")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_stored_responses: Option<usize>,
    /// Seconds of silence before a stream gets a keep-alive (0: never).
    #[arg(long, value_name = "SECS")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keepalive_secs: Option<u64>,
    /// Serve POST /v1/debug/faults, which makes the next expert copies, CPU kernels or cache
    /// allocations fail (robustness tests only).
    #[arg(long, value_name = "BOOL")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fault_injection: Option<bool>,
}

impl ConfigArgs {
    /// The flags that were given, as config keys.
    pub fn overrides(&self) -> Map<String, Value> {
        match serde_json::to_value(self) {
            Ok(Value::Object(m)) => m,
            _ => Map::new(),
        }
    }

    /// The effective configuration (defaults → file → environment → these flags).
    pub fn load(&self) -> Result<ServeConfig> {
        Ok(ServeConfig::load(self.config.as_deref(), self.overrides())?)
    }

    /// The flags again, for starting `ft-actor serve` with the same settings.
    pub fn to_argv(&self) -> Vec<String> {
        let mut argv = vec![];
        if let Some(c) = &self.config {
            argv.push("--config".into());
            argv.push(c.display().to_string());
        }
        for (k, v) in self.overrides() {
            let flag = if k == "model_aliases" { "--model-alias".to_string() } else { format!("--{}", k.replace('_', "-")) };
            let values = match v {
                Value::Array(a) => a,
                v => vec![v],
            };
            for v in values {
                argv.push(flag.clone());
                argv.push(match v {
                    Value::String(s) => s,
                    other => other.to_string(),
                });
            }
        }
        argv
    }
}

/// Arguments of `serve`.
#[derive(Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    cfg: ConfigArgs,
    /// Print the effective configuration as TOML and exit.
    #[arg(long)]
    print_config: bool,
}

/// Runs `ft-actor serve`.
pub fn run(args: ServeArgs) -> Result<()> {
    let cfg = args.cfg.load()?;
    if args.print_config {
        print!("{}", cfg.to_toml());
        return Ok(());
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("cannot start the async runtime")?;
    rt.block_on(serve(cfg))
}

async fn serve(cfg: ServeConfig) -> Result<()> {
    let ServeConfig { engine: mut engine_cfg, mut server, .. } = cfg;
    // A hub model name is served under that name, not its snapshot folder's commit hash.
    if let Some(name) = engine_cfg.model.as_deref().filter(|m| !m.exists()).and_then(|m| m.to_str()).and_then(crate::hub::ModelName::parse) {
        server.served_model_name.get_or_insert_with(|| name.display());
    }
    engine_cfg.model = super::resolve_model(engine_cfg.model.take()).await?;
    let backend = engine_cfg.backend;
    let addr = format!("{}:{}", server.host, server.port);
    // Bind first: a busy port should fail before minutes of model loading.
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .with_context(|| format!("cannot listen on {addr} (is another server running there? choose one with --port)"))?;
    eprintln!("loading the model…");
    let engine = Engine::spawn(engine_cfg, None)
        .await
        .with_context(|| format!("cannot start the engine with --backend {}", backend_label(backend)))?;
    let state = AppState::new(engine.clone(), server.clone()).context("cannot prepare the server")?;
    // With `--port 0` the system picked the port: report the real one.
    let actual_port = listener.local_addr().map(|a| a.port()).unwrap_or(server.port);
    print_banner(&state, &ServerSettings { port: actual_port, ..server.clone() });
    // On a signal, stop accepting and let streams finish for a few seconds, not forever.
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let graceful = async move {
        let _ = stop_rx.wait_for(|stop| *stop).await;
    };
    let server_run = crate::server::serve(listener, state, graceful);
    let result = tokio::select! {
        r = server_run => r,
        _ = async {
            shutdown_signal().await;
            let _ = stop_tx.send(true);
            tokio::time::sleep(std::time::Duration::from_secs(5)).await;
        } => Ok(()),
    };
    engine.shutdown().await;
    result.map_err(Into::into)
}

fn backend_label(b: crate::device::BackendChoice) -> String {
    format!("{b:?}").to_ascii_lowercase()
}

fn print_banner(state: &AppState, s: &ServerSettings) {
    let info = state.engine.info();
    let url = s.base_url();
    eprintln!("model   {} ({})", state.model_id, info.model_dir.display());
    eprintln!("backend {} · context {} tokens · MoE mode {}", info.backend, info.context, info.moe_mode);
    eprintln!("serving {url}/v1 (OpenAI: chat/completions, completions, responses, models; Anthropic: messages)");
    if s.api_key.is_none() && !matches!(s.host.as_str(), "127.0.0.1" | "localhost" | "::1") {
        eprintln!("warning: listening on {} without --api-key: anyone who can reach this port can use the model", s.host);
    }
    // The line `launch` and scripts wait for.
    println!("ft-actor listening on {url}");
}

async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    eprintln!("shutting down");
}
