//! Kernel compilation with NVRTC (loaded at run time) and the on-disk PTX cache.
//!
//! Nothing here needs a GPU or the driver: only `libnvrtc`. The cache key hashes the full
//! source, the target architecture, the NVRTC version and the options, so a changed kernel,
//! card or compiler never picks up stale PTX.

use crate::error::CudaError;
use cudarc::nvrtc::{self, CompileOptions};
use std::path::{Path, PathBuf};

/// A compute capability, e.g. 9.0 for an H100.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Arch {
    /// Major version.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
}

impl Arch {
    /// Compute capability `major.minor`.
    pub const fn new(major: u32, minor: u32) -> Self {
        Self { major, minor }
    }
    /// The virtual architecture NVRTC targets (`compute_90`); PTX for it JIT-compiles on this
    /// card and newer ones.
    pub fn virtual_name(&self) -> String {
        format!("compute_{}{}", self.major, self.minor)
    }
}

/// Options every kernel is compiled with. No fast math: the conformance bounds assume
/// correctly rounded division and square roots.
const OPTIONS: &[&str] = &["--std=c++17", "--fmad=true"];

/// Whether `libnvrtc` can be loaded (never panics, unlike the first NVRTC call without it).
pub fn nvrtc_available() -> bool {
    // SAFETY: only tries to dlopen the library under its usual names.
    unsafe { nvrtc::sys::is_culib_present() }
}

/// NVRTC's version, `(major, minor)`.
pub fn nvrtc_version() -> Result<(i32, i32), CudaError> {
    if !nvrtc_available() {
        return Err(CudaError::NoNvrtc);
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the library is present (checked above); both pointers are valid for writes.
    let r = unsafe { nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    if r != nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(CudaError::Nvrtc(format!("nvrtcVersion: {r:?}")));
    }
    Ok((major, minor))
}

/// The SM versions this NVRTC can target (e.g. `[50, 52, ..., 90, 100, 120]`).
pub fn supported_archs() -> Result<Vec<u32>, CudaError> {
    if !nvrtc_available() {
        return Err(CudaError::NoNvrtc);
    }
    let mut n = 0;
    // SAFETY: the library is present; `n` is valid for writes.
    let r = unsafe { nvrtc::sys::nvrtcGetNumSupportedArchs(&mut n) };
    if r != nvrtc::sys::nvrtcResult::NVRTC_SUCCESS || n <= 0 {
        return Err(CudaError::Nvrtc(format!("nvrtcGetNumSupportedArchs: {r:?}")));
    }
    let mut archs = vec![0i32; n as usize];
    // SAFETY: `archs` has room for the `n` values NVRTC reported.
    let r = unsafe { nvrtc::sys::nvrtcGetSupportedArchs(archs.as_mut_ptr()) };
    if r != nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(CudaError::Nvrtc(format!("nvrtcGetSupportedArchs: {r:?}")));
    }
    Ok(archs.into_iter().filter(|a| *a > 0).map(|a| a as u32).collect())
}

/// The architecture to compile for on a card of `card`: the card's own when this NVRTC knows
/// it, else the newest older one it knows (PTX for it JIT-compiles on the newer card).
pub fn target_arch(card: Arch) -> Result<Arch, CudaError> {
    let want = card.major * 10 + card.minor;
    let best = supported_archs()?.into_iter().filter(|a| *a <= want).max();
    match best {
        Some(a) => Ok(Arch::new(a / 10, a % 10)),
        None => Err(CudaError::Nvrtc(format!("this NVRTC cannot target sm_{want} or any older architecture"))),
    }
}

