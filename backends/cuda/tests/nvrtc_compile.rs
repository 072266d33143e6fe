//! Compiles every kernel file to PTX with NVRTC for sm_80 and sm_90: the CI check that the
//! CUDA C is valid, on machines with no GPU (only `libnvrtc` is loaded, not the driver).
//!
//! Without `libnvrtc` the tests print a `skipped:` line and pass, unless `FT_REQUIRE_NVRTC=1`,
//! which CI sets after `.ci/install-nvrtc.sh` so that a missing compiler cannot hide a broken
//! kernel.

use ft_backend_cuda::compile::{cached_ptx, compile_ptx, nvrtc_available, nvrtc_version, Arch, PtxSource};
use ft_backend_cuda::{kernels, CudaError};

/// Whether NVRTC is loadable; panics when it is not but `FT_REQUIRE_NVRTC=1`.
fn nvrtc_or_skip(test: &str) -> bool {
    if nvrtc_available() {
        return true;
    }
    if std::env::var("FT_REQUIRE_NVRTC").is_ok_and(|v| v == "1") {
        panic!("{test}: FT_REQUIRE_NVRTC=1 but libnvrtc cannot be loaded (run .ci/install-nvrtc.sh and source .venv/nvrtc.env)");
    }
    println!("skipped: {test}: libnvrtc not found; install nvidia-cuda-nvrtc-cu12 (see .ci/install-nvrtc.sh)");
    false
}

#[test]
fn every_kernel_file_compiles_for_sm80_and_sm90() {
    if !nvrtc_or_skip("every_kernel_file_compiles_for_sm80_and_sm90") {
        return;
    }
    let (maj, min) = nvrtc_version().expect("nvrtc version");
    println!("NVRTC {maj}.{min}");
    assert!(kernels::FILES.len() >= 8, "kernel files missing");
    let mut failures = Vec::new();
    for arch in [Arch::new(8, 0), Arch::new(9, 0)] {
        for file in kernels::FILES {
            let t = std::time::Instant::now();
            match compile_ptx(file.name, &file.full_source(), arch) {
                Ok(ptx) => {
                    assert!(ptx.contains(&format!(".target sm_{}{}", arch.major, arch.minor)), "{}: PTX target", file.name);
                    let entries = ptx.matches(".entry").count();
                    assert!(entries > 0, "{}: PTX has no kernels", file.name);
                    println!("{} {}: {} bytes of PTX, {entries} kernels, {:?}", arch.virtual_name(), file.name, ptx.len(), t.elapsed());
                }
                Err(e) => failures.push(e.to_string()),
            }
        }
    }
    assert!(failures.is_empty(), "kernels failed to compile:\n{}", failures.join("\n\n"));
}

/// Every kernel the backend launches by name exists in the PTX of its file, with the
/// parameter types the backend's table (which every launch is checked against) declares.
#[test]
fn launched_kernels_exist_with_their_signatures() {
    if !nvrtc_or_skip("launched_kernels_exist_with_their_signatures") {
        return;
    }
    for (file, kernels) in ft_backend_cuda::ops::KERNELS {
        let src = kernels::file(file).unwrap_or_else(|| panic!("no kernel file {file}"));
        let ptx = compile_ptx(file, &src.full_source(), Arch::new(8, 0)).expect("compiles");
        for (name, sig) in *kernels {
            let params = ptx_params(&ptx, name).unwrap_or_else(|| panic!("{file}.cu has no kernel {name}"));
            // Pointers and u64 values are both .u64 in PTX.
            let want: String = sig.chars().map(|c| if c == 'p' { 'l' } else { c }).collect();
            assert_eq!(params, want, "{name}: PTX parameters vs the backend's table");
        }
    }
}

