//! Building the backend named by `--backend`: the one place that names concrete backends.

use ft_backend::{Backend, BackendError};
use ft_backend_cpu::{CpuBackend, CpuOptions};
use std::sync::Arc;

/// Which backend to run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum BackendChoice {
    /// The best available: CUDA, then the CPU.
    #[default]
    Auto,
    /// The CPU.
    Cpu,
    /// An NVIDIA GPU.
    Cuda,
    /// Any wgpu adapter.
    Wgpu,
}

impl std::str::FromStr for BackendChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "cpu" => Ok(Self::Cpu),
            "cuda" => Ok(Self::Cuda),
            "wgpu" => Ok(Self::Wgpu),
            other => Err(format!("unknown backend `{other}` (choose auto, cpu, cuda or wgpu)")),
        }
    }
}

/// Options that shape the backend.
#[derive(Clone, Debug, Default)]
pub struct DeviceOptions {
    /// Which backend.
    pub backend: BackendChoice,
    /// CPU worker threads (default: all cores).
    pub cpu_threads: Option<usize>,
    /// How the CPU backend's decode products meet block-quantized weights.
    pub quant_dot: ft_backend_cpu::QuantDot,
    /// The CPU backend runs on this pool (the engine's, shared with its CPU expert
    /// executors) instead of starting its own.
    pub cpu_pool: Option<Arc<rayon::ThreadPool>>,
}

/// Creates the backend; `Auto` falls back to the CPU with a log line when no GPU backend opens.
pub fn create_backend(opts: &DeviceOptions) -> Result<Arc<dyn Backend>, BackendError> {
    let cpu = || -> Result<Arc<dyn Backend>, BackendError> {
        Ok(Arc::new(CpuBackend::new(CpuOptions { threads: opts.cpu_threads, quant_dot: opts.quant_dot, pool: opts.cpu_pool.clone(), ..Default::default() })?))
    };
    match opts.backend {
        BackendChoice::Cpu => cpu(),
        BackendChoice::Cuda => ft_backend_cuda::open(0),
        BackendChoice::Wgpu => ft_backend_wgpu::open(),
        BackendChoice::Auto => match ft_backend_cuda::open(0) {
            Ok(b) => Ok(b),
            Err(e) => {
                tracing::info!("CUDA not used ({e}); running on the CPU");
                cpu()
            }
        },
    }
}
