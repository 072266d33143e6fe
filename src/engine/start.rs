//! Engine start-up: load, measure, plan, spawn.

use super::api::*;
use super::driver::{DriverArgs, EngineDriver};
use super::EngineHandle;
use crate::actors::cache::CacheManager;
use crate::actors::cpu::{expert_on_cpu, CpuExecutors, CpuMsg};
use crate::actors::device::{DeviceArgs, DeviceStream};
use crate::actors::faults::FaultInjector;
use crate::actors::pipeline::PipelineLinks;
use crate::actors::router::{Router, RouterArgs};
use crate::actors::slots::{upload_expert, ExpertShape, SlotPool};
use crate::actors::transfer::TransferEngine;
use crate::actors::HostExperts;
use crate::device::{create_backend, DeviceOptions};
use crate::model::generation_config::GenerationConfig;
use crate::model::info::stats;
use crate::kv::reuse::{PrefixStore, ReuseSettings};
use crate::model::Model;
use super::memory::{plan_engine_memory, reuse_device_bytes, PlanDevice, PlanFacts};
use crate::policy::{self, BandwidthProfile, SplitCosts};
use crate::tokenizer::{Tokenizer, TokenizerError};
use ft_backend::{Backend, BackendKind};
use ractor::Actor;
use std::sync::Arc;
use std::time::Instant;

fn start_err(e: impl std::fmt::Display) -> EngineError {
    EngineError::Start(e.to_string())
}

/// Measures `(b_p, b_h)`: host→device copies of one expert through the backend, and the CPU
/// executor kernel streaming one expert for a single token. Best of a few repetitions.
fn measure_bandwidths(be: &dyn Backend, host: &HostExperts, shape: ExpertShape, cpu_pool: &rayon::ThreadPool, quant_dot: QuantDot, act: ft_backend::BinaryOp) -> Result<(f64, f64), EngineError> {
    let Some(w) = host.iter().flat_map(|l| l.first()).next() else { return Ok((0.0, 0.0)) };
    let bytes = w.size_bytes() as f64;
    // Enough repetitions to measure a few megabytes even for tiny experts.
    let reps = ((8 << 20) as f64 / bytes).clamp(3.0, 200.0) as usize;
    let mut slot = SlotPool::new_detached(be, shape).map_err(start_err)?;
    let stream = be.create_stream().map_err(start_err)?;
    let mut best_p = f64::INFINITY;
    for _ in 0..reps {
        let t = Instant::now();
        upload_expert(be, stream, w, &mut slot).map_err(start_err)?;
        be.synchronize(stream).map_err(start_err)?;
        best_p = best_p.min(t.elapsed().as_secs_f64());
    }
    let level = ft_backend_cpu::kernels::SimdLevel::Auto.effective();
    let x = vec![0.01f32; w.gate.cols];
    let mut best_h = f64::INFINITY;
    for _ in 0..reps {
        let t = Instant::now();
        expert_on_cpu(Some(cpu_pool), level, quant_dot, act, w, &x, 1).map_err(start_err)?;
        best_h = best_h.min(t.elapsed().as_secs_f64());
    }
    Ok((bytes / best_p.max(1e-9), bytes / best_h.max(1e-9)))
}


