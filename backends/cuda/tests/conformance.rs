//! The shared conformance suite on CUDA device 0. Without an NVIDIA driver (CI, laptops
//! without a GPU) every test prints `skipped: <test>: ... NVIDIA driver ...` and passes.

use ft_backend::Backend;
use std::sync::{Arc, OnceLock};

/// One backend for the whole test binary: contexts and compiled modules are shared, as in
/// the engine.
fn backend() -> Result<Arc<dyn Backend>, String> {
    static B: OnceLock<Result<Arc<dyn Backend>, String>> = OnceLock::new();
    B.get_or_init(|| ft_backend_cuda::open(0).map_err(|e| e.to_string())).clone()
}

ft_backend::conformance_suite!(backend());

#[test]
fn cuda_specifics() {
    let Ok(b) = backend() else {
        println!("skipped: cuda_specifics: no CUDA device");
        return;
    };
    let cuda = b.as_any().downcast_ref::<ft_backend_cuda::CudaBackend>().expect("a CudaBackend");
    cuda.warm_up().expect("every kernel module compiles and loads");
    let name = b.device_name();
    assert!(name.contains("host transfers"), "{name}");
    assert!(cuda.arch().major >= 5, "{:?}", cuda.arch());
}
