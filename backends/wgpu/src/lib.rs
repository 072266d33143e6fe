//! wgpu backend of ft-actor (Vulkan/Metal/DX12; the macOS and AMD road map).
//!
//! The adapter selection, buffers and WGSL shaders arrive with the wgpu backend work; until
//! then `open` reports that clearly instead of pretending, so `--backend wgpu` fails with one
//! message and `--backend auto` skips it.

use ft_backend::{Backend, BackendError};
use std::sync::Arc;

/// Opens the first suitable adapter.
pub fn open() -> Result<Arc<dyn Backend>, BackendError> {
    Err(BackendError::Unavailable(
        "this build has no wgpu shaders yet; use --backend cpu".into(),
    ))
}

#[cfg(test)]
mod tests {
    #[test]
    fn open_reports_unavailable() {
        assert!(super::open().is_err());
    }
}
