//! CPU backend of ft-actor: the device when there is no GPU, and the home of the SIMD
//! kernels that the engine's CPU executors call directly ([`kernels`]).
//!
//! Device memory is host memory: [`CpuBackend`] allocates 64-byte-aligned buffers and uses
//! imported host bytes (memory-mapped checkpoints) in place, without copying: weights,
//! embedding tables and KV caches are read with unaligned loads wherever they sit. The one
//! exception is an f32 *activation-like* input (matmul `x`, norm input, attention `q`, sinks)
//! imported at an address not divisible by 4, which is copied for the duration of the call;
//! imports are read-only (writes give `BackendError::Invalid`). Work is
//! synchronous on the calling thread plus the backend's own rayon pool (never the global
//! one, so the engine decides how many cores the backend may use). The vector instruction
//! set is chosen at run time ([`SimdLevel`]) and can be forced down to scalar code for
//! testing.

#![warn(missing_docs)]

mod backend;
pub mod kernels;
mod storage;

pub use kernels::{QuantDot, SimdLevel};

use ft_backend::{BackendError, DeviceBuffer, MemoryInfo, Result};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

/// How to build a [`CpuBackend`].
#[derive(Clone, Debug, Default)]
pub struct CpuOptions {
    /// Worker threads of the backend's pool; `None` means one per available core.
    pub threads: Option<usize>,
    /// Vector instruction set; a level the CPU lacks falls back to the best it has.
    pub simd: SimdLevel,
    /// Bytes the backend may allocate (reported as total memory); `None` means physical RAM.
    pub memory_limit: Option<u64>,
    /// How decode-sized matmuls meet block-quantized weights (default: exact).
    pub quant_dot: QuantDot,
    /// Run on this pool instead of starting one (`threads` is then the pool's size). The
    /// engine shares one pool between the backend and its CPU expert executors: a pool of
    /// all cores each would put twice as many busy threads as there are cores.
    pub pool: Option<Arc<rayon::ThreadPool>>,
}

/// A worker pool of `threads` (default: one per available core) named as the backend's.
pub fn start_pool(threads: Option<usize>) -> Result<rayon::ThreadPool> {
    let threads = threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("ft-cpu-{i}"))
        .build()
        .map_err(|e| BackendError::Unavailable(format!("cannot start {threads} CPU worker threads: {e}")))
}

/// The CPU implementation of [`ft_backend::Backend`].
pub struct CpuBackend {
    pool: Arc<rayon::ThreadPool>,
    threads: usize,
    simd: SimdLevel,
    quant_dot: QuantDot,
    /// Physical RAM, or the configured limit.
    total: u64,
    limited: bool,
    /// Bytes of live owned buffers (imports are the caller's memory and are not counted).
    allocated: Arc<AtomicU64>,
    next_stream: AtomicU32,
    next_event: AtomicU64,
}

impl CpuBackend {
    /// Builds the backend: detects the SIMD level and starts the thread pool.
    pub fn new(opts: CpuOptions) -> Result<Self> {
        let pool = match opts.pool {
            Some(pool) => pool,
            None => Arc::new(start_pool(opts.threads)?),
        };
        let threads = pool.current_num_threads();
        let simd = opts.simd.effective();
        let (total, limited) = match opts.memory_limit {
            Some(limit) => (limit, true),
            None => (
                meminfo_kib("MemTotal:").map_or(u64::MAX / 2, |k| k * 1024),
                false,
            ),
        };
        tracing::debug!(simd = %simd, requested = %opts.simd, threads, total, "cpu backend ready");
        Ok(Self {
            pool,
            threads,
            simd,
            quant_dot: opts.quant_dot,
            total,
            limited,
            allocated: Arc::new(AtomicU64::new(0)),
            next_stream: AtomicU32::new(1),
            next_event: AtomicU64::new(0),
        })
    }

    /// The backend with default options: all cores, best SIMD level, physical RAM.
    pub fn with_defaults() -> Result<Self> {
        Self::new(CpuOptions::default())
    }

    /// The SIMD level kernels actually run at (never `Auto`).
    pub fn simd_level(&self) -> SimdLevel {
        self.simd
    }

    /// Worker threads in the pool.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The backend's thread pool, for callers that run [`kernels`] beside it.
    pub fn pool(&self) -> &rayon::ThreadPool {
        &self.pool
    }

    /// Bytes currently held by buffers this backend allocated.
    pub fn allocated_bytes(&self) -> u64 {
        self.allocated.load(Ordering::Relaxed)
    }

    /// The raw bytes of a CPU buffer (owned or imported), for executors that run
    /// [`kernels`] on backend buffers; `Invalid` for buffers of other backends.
    pub fn buffer_bytes(buf: &DeviceBuffer) -> Result<&[u8]> {
        storage::bytes(buf, "buffer")
    }

    fn memory(&self) -> MemoryInfo {
        let used = self.allocated.load(Ordering::Relaxed);
        let mut free = self.total.saturating_sub(used);
        if !self.limited {
            // Other processes use RAM too; MemAvailable already counts our touched pages.
            if let Some(avail) = meminfo_kib("MemAvailable:") {
                free = free.min(avail * 1024);
            }
        }
        MemoryInfo {
            free,
            total: self.total,
        }
    }
}

/// A `/proc/meminfo` field in KiB (Linux only; `None` elsewhere or if unreadable).
pub fn meminfo_kib(field: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with(field))?;
    line[field.len()..].split_whitespace().next()?.parse().ok()
}

/// The CPU model from `/proc/cpuinfo`, if there is one.
fn cpu_model() -> Option<String> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("model name"))?;
    Some(line.split_once(':')?.1.trim().to_string())
}
