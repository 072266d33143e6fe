//! wgpu backend of ft-actor: any Vulkan, Metal, DX12 (or, with the `gl` feature, GL)
//! adapter, including software Vulkan (Mesa lavapipe), so it also runs on machines without
//! a GPU.
//!
//! Kernels are WGSL compute shaders in the repository's top-level `shaders/*.wgsl`, embedded
//! with `include_str!` and compiled on first use. Narrow weights (bf16/f16) stay packed two to
//! a `u32` word and are decoded with bit operations, so no optional adapter feature is required. Every op of the
//! trait is implemented, the recurrent (Gated DeltaNet) ones included, and matmul takes every
//! block-quantized weight type (decoded in the shader from raw bytes; see `src/quant.rs`).
//!
//! wgpu exposes one queue per device. Streams are therefore ids over that queue: all work
//! runs in submission order, which is at least as strong as any cross-stream ordering the
//! trait asks for, so `wait_event` only validates its arguments. Events are
//! `Queue::on_submitted_work_done` callbacks registered when recorded.

mod adapter;
mod backend;
mod elementwise;
mod memory;
mod ops;
mod pipelines;
mod quant;
mod recurrent;

use ft_backend::{Backend, BackendError};
use std::sync::Arc;

pub use adapter::{WgpuBackend, WgpuOptions};
/// wgpu's adapter kinds, for [`WgpuOptions::backends`].
pub use wgpu::Backends;

/// Opens the first suitable adapter (`WGPU_BACKEND` = vulkan, metal, dx12 or gl narrows the
/// choice); `BackendError::Unavailable` when there is none.
pub fn open() -> Result<Arc<dyn Backend>, BackendError> {
    Ok(Arc::new(WgpuBackend::new(WgpuOptions::default())?))
}

/// Runs a future to completion on this thread; wgpu's native futures resolve during
/// `Device::poll` or immediately, so no executor is needed.
pub(crate) fn block_on<F: std::future::Future>(fut: F) -> F::Output {
    use std::task::{Context, Poll, Wake, Waker};
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    loop {
        match fut.as_mut().poll(&mut cx) {
            Poll::Ready(v) => return v,
            Poll::Pending => std::thread::park(),
        }
    }
}
