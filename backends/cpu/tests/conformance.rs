//! The shared conformance suite, run twice: at the best SIMD level this CPU has, and forced
//! to scalar code, so both kernel families are checked against the reference.

use ft_backend::Backend;
use ft_backend_cpu::{CpuBackend, CpuOptions, SimdLevel};
use std::sync::Arc;

fn make(simd: SimdLevel, threads: Option<usize>) -> Option<Arc<dyn Backend>> {
    let b = CpuBackend::new(CpuOptions {
        threads,
        simd,
        memory_limit: None,
        ..Default::default()
    })
    .expect("the CPU backend always starts");
    Some(Arc::new(b))
}

mod auto {
    ft_backend::conformance_suite!(super::make(ft_backend_cpu::SimdLevel::Auto, None));
}

mod scalar {
    // Three workers on any machine, so uneven parallel splits are exercised too.
    ft_backend::conformance_suite!(super::make(ft_backend_cpu::SimdLevel::Scalar, Some(3)));
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    // AVX2 is skipped (not failed) on CPUs without it; on AVX-512 machines this is the only
    // run of the AVX2 kernels.
    ft_backend::conformance_suite!(if is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
    {
        super::make(ft_backend_cpu::SimdLevel::Avx2, Some(2))
    } else {
        None
    });
}

#[test]
fn auto_level_uses_simd_when_the_cpu_has_avx2() {
    let b = CpuBackend::new(CpuOptions::default()).expect("backend");
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
    {
        assert_ne!(
            b.simd_level(),
            SimdLevel::Scalar,
            "AVX2 machine fell back to scalar kernels"
        );
    }
    if SimdLevel::detected() == SimdLevel::Avx512 {
        assert_eq!(b.simd_level(), SimdLevel::Avx512);
        let forced = CpuBackend::new(CpuOptions {
            simd: SimdLevel::Avx2,
            ..Default::default()
        })
        .expect("backend");
        assert_eq!(forced.simd_level(), SimdLevel::Avx2);
    }
    let scalar = CpuBackend::new(CpuOptions {
        simd: SimdLevel::Scalar,
        ..Default::default()
    })
    .expect("backend");
    assert_eq!(scalar.simd_level(), SimdLevel::Scalar);
}
