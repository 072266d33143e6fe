//! The shared conformance suite on the first wgpu adapter (e.g. lavapipe). Without an
//! adapter each test prints a skip line, unless `FT_REQUIRE_WGPU=1` (CI), where a missing
//! adapter fails the test.

use ft_backend::Backend;
use std::sync::{Arc, OnceLock};

/// One device for all tests: opening an adapter and compiling shaders once keeps the suite
/// fast on software Vulkan.
fn make() -> Result<Arc<dyn Backend>, String> {
    static BACKEND: OnceLock<Result<Arc<dyn Backend>, String>> = OnceLock::new();
    let b = BACKEND
        .get_or_init(|| ft_backend_wgpu::open().map_err(|e| e.to_string()))
        .clone();
    if let Err(e) = &b {
        if std::env::var("FT_REQUIRE_WGPU").is_ok_and(|v| v == "1") {
            panic!("FT_REQUIRE_WGPU=1 but the wgpu backend did not open: {e}");
        }
    }
    b
}

ft_backend::conformance_suite!(make());
