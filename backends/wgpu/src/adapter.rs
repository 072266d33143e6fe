//! Instance, adapter and device: choosing hardware and describing it.

use crate::block_on;
use crate::pipelines::PipelineCache;
use ft_backend::{BackendError, MemoryInfo, Result};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// How to open a [`WgpuBackend`].
#[derive(Clone, Debug, Default)]
pub struct WgpuOptions {
    /// Adapters to consider; `None` reads `WGPU_BACKEND` (vulkan, metal, dx12, gl), else all.
    pub backends: Option<wgpu::Backends>,
    /// Bytes to report as device memory; `None` reads `FT_WGPU_MEMORY_MIB`, else estimates.
    pub memory_bytes: Option<u64>,
    /// Bind at most this many bytes of a buffer at once (below the adapter's limit), so the
    /// windowed binding path used for huge tensors can be tested on any adapter.
    pub max_binding_bytes: Option<u64>,
}

/// A device opened through wgpu.
pub struct WgpuBackend {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    pub(crate) info: wgpu::AdapterInfo,
    pub(crate) limits: wgpu::Limits,
    pub(crate) pipelines: PipelineCache,
    /// Bytes of live buffers made by this backend.
    pub(crate) allocated: Arc<AtomicU64>,
    pub(crate) memory_total: u64,
    /// Largest storage binding used: the adapter's limit, or less if asked.
    pub(crate) max_binding: u64,
    pub(crate) next_stream: AtomicU32,
    /// Completion flags of recorded events, indexed by event id.
    pub(crate) events: Mutex<Vec<Arc<AtomicBool>>>,
    /// Errors wgpu reported outside an error scope, drained by the next checked call.
    pub(crate) device_errors: Arc<Mutex<Vec<String>>>,
}

impl WgpuBackend {
    /// Opens the first adapter allowed by `opts` (high-performance preferred).
    pub fn new(opts: WgpuOptions) -> Result<Self> {
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
        if let Some(b) = opts.backends {
            desc.backends = b;
        }
        let backends = desc.backends;
        let instance = wgpu::Instance::new(desc);
        let adapter = block_on(instance.request_adapter(&wgpu::RequestAdapterOptions {
            power_preference: wgpu::PowerPreference::HighPerformance,
            force_fallback_adapter: false,
            compatible_surface: None,
            ..Default::default()
        }))
        .map_err(|e| {
            let gl_hint = if backends.contains(wgpu::Backends::GL) && !cfg!(feature = "gl") {
                " (GL adapters need the `gl` feature of ft-backend-wgpu)"
            } else {
                ""
            };
            BackendError::Unavailable(format!(
                "no wgpu adapter for backends {backends:?}: {e}{gl_hint}; on Linux install a \
                 Vulkan driver (e.g. `apt-get install mesa-vulkan-drivers libvulkan1`)"
            ))
        })?;
        let info = adapter.get_info();
        // The adapter's own limits, not WebGPU's defaults: weights and expert tensors need
        // the largest buffers and bindings the hardware allows.
        let limits = adapter.limits();
        let (device, queue) = block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("ft-actor"),
            required_features: wgpu::Features::empty(),
            required_limits: limits.clone(),
            memory_hints: wgpu::MemoryHints::Performance,
            ..Default::default()
        }))
        .map_err(|e| {
            BackendError::Unavailable(format!(
                "wgpu adapter {}: cannot open a device: {e}",
                info.name
            ))
        })?;
        let device_errors = Arc::new(Mutex::new(Vec::new()));
        let sink = device_errors.clone();
        // wgpu's default handler panics; errors become results of the next call instead.
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            tracing::error!("wgpu: {e}");
            if let Ok(mut v) = sink.lock() {
                v.push(e.to_string());
            }
        }));
        let memory_total = opts
            .memory_bytes
            .or_else(env_memory)
            .unwrap_or_else(|| estimate_memory(&info));
        tracing::info!(
            "wgpu adapter: {} ({:?}, {:?})",
            info.name,
            info.backend,
            info.device_type
        );
        let max_binding = opts
            .max_binding_bytes
            .map_or(limits.max_storage_buffer_binding_size, |cap| {
                cap.clamp(4, limits.max_storage_buffer_binding_size)
            });
        Ok(Self {
            pipelines: PipelineCache::default(),
            device,
            queue,
            info,
            limits,
            allocated: Arc::new(AtomicU64::new(0)),
            memory_total,
            max_binding,
            next_stream: AtomicU32::new(1),
            events: Mutex::new(Vec::new()),
            device_errors,
        })
    }

    /// The adapter's description as wgpu reports it.
    pub fn adapter_info(&self) -> &wgpu::AdapterInfo {
        &self.info
    }

    pub(crate) fn describe(&self) -> String {
        let i = &self.info;
        let driver = [i.driver.as_str(), i.driver_info.as_str()]
            .iter()
            .filter(|s| !s.is_empty())
            .copied()
            .collect::<Vec<_>>()
            .join(" ");
        let name = if i.name.is_empty() {
            "unnamed adapter"
        } else {
            i.name.as_str()
        };
        if driver.is_empty() {
            format!("{name} ({:?}, {:?})", i.backend, i.device_type)
        } else {
            format!("{name} ({:?}, {:?}, {driver})", i.backend, i.device_type)
        }
    }

    pub(crate) fn memory(&self) -> MemoryInfo {
        let used = self.allocated.load(Ordering::Relaxed);
        MemoryInfo {
            free: self.memory_total.saturating_sub(used),
            total: self.memory_total,
        }
    }

    /// Fails with the first error wgpu reported since the last check.
    pub(crate) fn check_device(&self) -> Result<()> {
        let mut errs = self
            .device_errors
            .lock()
            .map_err(|_| BackendError::Device("error list poisoned".into()))?;
        if errs.is_empty() {
            Ok(())
        } else {
            let msg = errs.join("; ");
            errs.clear();
            Err(BackendError::Device(msg))
        }
    }

    /// Blocks until all submitted work has finished.
    pub(crate) fn wait_idle(&self) -> Result<()> {
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| BackendError::Device(format!("wgpu poll: {e}")))?;
        self.check_device()
    }
}

fn env_memory() -> Option<u64> {
    let mib: u64 = std::env::var("FT_WGPU_MEMORY_MIB")
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(mib << 20)
}

/// wgpu cannot query free device memory, so the total is an estimate: half of host RAM for
/// CPU and integrated adapters (they share it), 4 GiB for discrete ones (the smallest card
/// worth running on); `FT_WGPU_MEMORY_MIB` overrides it.
fn estimate_memory(info: &wgpu::AdapterInfo) -> u64 {
    const FALLBACK: u64 = 4 << 30;
    match info.device_type {
        wgpu::DeviceType::Cpu | wgpu::DeviceType::IntegratedGpu => {
            host_ram().map_or(FALLBACK, |r| r / 2)
        }
        _ => FALLBACK,
    }
}

fn host_ram() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
