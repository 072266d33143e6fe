//! Errors of the CUDA backend, turned into [`BackendError`] at the trait boundary.

use ft_backend::BackendError;

/// What went wrong while loading CUDA, compiling kernels or talking to the driver.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// `libcuda.so.1` could not be loaded.
    #[error(
        "no NVIDIA driver found (libcuda.so.1 is not on LD_LIBRARY_PATH or in the system library folders); \
         use --backend cpu, or --backend auto to fall back to the CPU"
    )]
    NoDriver,
    /// `libnvrtc` could not be loaded, so kernels cannot be compiled.
    #[error(
        "the NVIDIA driver is present but NVRTC is not (libnvrtc.so.12 not found; install the CUDA toolkit \
         or `pip install nvidia-cuda-nvrtc-cu12` and put its lib folder on LD_LIBRARY_PATH)"
    )]
    NoNvrtc,
    /// NVRTC rejected a kernel source; `log` is its compiler output.
    #[error("NVRTC could not compile {name} for {arch}:\n{log}")]
    Compile {
        /// Kernel file name.
        name: String,
        /// Target, e.g. `compute_90`.
        arch: String,
        /// The compiler log.
        log: String,
    },
    /// NVRTC failed outside compilation proper.
    #[error("NVRTC: {0}")]
    Nvrtc(String),
    /// A CUDA driver call failed.
    #[error("CUDA driver: {0}")]
    Driver(String),
}

impl From<cudarc::driver::DriverError> for CudaError {
    fn from(e: cudarc::driver::DriverError) -> Self {
        CudaError::Driver(format!("{e:?}"))
    }
}

impl From<CudaError> for BackendError {
    fn from(e: CudaError) -> Self {
        match e {
            CudaError::NoDriver | CudaError::NoNvrtc => BackendError::Unavailable(e.to_string()),
            other => BackendError::Device(other.to_string()),
        }
    }
}

/// A driver error as a backend error (out-of-memory keeps its own variant).
pub(crate) fn driver(e: cudarc::driver::DriverError, what: &str) -> BackendError {
    BackendError::Device(format!("{what}: {e:?}"))
}