/// The parameter types of kernel `name` in `ptx` as letters (`l` .u64, `u` .u32, `f` .f32).
fn ptx_params(ptx: &str, name: &str) -> Option<String> {
    let start = ptx.find(&format!(".entry {name}("))?;
    let body = &ptx[start..];
    let end = body.find(')')?;
    Some(
        body[..end]
            .lines()
            .filter_map(|l| l.trim().strip_prefix(".param ."))
            .map(|t| match t.split_whitespace().next().unwrap_or("") {
                "u64" | "b64" | "s64" => 'l',
                "u32" | "b32" | "s32" => 'u',
                "f32" => 'f',
                _ => '?',
            })
            .collect(),
    )
}

#[test]
fn a_broken_kernel_is_a_compile_error_with_the_log() {
    if !nvrtc_or_skip("a_broken_kernel_is_a_compile_error_with_the_log") {
        return;
    }
    let src = format!("{}\nextern \"C\" __global__ void broken(float* x) {{ x[0] = undefined_name; }}\n", kernels::COMMON);
    match compile_ptx("broken", &src, Arch::new(9, 0)) {
        Err(CudaError::Compile { name, arch, log }) => {
            assert_eq!((name.as_str(), arch.as_str()), ("broken", "compute_90"));
            assert!(log.contains("undefined_name"), "log does not name the error: {log}");
        }
        other => panic!("expected a compile error, got {other:?}"),
    }
    assert!(matches!(compile_ptx("nul", "a\0b", Arch::new(9, 0)), Err(CudaError::Nvrtc(_))));
}

#[test]
fn disk_cache_serves_the_second_compile() {
    if !nvrtc_or_skip("disk_cache_serves_the_second_compile") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("ft-cuda-ptx-test-{}", std::process::id()));
    let file = kernels::file("elementwise").expect("elementwise.cu");
    let src = file.full_source();
    let (first, how) = cached_ptx(Some(&dir), file.name, &src, Arch::new(8, 0)).expect("compile");
    assert_eq!(how, PtxSource::Compiled);
    let (second, how) = cached_ptx(Some(&dir), file.name, &src, Arch::new(8, 0)).expect("cached");
    assert_eq!(how, PtxSource::Disk);
    assert_eq!(first, second);
    let (_, how) = cached_ptx(Some(&dir), file.name, &src, Arch::new(9, 0)).expect("compile");
    assert_eq!(how, PtxSource::Compiled, "another arch must not reuse the PTX");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn target_arch_falls_back_to_what_nvrtc_knows() {
    if !nvrtc_or_skip("target_arch_falls_back_to_what_nvrtc_knows") {
        return;
    }
    use ft_backend_cuda::compile::{supported_archs, target_arch};
    let archs = supported_archs().expect("supported archs");
    assert!(archs.contains(&80) && archs.contains(&90), "{archs:?}");
    assert_eq!(target_arch(Arch::new(9, 0)).expect("sm_90"), Arch::new(9, 0));
    // A card newer than this NVRTC gets the newest architecture it knows.
    let newest = *archs.iter().max().expect("some");
    assert_eq!(target_arch(Arch::new(99, 9)).expect("future card"), Arch::new(newest / 10, newest % 10));
    assert!(target_arch(Arch::new(1, 0)).is_err());
}

#[test]
fn every_kernel_file_compiles_to_a_cubin() {
    if !nvrtc_or_skip("every_kernel_file_compiles_to_a_cubin") {
        return;
    }
    // The fallback for drivers older than NVRTC: machine code, an ELF image.
    for arch in [Arch::new(8, 0), Arch::new(9, 0)] {
        for file in kernels::FILES {
            let cubin = ft_backend_cuda::compile::compile_cubin(file.name, &file.full_source(), arch)
                .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(&cubin[..4], b"\x7fELF", "{} for sm_{}{}", file.name, arch.major, arch.minor);
        }
    }
    let broken = format!("{}\nextern \"C\" __global__ void broken() {{ nope; }}\n", kernels::COMMON);
    match ft_backend_cuda::compile::compile_cubin("broken", &broken, Arch::new(9, 0)) {
        Err(CudaError::Compile { log, .. }) => assert!(log.contains("nope"), "{log}"),
        other => panic!("expected a compile error, got {other:?}"),
    }
}
