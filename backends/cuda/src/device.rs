//! The device: context, streams, events, the kernel module cache and kernel launches.

use crate::compile::{cached_ptx, compile_cubin, default_cache_dir, Arch, PtxSource};
use crate::error::{driver, CudaError};
use crate::kernels;
use crate::memory::{Arena, HostMemoryMode, Staging};
use cudarc::driver::{result, sys, CudaContext, CudaEvent, CudaFunction, CudaModule, CudaStream};
use cudarc::nvrtc::Ptx;
use ft_backend::{BackendError, EventId, Result, StreamId};
use std::collections::HashMap;
use std::ffi::c_void;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

/// The copy stream every CUDA backend creates beside [`StreamId::COMPUTE`].
pub const COPY_STREAM: StreamId = StreamId(1);

/// Events kept before completed ones are dropped; a dropped id still reads as done.
const EVENTS_KEPT: usize = 1024;

/// Issued events. Ids are never reused: an id below `next` that is no longer in `live`
/// completed before it was dropped.
#[derive(Default)]
pub(crate) struct Events {
    live: HashMap<u64, CudaEvent>,
    next: u64,
}

/// A kernel argument, passed by value as the kernel declares it.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Arg {
    /// A device pointer (`T*`), or 0 for a null pointer.
    Ptr(u64),
    /// `u32`.
    U32(u32),
    /// `u64`.
    U64(u64),
    /// `float`.
    F32(f32),
}

/// An NVIDIA GPU behind the [`ft_backend::Backend`] trait.
pub struct CudaBackend {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) name: String,
    pub(crate) arch: Arch,
    /// What kernels are compiled for (the card's arch, or the newest older one NVRTC knows).
    pub(crate) target: Arch,
    pub(crate) streams: RwLock<Vec<Arc<CudaStream>>>,
    pub(crate) events: Mutex<Events>,
    modules: Mutex<HashMap<&'static str, Arc<CudaModule>>>,
    functions: Mutex<HashMap<&'static str, CudaFunction>>,
    cache_dir: Option<PathBuf>,
    pub(crate) arena: Mutex<Arena>,
    pub(crate) staging: Mutex<Staging>,
    pub(crate) host_mode: HostMemoryMode,
    pub(crate) sm_count: u32,
    /// Freed scratch allocations kept for reuse.
    pub(crate) pool: Arc<crate::pool::ScratchPool>,
    /// The untested block-quantized matmul kernels are enabled (`FT_CUDA_QUANT=1`; see
    /// [`crate::ops::quant`]).
    pub(crate) quant_matmul: bool,
}

impl CudaBackend {
    /// Opens device `ordinal`: context, compute and copy streams. Kernels compile on first use.
    pub fn new(ordinal: usize) -> std::result::Result<Self, CudaError> {
        if !crate::driver_available() {
            return Err(CudaError::NoDriver);
        }
        if !crate::compile::nvrtc_available() {
            return Err(CudaError::NoNvrtc);
        }
        let count = CudaContext::device_count()?;
        if ordinal >= count.max(0) as usize {
            return Err(CudaError::Driver(format!("no CUDA device {ordinal} ({count} present)")));
        }
        // The host waits for the device by sleeping, not spinning: the CPU executors and the
        // other actors share the cores with this thread. Set on the primary context before it
        // is retained (cuCtxSetFlags would need a 12.1 driver, and cudarc panics on a missing
        // symbol).
        let dev = result::device::get(ordinal as i32)?;
        // SAFETY: a valid device handle; flags are a documented scheduling mode.
        let r = unsafe { sys::cuDevicePrimaryCtxSetFlags_v2(dev, sys::CUctx_flags::CU_CTX_SCHED_BLOCKING_SYNC as u32) };
        if r != sys::CUresult::CUDA_SUCCESS {
            tracing::debug!("blocking synchronisation not set: {r:?}");
        }
        let ctx = CudaContext::new(ordinal)?;
        let (major, minor) = ctx.compute_capability()?;
        let name = ctx.name()?;
        let sm_count = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .unwrap_or(16)
            .max(1) as u32;
        let streams = vec![ctx.new_stream()?, ctx.new_stream()?];
        let host_mode = HostMemoryMode::from_env();
        let arch = Arch::new(major.max(0) as u32, minor.max(0) as u32);
        let target = crate::compile::target_arch(arch)?;
        let total = ctx.total_mem().unwrap_or(0);
        // Up to 1/16 of the card (at least 256 MiB) of freed scratch is kept for reuse.
        let pool = Arc::new(crate::pool::ScratchPool::new((total / 16).max(256 << 20)));
        Ok(Self {
            name,
            arch,
            target,
            streams: RwLock::new(streams),
            events: Mutex::new(Events::default()),
            modules: Mutex::new(HashMap::new()),
            functions: Mutex::new(HashMap::new()),
            cache_dir: default_cache_dir(),
            arena: Mutex::new(Arena::default()),
            staging: Mutex::new(Staging::new(ctx.clone())),
            host_mode,
            sm_count,
            pool,
            quant_matmul: crate::ops::quant::quant_from_env(),
            ctx,
        })
    }

