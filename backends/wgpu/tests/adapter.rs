//! Adapter selection: asking for an adapter kind this machine lacks is an error, not a panic.

use ft_backend::BackendError;
use ft_backend_wgpu::{WgpuBackend, WgpuOptions};

#[test]
fn missing_adapter_kind_is_unavailable() {
    // Metal exists only on Apple platforms (and DX12 only on Windows).
    if cfg!(any(
        target_os = "macos",
        target_os = "ios",
        target_os = "windows"
    )) {
        return;
    }
    let opts = WgpuOptions {
        backends: Some(wgpu_backends_metal()),
        memory_bytes: None,
        max_binding_bytes: None,
    };
    match WgpuBackend::new(opts) {
        Err(BackendError::Unavailable(msg)) => assert!(msg.contains("no wgpu adapter"), "{msg}"),
        Err(e) => panic!("expected Unavailable, got {e}"),
        Ok(_) => panic!("a Metal adapter on a non-Apple machine"),
    }
}

fn wgpu_backends_metal() -> ft_backend_wgpu::Backends {
    ft_backend_wgpu::Backends::METAL
}
