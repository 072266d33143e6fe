//! CUDA backend of ft-actor (the primary GPU backend).
//!
//! Everything CUDA is loaded at run time through `cudarc` (dynamic loading): no CUDA toolkit
//! is needed to build, and a machine without an NVIDIA driver gets one clear
//! [`BackendError::Unavailable`] instead of a panic, so `--backend auto` can fall back to the
//! CPU. Kernels are the `.cu` files of the top-level `kernels/`, embedded in the binary and
//! compiled by NVRTC for the card's compute capability when the device is opened, with the
//! PTX cached in memory and on disk ([`compile`]). Buffers, streams, events and the kernel
//! launches live in [`CudaBackend`]; the ops' host-side checks in [`ops`].

mod backend;
pub mod compile;
mod device;
pub mod error;
pub mod kernels;
mod memory;
mod pool;
pub mod ops;

pub use compile::{compile_ptx, nvrtc_available, Arch};
pub use device::{CudaBackend, COPY_STREAM};
pub use error::CudaError;
pub use memory::{CudaStorage, HostMemoryMode};

use ft_backend::{Backend, BackendError};
use std::path::PathBuf;
use std::sync::Arc;

/// Folders where the NVIDIA driver's `libcuda.so.1` is installed on common Linux systems.
const DRIVER_DIRS: [&str; 6] = [
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/cuda/lib64",
    "/usr/lib/wsl/lib",
];

/// Where the CUDA driver library is, if it is installed.
pub fn find_driver() -> Option<PathBuf> {
    let from_env = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
    from_env
        .split(':')
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .chain(DRIVER_DIRS.iter().map(PathBuf::from))
        .map(|d| d.join("libcuda.so.1"))
        .find(|p| p.exists())
}

/// Whether the driver library can be loaded (checked before any call that would panic
/// without it).
pub fn driver_available() -> bool {
    // SAFETY: only tries to dlopen the library under its usual names.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// Opens CUDA device `ordinal`.
pub fn open(ordinal: usize) -> Result<Arc<dyn Backend>, BackendError> {
    // The loader's answer (not find_driver's folder list) decides whether cudarc would panic.
    if !driver_available() {
        return Err(CudaError::NoDriver.into());
    }
    // cudarc panics where a driver lacks a symbol it binds lazily; that must read as "this
    // machine cannot run the CUDA backend", not abort the engine.
    // Kernels are compiled (or read from the disk cache) here, so a compiler or driver problem
    // shows at start-up rather than in the first layer.
    let made = std::panic::catch_unwind(|| {
        let b = CudaBackend::new(ordinal)?;
        b.warm_up().map_err(|e| CudaError::Driver(e.to_string()))?;
        Ok(b)
    })
    .unwrap_or_else(|p| {
        let what = p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()));
        Err(CudaError::Driver(format!("the CUDA driver library failed: {}", what.unwrap_or_default())))
    });
    let b = made.map_err(|e| match e {
        CudaError::NoDriver | CudaError::NoNvrtc => BackendError::from(e),
        e => BackendError::Unavailable(format!("NVIDIA driver found but CUDA device {ordinal} cannot be opened: {e}")),
    })?;
    Ok(Arc::new(b))
}

#[cfg(test)]
mod tests {
    #[test]
    fn open_never_panics_and_explains_itself() {
        if let Err(e) = super::open(0) {
            let msg = e.to_string();
            assert!(msg.contains("NVIDIA driver"), "{msg}");
        }
    }
}