    /// The card's compute capability.
    pub fn arch(&self) -> Arch {
        self.arch
    }

    /// How `import_host` moves host bytes to the device.
    pub fn host_memory_mode(&self) -> HostMemoryMode {
        self.host_mode
    }

    /// Compiles (or loads from the disk cache) every kernel file now instead of on first use.
    pub fn warm_up(&self) -> Result<()> {
        for (file, _) in crate::ops::KERNELS {
            if *file == "matmul_quant" && !self.quant_matmul {
                continue;
            }
            self.module(file)?;
        }
        Ok(())
    }

    /// Makes this backend's context current on the calling thread (actors call from many).
    pub(crate) fn bind(&self) -> Result<()> {
        self.ctx.bind_to_thread().map_err(|e| driver(e, "binding the CUDA context"))
    }

    pub(crate) fn stream(&self, id: StreamId) -> Result<Arc<CudaStream>> {
        let streams = self.streams.read().map_err(|_| poisoned())?;
        streams
            .get(id.0 as usize)
            .cloned()
            .ok_or_else(|| BackendError::Invalid(format!("unknown stream {}", id.0)))
    }

    /// The event `id`, or `None` when it completed and was dropped.
    pub(crate) fn with_event<T>(&self, id: EventId, f: impl FnOnce(Option<&CudaEvent>) -> Result<T>) -> Result<T> {
        let events = self.events.lock().map_err(|_| poisoned())?;
        if id.0 >= events.next {
            return Err(BackendError::Invalid(format!("unknown event {}", id.0)));
        }
        f(events.live.get(&id.0))
    }

    pub(crate) fn add_event(&self, event: CudaEvent) -> Result<EventId> {
        let mut events = self.events.lock().map_err(|_| poisoned())?;
        if events.live.len() >= EVENTS_KEPT {
            // Only completed events go: their ids keep answering "done".
            events.live.retain(|_, e| !matches!(e.try_is_complete(), Ok(true)));
        }
        let id = events.next;
        events.next += 1;
        events.live.insert(id, event);
        Ok(EventId(id))
    }

    fn module(&self, file: &'static str) -> Result<Arc<CudaModule>> {
        let mut modules = self.modules.lock().map_err(|_| poisoned())?;
        if let Some(m) = modules.get(file) {
            return Ok(m.clone());
        }
        let kf = kernels::file(file).ok_or_else(|| BackendError::Invalid(format!("no kernel file {file}")))?;
        let t = std::time::Instant::now();
        let (ptx, how) = cached_ptx(self.cache_dir.as_deref(), kf.name, &kf.full_source(), self.target)?;
        if how == PtxSource::Compiled {
            tracing::info!("compiled {file}.cu for {} in {:.2?}", self.target.virtual_name(), t.elapsed());
        }
        self.bind()?;
        let m = match self.ctx.load_module(Ptx::from_src(ptx)) {
            Ok(m) => m,
            Err(e) => {
                // A damaged cache file, or a driver older than NVRTC (which refuses newer PTX),
                // must not disable the backend: compile machine code for this card instead.
                tracing::warn!("PTX of {file}.cu ({how:?}) did not load ({e:?}); compiling a cubin for sm_{}{}", self.arch.major, self.arch.minor);
                let arch = if crate::compile::supported_archs()?.contains(&(self.arch.major * 10 + self.arch.minor)) {
                    self.arch
                } else {
                    self.target
                };
                let cubin = compile_cubin(kf.name, &kf.full_source(), arch)?;
                self.ctx
                    .load_module(Ptx::from_binary(cubin))
                    .map_err(|e2| driver(e2, &format!("loading {file}.cu (PTX: {e:?}; cubin)")))?
            }
        };
        modules.insert(file, m.clone());
        Ok(m)
    }