pub(super) async fn spawn(
    config: EngineConfig,
    supervisor: Option<ractor::ActorCell>,
    mut progress: Box<dyn FnMut(usize, usize) + Send>,
) -> Result<EngineHandle, EngineError> {
    let dir = match &config.model {
        Some(d) => d.clone(),
        None => crate::demo::demo_model_dir().map_err(start_err)?,
    };
    // One worker pool for the CPU backend's kernels and the CPU expert executors, so the
    // cores are never oversubscribed: with a pool each, the idle one's workers spun and
    // yielded on the cores the busy one was streaming weights on.
    let cpu_pool = Arc::new(ft_backend_cpu::start_pool(config.cpu_threads).map_err(start_err)?);
    let backend = create_backend(&DeviceOptions {
        backend: config.backend,
        cpu_threads: config.cpu_threads,
        quant_dot: config.quant_dot,
        cpu_pool: Some(cpu_pool.clone()),
    })
    .map_err(start_err)?;
    let load_dir = dir.clone();
    let load_backend = backend.clone();
    let model = tokio::task::spawn_blocking(move || Model::load(&load_dir, load_backend, &mut *progress))
        .await
        .map_err(start_err)?
        .map_err(start_err)?;
    let model = Arc::new(model);
    let tokenizer = match Tokenizer::open(&dir) {
        Ok(t) => Some(Arc::new(t)),
        // Only an absent tokenizer is allowed (token ids in and out); one that is there but
        // does not load is an error, not a silent switch to ids.
        Err(TokenizerError::Io { path, source }) if source.kind() == std::io::ErrorKind::NotFound => {
            tracing::warn!("no tokenizer ({} not found): the engine takes and returns token ids only", path.display());
            None
        }
        Err(e) => return Err(EngineError::Start(format!("the model's tokenizer does not load: {e}"))),
    };
    let gen_cfg = GenerationConfig::from_dir(&dir).map_err(start_err)?;
    let mut eos_ids = model.config().eos_token_ids.clone();
    eos_ids.extend(&gen_cfg.eos_token_ids);
    eos_ids.extend(tokenizer.as_ref().and_then(|t| t.eos_token_id()));
    eos_ids.sort_unstable();
    eos_ids.dedup();

    let cfg = model.config().clone();
    let mut st = stats(&model);
    // A backend that cannot write (or attend over) the narrow cache type keeps f32; sizes its
    // attention kernel cannot take fall back to the CPU's, which reads every type.
    let kv_dtype = if cfg.v4.is_some() {
        // DeepSeek-V4's attention reads its state on the host, in f32.
        ft_backend::DType::F32
    } else {
        let wanted = kv_type_for(&model, config.kv_dtype);
        if backend.supports_store(wanted) && backend.supports(ft_backend::Op::Attention, wanted) {
            wanted
        } else {
            tracing::warn!("the {} backend cannot keep a {wanted} KV cache: using f32", backend.kind());
            ft_backend::DType::F32
        }
    };
    st.kv_bytes_per_token = crate::kv::SequenceState::bytes_per_token_as(&model, kv_dtype) as u64;
    let context = config.ctx_size.unwrap_or(cfg.max_position_embeddings).max(1);
    let host: HostExperts = Arc::new((0..cfg.num_layers).map(|l| model.experts(l).to_vec()).collect());
    let shape = ExpertShape::covering(cfg.moe_intermediate_size, cfg.hidden_size, host.iter().flatten());
    // The profile key names the experts' main format (the gate's).
    let dtype = shape.dtypes[0];

    // With the CPU as the device, cached copies of experts would live in the same memory as
    // the host pool: the default is no cache, every expert computed from the mapped file.
    let cpu_device = backend.kind() == BackendKind::Cpu;
    // A device with no matmul kernel for the experts' block type cannot compute a cached
    // expert: every routed expert then runs on the CPU executors.
    let device_experts = shape.dtypes.iter().all(|d| backend.supports(ft_backend::Op::Matmul, *d));
    if !device_experts {
        tracing::warn!("the {} backend has no {} matmul kernel: routed experts run on the CPU, with no expert cache", backend.kind(), dtype);
    }
    let mem = backend.memory_info().map_err(start_err)?;
    let device = PlanDevice { memory: mem, cpu: cpu_device, experts: device_experts };
    let reuse_device = reuse_device_bytes(&config, &device);
    let facts = PlanFacts {
        non_expert_bytes: st.non_expert_bytes,
        kv_bytes_per_token: st.kv_bytes_per_token,
        state_bytes_per_sequence: st.state_bytes_per_sequence,
        expert_bytes: shape.bytes(),
        experts_per_layer: cfg.num_experts as u64,
        moe_layers: cfg.num_moe_layers() as u64,
    };
    let memory = plan_engine_memory(&config, &facts, context, &device);
    if !memory.fits {
        return Err(EngineError::Start(memory.error.clone().unwrap_or_else(|| "the model does not fit the memory budget".into())));
    }
    for w in &memory.warnings {
        tracing::warn!("{w}");
    }
    // A sequence never holds more than the pool: a longer context is refused at admission.
    let context = context.min(memory.kv_context.max(1) as usize);

    // Bandwidths: configured > stored profile > measured now (then stored).
    let machine = policy::machine_id();
    let backend_name = format!("{} {}", backend.kind(), backend.device_name());
    let key = policy::profile_key(&machine, &backend_name, dtype.name());
    let cache_dir = config.cache_dir.clone().or_else(policy::profile::default_cache_dir);
    let stored = cache_dir.as_ref().and_then(|d| policy::profile::load(d, &key).ok().flatten());
    let resolved = policy::resolve_bandwidths(stored.as_ref(), config.b_h, config.b_p).map_err(start_err)?;
    let (b_p, b_h, source) = match resolved.values() {
        Some((b_h, b_p)) => {
            let configured = config.b_p.is_some() && config.b_h.is_some();
            (b_p, b_h, if configured { "config" } else { "profile" })
        }
        None => {
            let (mp, mh) = measure_bandwidths(backend.as_ref(), &host, shape, &cpu_pool, config.quant_dot, cfg.expert_activation.binary_op())?;
            let b_p = config.b_p.unwrap_or(mp);
            let b_h = config.b_h.unwrap_or(mh);
            if let Some(d) = &cache_dir {
                if let Err(e) = policy::profile::save(d, &BandwidthProfile::new(mh, mp, &machine, &backend_name, dtype.name())) {
                    tracing::warn!("bandwidth profile not saved: {e}");
                }
            }
            (b_p, b_h, "measured")
        }
    };
    let slots = memory.cache_slots;
    let (mode, why) = config.moe_mode.resolve_explained(b_p, b_h, slots as usize);
    tracing::info!(b_p, b_h, source, slots, ?mode, why, "engine plan");

    let faults = Arc::new(FaultInjector::default());
    let pool = Arc::new(SlotPool::new(backend.clone(), shape, slots as usize, faults.clone()).map_err(start_err)?);
    let (cache, _) = Actor::spawn(None, CacheManager, slots).await.map_err(start_err)?;
    let (transfer, _) =
        Actor::spawn(None, TransferEngine, (backend.clone(), pool.clone(), host.clone(), faults.clone())).await.map_err(start_err)?;
    let cpu_args = (cpu_pool.clone(), config.quant_dot, cfg.expert_activation.binary_op(), host.clone(), faults.clone());
    let (cpu, _) = Actor::spawn(None, CpuExecutors, cpu_args).await.map_err(start_err)?;
    let costs = SplitCosts::new(st.bytes_per_expert, b_p, b_h);
    let (router, _) = Actor::spawn(None, Router, RouterArgs { cache: cache.clone(), mode, costs }).await.map_err(start_err)?;
    let intake = ractor::call!(cpu, CpuMsg::Intake).map_err(start_err)?;
    let links = PipelineLinks { router: router.clone(), transfer: transfer.clone(), cpu: intake, cache: cache.clone(), pool: pool.clone() };
    let device_args = DeviceArgs {
        model: model.clone(),
        links,
        cache: cache.clone(),
        mode,
        moe: config.moe_mode,
        max_cache_slots: memory.max_cache_slots,
        device_experts,
        prefill: config.prefill,
        bandwidths: (b_p, b_h),
        streaming_available: device_experts && (memory.streaming_prefill || config.prefill == PrefillMode::Stream),
        reuse: PrefixStore::new(
            ReuseSettings {
                budget: config.prefix_cache_budget,
                device_budget: reuse_device,
                interval: config.anchor_interval.max(1),
                boundary_ids: tokenizer.as_ref().map(|t| t.boundary_ids()).unwrap_or_default(),
            },
            cfg.has_summarising_state(),
            backend.clone(),
        ),
        step_tokens: config.step_tokens.max(1),
        kv_pool: memory.kv_bytes,
        kv_dtype,
        kv_page_rows: config.kv_page_rows.max(1),
        host_pool: (backend.kind() == ft_backend::BackendKind::Cpu).then(|| cpu_pool.clone()),
    };
    let (device, _) = Actor::spawn(None, DeviceStream, device_args).await.map_err(start_err)?;
    let info = Arc::new(EngineInfo {
        model_dir: dir,
        config: cfg,
        stats: st,
        context,
        backend: backend_name,
        moe_mode: format!("{} → {mode:?} ({why})", config.moe_mode),
        b_p,
        b_h,
        bandwidth_source: source.into(),
        memory,
        kv_dtype,
        eos_ids,
    });
    let args = DriverArgs {
        device: device.clone(),
        info: info.clone(),
        tokenizer: tokenizer.clone(),
        max_active: config.max_active.max(1),
        max_queue: config.max_queue,
    };
    let (driver, _) = match supervisor {
        Some(sup) => Actor::spawn_linked(None, EngineDriver, args, sup).await,
        None => Actor::spawn(None, EngineDriver, args).await,
    }
    .map_err(start_err)?;
    // The helpers live and die with the driver.
    for cell in [device.get_cell(), router.get_cell(), cpu.get_cell(), transfer.get_cell(), cache.get_cell()] {
        cell.link(driver.get_cell());
    }
    Ok(EngineHandle { driver, info, tokenizer, faults, grammar: Default::default() })
}

/// The KV cache type to try for `model`: the one asked for, or f16 where a block type does
/// not fit its heads (with a warning).
fn kv_type_for(model: &Model, wanted: ft_backend::DType) -> ft_backend::DType {
    match crate::kv::PagePool::unfit(model, wanted) {
        Some(why) => {
            tracing::warn!("{why}: using f16");
            ft_backend::DType::F16
        }
        None => wanted,
    }
}
