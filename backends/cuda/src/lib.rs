//! CUDA backend of ft-actor (the primary GPU backend).
//!
//! The kernels and the `Backend` implementation arrive with the CUDA backend work; what is
//! here already is the driver probe, so `--backend cuda` fails with one clear message on a
//! machine without an NVIDIA driver and `--backend auto` can fall back to the CPU. It loads
//! nothing at build time: no CUDA toolkit is needed to compile the project.

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

/// Opens CUDA device `ordinal`.
pub fn open(ordinal: usize) -> Result<Arc<dyn Backend>, BackendError> {
    match find_driver() {
        None => Err(BackendError::Unavailable(
            "no NVIDIA driver found (libcuda.so.1 is not on LD_LIBRARY_PATH or in the system library folders); \
             use --backend cpu, or --backend auto to fall back to the CPU"
                .into(),
        )),
        Some(path) => Err(BackendError::Unavailable(format!(
            "found the NVIDIA driver at {} but this build has no CUDA kernels yet (device {ordinal}); use --backend cpu",
            path.display()
        ))),
    }
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