    fn function(&self, kernel: &'static str) -> Result<CudaFunction> {
        if let Some(f) = self.functions.lock().map_err(|_| poisoned())?.get(kernel) {
            return Ok(f.clone());
        }
        let (file, _) = crate::ops::kernel_info(kernel).ok_or_else(|| BackendError::Invalid(format!("no kernel {kernel}")))?;
        let f = self.module(file)?.load_function(kernel).map_err(|e| driver(e, kernel))?;
        self.functions.lock().map_err(|_| poisoned())?.insert(kernel, f.clone());
        Ok(f)
    }

    /// Launches `kernel` on the compute stream; `block` threads per block.
    pub(crate) fn launch(&self, kernel: &'static str, grid: (u32, u32, u32), block: u32, smem: u32, args: &[Arg]) -> Result<()> {
        if grid.0 == 0 || grid.1 == 0 || grid.2 == 0 {
            return Ok(());
        }
        if grid.1 > 65_535 || grid.2 > 65_535 {
            return Err(BackendError::Shape(format!("{kernel}: grid {grid:?} exceeds the device limits")));
        }
        if smem > 48 * 1024 {
            return Err(BackendError::Shape(format!("{kernel}: needs {smem} bytes of shared memory (limit 48 KiB)")));
        }
        let (_, sig) = crate::ops::kernel_info(kernel).ok_or_else(|| BackendError::Invalid(format!("no kernel {kernel}")))?;
        let given: String = args
            .iter()
            .map(|a| match a {
                Arg::Ptr(_) => 'p',
                Arg::U64(_) => 'l',
                Arg::U32(_) => 'u',
                Arg::F32(_) => 'f',
            })
            .collect();
        if given != sig {
            return Err(BackendError::Invalid(format!("{kernel} takes ({sig}) but was given ({given})")));
        }
        let f = self.function(kernel)?;
        let stream = self.stream(StreamId::COMPUTE)?;
        // Each argument lives in its own 8-byte slot; the kernel reads as many bytes as its
        // parameter's type has (little endian), so u32 and f32 sit in the low half.
        let mut slots: Vec<u64> = args
            .iter()
            .map(|a| match *a {
                Arg::Ptr(p) | Arg::U64(p) => p,
                Arg::U32(v) => v as u64,
                Arg::F32(v) => v.to_bits() as u64,
            })
            .collect();
        let mut params: Vec<*mut c_void> = slots.iter_mut().map(|s| s as *mut u64 as *mut c_void).collect();
        self.bind()?;
        // SAFETY: the function comes from a loaded module; `params` points at one value per
        // kernel parameter (the tables in ops match the kernels' signatures, which the
        // nvrtc_compile test checks by name); device pointers were range-checked by the caller
        // and stay alive until the stream passes them (buffers free synchronously).
        unsafe { result::launch_kernel(f.cu_function(), grid, (block, 1, 1), smem, stream.cu_stream(), &mut params) }
            .map_err(|e| driver(e, kernel))
    }

    /// Locks the per-call parameter arena (small host tables copied to the device).
    pub(crate) fn arena(&self) -> Result<MutexGuard<'_, Arena>> {
        self.arena.lock().map_err(|_| poisoned())
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        crate::memory::free_all(&self.ctx, self.pool.drain());
    }
}

pub(crate) fn poisoned() -> BackendError {
    BackendError::Device("a CUDA backend lock was poisoned by a panic".into())
}
