//! A process-wide count of the weight bytes the forward pass has read, so that speed reports
//! divide bytes counted as the matrices were used by measured time, instead of bytes derived
//! from the model's shape. Every weight-matrix product goes through [`matmul`] (or, for the
//! CPU executors' direct kernel calls, [`add`]); norms, biases and the KV cache are not counted.

use ft_backend::{Backend, BackendError, DeviceBuffer, MatmulDesc};
use std::sync::atomic::{AtomicU64, Ordering};

static WEIGHT_BYTES: AtomicU64 = AtomicU64::new(0);

/// Counts `bytes` of weights read.
pub fn add(bytes: usize) {
    WEIGHT_BYTES.fetch_add(bytes as u64, Ordering::Relaxed);
}

/// Weight bytes read by every model of this process so far.
pub fn total() -> u64 {
    WEIGHT_BYTES.load(Ordering::Relaxed)
}

/// `be.matmul`, counting the `desc.m` weight rows it reads.
pub fn matmul(be: &dyn Backend, x: &DeviceBuffer, w: &DeviceBuffer, bias: Option<&DeviceBuffer>, out: &mut DeviceBuffer, desc: &MatmulDesc) -> Result<(), BackendError> {
    add(desc.m * w.dtype().row_bytes(desc.k));
    be.matmul(x, w, bias, out, desc)
}