/// Folders that may hold the CUDA headers, for kernels that include them: `$FT_CUDA_INCLUDE`,
/// `$CUDA_HOME/include`, `$CUDA_PATH/include`, `/usr/local/cuda/include`, and the `include`
/// folder of the `nvidia-cuda-runtime-cu12` wheel next to a pip-installed NVRTC. Our own
/// kernels decode f16/bf16 with bit operations and include nothing, so none is required.
pub fn include_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(d) = std::env::var_os("FT_CUDA_INCLUDE") {
        dirs.push(PathBuf::from(d));
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(d) = std::env::var_os(var) {
            dirs.push(Path::new(&d).join("include"));
        }
    }
    dirs.push(PathBuf::from("/usr/local/cuda/include"));
    // A wheel's lib folder on LD_LIBRARY_PATH: .../nvidia/cuda_nvrtc/lib → .../nvidia/cuda_runtime/include.
    let ld = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
    for d in ld.split(':').filter(|d| d.ends_with("cuda_nvrtc/lib")) {
        if let Some(nvidia) = Path::new(d).parent().and_then(Path::parent) {
            dirs.push(nvidia.join("cuda_runtime").join("include"));
        }
    }
    let mut seen = std::collections::HashSet::new();
    dirs.into_iter().filter(|d| d.is_dir() && seen.insert(d.clone())).collect()
}

/// Compiles `source` (a whole translation unit) to PTX for `arch`; `name` labels errors.
pub fn compile_ptx(name: &str, source: &str, arch: Arch) -> Result<String, CudaError> {
    if !nvrtc_available() {
        return Err(CudaError::NoNvrtc);
    }
    if source.contains('\0') {
        return Err(CudaError::Nvrtc(format!("{name}: source contains a NUL byte")));
    }
    let opts = CompileOptions {
        include_paths: include_dirs().iter().map(|d| d.display().to_string()).collect(),
        options: OPTIONS
            .iter()
            .map(|s| s.to_string())
            .chain([format!("--gpu-architecture={}", arch.virtual_name())])
            .collect(),
        name: Some(format!("{name}.cu")),
        ..Default::default()
    };
    // cudarc unwraps a few NVRTC results internally; a panic there must not take the engine
    // down, so it becomes an error like any other.
    let result = std::panic::catch_unwind(|| nvrtc::compile_ptx_with_opts(source, opts))
        .map_err(|_| CudaError::Nvrtc(format!("{name}: NVRTC call panicked")))?;
    match result {
        Ok(ptx) => Ok(ptx.to_src().trim_end_matches('\0').to_string()),
        Err(nvrtc::CompileError::CompileError { log, .. }) => Err(CudaError::Compile {
            name: name.to_string(),
            arch: arch.virtual_name(),
            log: log.to_string_lossy().into_owned(),
        }),
        Err(e) => Err(CudaError::Nvrtc(format!("{name}: {e:?}"))),
    }
}

/// Compiles `source` to a cubin (machine code) for exactly `arch`. Used when the driver is
/// older than NVRTC and refuses its PTX: a cubin needs no JIT, and CUDA's minor-version
/// compatibility lets a 12.x driver run cubins from any 12.x compiler.
pub fn compile_cubin(name: &str, source: &str, arch: Arch) -> Result<Vec<u8>, CudaError> {
    use std::ffi::CString;
    if !nvrtc_available() {
        return Err(CudaError::NoNvrtc);
    }
    let nul = |_| CudaError::Nvrtc(format!("{name}: source contains a NUL byte"));
    let src = CString::new(source).map_err(nul)?;
    let file = CString::new(format!("{name}.cu")).map_err(nul)?;
    let sm = format!("sm_{}{}", arch.major, arch.minor);
    let mut opts: Vec<String> = OPTIONS.iter().map(|s| s.to_string()).collect();
    opts.push(format!("--gpu-architecture={sm}"));
    let prog = nvrtc::result::create_program(&src, Some(&file)).map_err(|e| CudaError::Nvrtc(format!("{name}: {e:?}")))?;
    // SAFETY: `prog` is a live program until destroyed at the end; every buffer passed is
    // sized as NVRTC reported.
    let out = unsafe {
        match nvrtc::result::compile_program(prog, &opts) {
            Err(e) => {
                let log = nvrtc::result::get_program_log(prog)
                    .map(|l| l.iter().take_while(|c| **c != 0).map(|c| *c as u8 as char).collect::<String>())
                    .unwrap_or_else(|_| format!("{e:?}"));
                Err(CudaError::Compile { name: name.to_string(), arch: sm, log })
            }
            Ok(()) => {
                let mut size = 0usize;
                let r = nvrtc::sys::nvrtcGetCUBINSize(prog, &mut size);
                if r != nvrtc::sys::nvrtcResult::NVRTC_SUCCESS || size == 0 {
                    Err(CudaError::Nvrtc(format!("{name}: nvrtcGetCUBINSize: {r:?}")))
                } else {
                    let mut buf = vec![0u8; size];
                    let r = nvrtc::sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr() as *mut std::ffi::c_char);
                    if r == nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
                        Ok(buf)
                    } else {
                        Err(CudaError::Nvrtc(format!("{name}: nvrtcGetCUBIN: {r:?}")))
                    }
                }
            }
        }
    };
    // SAFETY: created above, destroyed once.
    let _ = unsafe { nvrtc::result::destroy_program(prog) };
    out
}

