//! The error type every backend returns.

use crate::{dtype::DType, ops::Op};

/// What went wrong in a backend call.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The backend does not implement this op for this dtype.
    #[error("backend {backend} does not support {op:?} with {dtype} data")]
    Unsupported { backend: String, op: Op, dtype: DType },
    /// Shapes, lengths or offsets do not fit the buffers.
    #[error("shape error: {0}")]
    Shape(String),
    /// A buffer of the wrong dtype or usage was passed.
    #[error("dtype error: expected {expected}, got {got} ({what})")]
    DType { expected: DType, got: DType, what: &'static str },
    /// Not enough device memory.
    #[error("out of device memory: {requested} bytes requested, {free} free")]
    OutOfMemory { requested: u64, free: u64 },
    /// The backend cannot run on this machine (no driver, no adapter, ...).
    #[error("backend unavailable: {0}")]
    Unavailable(String),
    /// A buffer from another backend, a read-only buffer written to, an unknown stream/event.
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// A failure reported by the device or driver.
    #[error("device error: {0}")]
    Device(String),
}

/// Result of a backend call.
pub type Result<T> = std::result::Result<T, BackendError>;