/// Where compiled PTX is kept between runs: `$FT_CUDA_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/ft-actor/ptx`, else `~/.cache/ft-actor/ptx`.
pub fn default_cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("FT_CUDA_CACHE_DIR") {
        return Some(PathBuf::from(d));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")))?;
    Some(base.join("ft-actor").join("ptx"))
}

/// FNV-1a, 64 bits: stable across runs and Rust versions, unlike `DefaultHasher`.
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in p.iter().chain(&[0xff]) {
            h ^= *b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// Where a kernel's PTX comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PtxSource {
    /// Read from the disk cache.
    Disk,
    /// Compiled by NVRTC in this call.
    Compiled,
}

/// PTX of `source` for `arch`, from `cache_dir` when it holds it, else compiled (and then
/// stored there; a cache that cannot be written only costs the next start a recompile).
pub fn cached_ptx(
    cache_dir: Option<&Path>,
    name: &str,
    source: &str,
    arch: Arch,
) -> Result<(String, PtxSource), CudaError> {
    let (maj, min) = nvrtc_version()?;
    let key = fnv1a(&[
        source.as_bytes(),
        arch.virtual_name().as_bytes(),
        format!("nvrtc {maj}.{min}").as_bytes(),
        OPTIONS.join(" ").as_bytes(),
    ]);
    let path = cache_dir.map(|d| d.join(format!("{name}-{}-{key:016x}.ptx", arch.virtual_name())));
    if let Some(text) = path.as_deref().and_then(|p| std::fs::read_to_string(p).ok()) {
        if text.contains(".entry") && !text.contains('\0') {
            return Ok((text, PtxSource::Disk));
        }
    }
    let ptx = compile_ptx(name, source, arch)?;
    if let (Some(p), Some(dir)) = (path.as_deref(), cache_dir) {
        let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
        let written = std::fs::create_dir_all(dir)
            .and_then(|()| std::fs::write(&tmp, &ptx))
            .and_then(|()| std::fs::rename(&tmp, p));
        if let Err(e) = written {
            tracing::debug!("could not cache PTX at {}: {e}", p.display());
            let _ = std::fs::remove_file(&tmp);
        }
    }
    Ok((ptx, PtxSource::Compiled))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_keys_differ_by_every_part() {
        let a = fnv1a(&[b"src", b"compute_80"]);
        assert_ne!(a, fnv1a(&[b"src", b"compute_90"]));
        assert_ne!(a, fnv1a(&[b"src2", b"compute_80"]));
        assert_ne!(fnv1a(&[b"ab", b"c"]), fnv1a(&[b"a", b"bc"]));
    }

    #[test]
    fn arch_names() {
        assert_eq!(Arch::new(8, 9).virtual_name(), "compute_89");
    }
}
