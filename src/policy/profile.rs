//! Bandwidth profiles: the measured `B_H` and `B_P` of one machine, backend and weight dtype.
//!
//! The miss split and the prefill planner are only as good as these two numbers, and
//! measuring them takes seconds at start-up, so they are stored per machine as JSON under
//! `<cache_dir>/ft-actor/profiles/<key>.json` and reused. The key covers the machine (CPU model,
//! usable cores, RAM), the backend (the caller should include the device name, since `B_P`
//! depends on the GPU and its PCIe link) and the dtype (CPU streaming speed depends on it), so a
//! profile is never applied to a different configuration. Config values override measurements
//! one at a time ([`resolve`]), which lets a user pin `B_P` while still measuring `B_H`.
//!
//! This is the only file I/O in the policy layer; it uses std only.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Longest readable part of a key, so file names stay well under file-system limits.
const KEY_TEXT_MAX: usize = 96;

/// Why a profile could not be read, written or resolved.
#[derive(Debug, Error)]
pub enum ProfileError {
    /// Reading, writing or creating the directory failed.
    #[error("bandwidth profile {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The file is not a valid profile document.
    #[error("bandwidth profile {path} is not valid JSON: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's error.
        #[source]
        source: serde_json::Error,
    },
    /// The document parsed but holds unusable values; re-measure.
    #[error("bandwidth profile {path} is unusable: {reason}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A key that is not a plain file name (it could escape the profile directory).
    #[error("invalid bandwidth profile key {0:?}")]
    InvalidKey(String),
    /// A configured bandwidth is not a positive finite number.
    #[error("configured {which} must be a positive number of bytes/s, got {value}")]
    InvalidOverride {
        /// `"b_h"` or `"b_p"`.
        which: &'static str,
        /// The value given.
        value: f64,
    },
}

/// Measured bandwidths and what they were measured on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BandwidthProfile {
    /// CPU executors streaming expert weights from host memory, bytes/s.
    pub b_h: f64,
    /// Host→device copies, bytes/s.
    pub b_p: f64,
    /// [`machine_id`] of the host.
    pub machine: String,
    /// Backend and device, e.g. `"cuda:NVIDIA GeForce RTX 4090"`.
    pub backend: String,
    /// Expert weight dtype, e.g. `"bf16"`.
    pub dtype: String,
    /// When it was measured, seconds since the Unix epoch.
    pub measured_unix: u64,
}

impl BandwidthProfile {
    /// A profile measured now.
    pub fn new(b_h: f64, b_p: f64, machine: &str, backend: &str, dtype: &str) -> BandwidthProfile {
        BandwidthProfile {
            b_h,
            b_p,
            machine: machine.to_string(),
            backend: backend.to_string(),
            dtype: dtype.to_string(),
            measured_unix: now_unix(),
        }
    }

    /// The file key for this profile's machine, backend and dtype.
    pub fn key(&self) -> String {
        profile_key(&self.machine, &self.backend, &self.dtype)
    }

    /// What makes the profile unusable, if anything.
    fn problem(&self) -> Option<String> {
        for (name, v) in [("b_h", self.b_h), ("b_p", self.b_p)] {
            if !valid_rate(v) {
                return Some(format!("{name} = {v} is not a positive finite bandwidth"));
            }
        }
        None
    }
}

fn valid_rate(v: f64) -> bool {
    v.is_finite() && v > 0.0
}

/// Seconds since the Unix epoch (0 if the clock is before it).
pub fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// FNV-1a: stable across Rust versions and platforms, unlike `DefaultHasher`.
fn fnv1a(parts: &[&str]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            h = (h ^ 0xff).wrapping_mul(0x100_0000_01b3);
        }
        for b in p.bytes() {
            h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
    }
    h
}

/// A file-name-safe key: the readable parts lowercased with other characters folded to `-`,
/// plus a hash of the exact strings so that two inputs that sanitise alike never share a file.
pub fn profile_key(machine: &str, backend: &str, dtype: &str) -> String {
    let mut text = String::new();
    for c in format!("{machine} {backend} {dtype}").chars() {
        if c.is_ascii_alphanumeric() {
            text.push(c.to_ascii_lowercase());
        } else if !text.ends_with('-') && !text.is_empty() {
            text.push('-');
        }
    }
    let text = text.trim_end_matches('-');
    let text = &text[..text.len().min(KEY_TEXT_MAX)];
    let text = text.trim_end_matches('-');
    let hash = fnv1a(&[machine, backend, dtype]);
    if text.is_empty() {
        format!("{hash:016x}")
    } else {
        format!("{text}-{hash:016x}")
    }
}

fn check_key(key: &str) -> Result<(), ProfileError> {
    let ok = !key.is_empty()
        && !key.starts_with('.')
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(ProfileError::InvalidKey(key.to_string()))
    }
}

/// `<cache_dir>/ft-actor/profiles`.
pub fn profiles_dir(cache_dir: &Path) -> PathBuf {
    cache_dir.join("ft-actor").join("profiles")
}

/// `<cache_dir>/ft-actor/profiles/<key>.json`.
pub fn profile_path(cache_dir: &Path, key: &str) -> Result<PathBuf, ProfileError> {
    check_key(key)?;
    Ok(profiles_dir(cache_dir).join(format!("{key}.json")))
}

/// The per-user cache directory: `$XDG_CACHE_HOME`, else `~/Library/Caches` on macOS,
/// `%LOCALAPPDATA%` on Windows, `~/.cache` elsewhere; `None` if no home is known.
pub fn default_cache_dir() -> Option<PathBuf> {
    let env_dir = |name: &str| {
        std::env::var_os(name)
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
    };
    if let Some(p) = env_dir("XDG_CACHE_HOME") {
        return Some(p);
    }
    if cfg!(windows) {
        return env_dir("LOCALAPPDATA");
    }
    let home = env_dir("HOME")?;
    Some(if cfg!(target_os = "macos") {
        home.join("Library").join("Caches")
    } else {
        home.join(".cache")
    })
}

/// Reads the profile stored under `key`; `Ok(None)` if there is none yet.
pub fn load(cache_dir: &Path, key: &str) -> Result<Option<BandwidthProfile>, ProfileError> {
    let path = profile_path(cache_dir, key)?;
    let text = match fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(ProfileError::Io { path, source }),
    };
    let profile: BandwidthProfile =
        serde_json::from_str(&text).map_err(|source| ProfileError::Parse {
            path: path.clone(),
            source,
        })?;
    if let Some(reason) = profile.problem() {
        return Err(ProfileError::Invalid { path, reason });
    }
    Ok(Some(profile))
}

/// Stores `profile` under its [`key`](BandwidthProfile::key) and returns the file's path.
///
/// Written to a temporary file and renamed, so a concurrent reader or a crash never sees a
/// half-written profile.
pub fn save(cache_dir: &Path, profile: &BandwidthProfile) -> Result<PathBuf, ProfileError> {
    let path = profile_path(cache_dir, &profile.key())?;
    if let Some(reason) = profile.problem() {
        return Err(ProfileError::Invalid { path, reason });
    }
    let dir = profiles_dir(cache_dir);
    fs::create_dir_all(&dir).map_err(|source| ProfileError::Io {
        path: dir.clone(),
        source,
    })?;
    let text = serde_json::to_string_pretty(profile).map_err(|source| ProfileError::Parse {
        path: path.clone(),
        source,
    })?;
    let tmp = path.with_extension(format!("json.tmp-{}", std::process::id()));
    fs::write(&tmp, text).map_err(|source| ProfileError::Io {
        path: tmp.clone(),
        source,
    })?;
    if let Err(source) = fs::rename(&tmp, &path) {
        let _ = fs::remove_file(&tmp);
        return Err(ProfileError::Io { path, source });
    }
    Ok(path)
}

/// This host's identity for profile keys: CPU model, usable cores and RAM, e.g.
/// `"AMD Ryzen 9 7950X 16-Core Processor 32c 62GiB"`. Falls back to the architecture name and
/// omits what it cannot read.
pub fn machine_id() -> String {
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").ok();
    let meminfo = fs::read_to_string("/proc/meminfo").ok();
    // Usable rather than installed cores: B_H scales with the threads this process may run.
    let cores = std::thread::available_parallelism().ok().map(|n| n.get());
    machine_id_from(cpuinfo.as_deref(), meminfo.as_deref(), cores)
}

/// [`machine_id`] from given `/proc/cpuinfo` and `/proc/meminfo` contents (testable).
pub fn machine_id_from(
    cpuinfo: Option<&str>,
    meminfo: Option<&str>,
    cores: Option<usize>,
) -> String {
    let field = |text: &str, names: &[&str]| {
        names.iter().find_map(|name| {
            text.lines().find_map(|line| {
                let (k, v) = line.split_once(':')?;
                let v = v.split_whitespace().collect::<Vec<_>>().join(" ");
                (k.trim().eq_ignore_ascii_case(name) && !v.is_empty()).then_some(v)
            })
        })
    };
    // x86 has "model name"; Arm kernels vary between these.
    let model = cpuinfo
        .and_then(|t| {
            field(
                t,
                &["model name", "Hardware", "Model", "cpu model", "Processor"],
            )
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string());
    let mut id = model;
    if let Some(c) = cores.filter(|&c| c > 0) {
        id.push_str(&format!(" {c}c"));
    }
    let kib = meminfo
        .and_then(|t| field(t, &["MemTotal"]))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok());
    // Nearest GiB: MemTotal moves by a few MiB across kernel updates; the key should not.
    if let Some(gib) = kib.map(|k| (k + (1 << 19)) >> 20).filter(|&g| g > 0) {
        id.push_str(&format!(" {gib}GiB"));
    }
    id
}

/// Where a bandwidth in use came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum BandwidthSource {
    /// Set in the configuration.
    Override,
    /// Read from a stored or fresh measurement.
    Profile,
}

/// One bandwidth in use.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Bandwidth {
    /// Bytes per second.
    pub bytes_per_s: f64,
    /// Where it came from.
    pub source: BandwidthSource,
}

/// The bandwidths to run with; `None` means it must be measured.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct ResolvedBandwidths {
    /// CPU expert-streaming bandwidth.
    pub b_h: Option<Bandwidth>,
    /// Host→device bandwidth.
    pub b_p: Option<Bandwidth>,
}

impl ResolvedBandwidths {
    /// True when both are known and nothing needs measuring.
    pub fn is_complete(&self) -> bool {
        self.b_h.is_some() && self.b_p.is_some()
    }

    /// `(b_h, b_p)` in bytes/s when both are known.
    pub fn values(&self) -> Option<(f64, f64)> {
        Some((self.b_h?.bytes_per_s, self.b_p?.bytes_per_s))
    }
}

/// Combines a measured profile with configured overrides; each override wins on its own.
/// A profile value that is not a positive finite number is ignored (it must be re-measured);
/// such an override is an error, since the user asked for it explicitly.
pub fn resolve(
    measured: Option<&BandwidthProfile>,
    override_b_h: Option<f64>,
    override_b_p: Option<f64>,
) -> Result<ResolvedBandwidths, ProfileError> {
    let pick = |which: &'static str, over: Option<f64>, meas: Option<f64>| match over {
        Some(v) if valid_rate(v) => Ok(Some(Bandwidth {
            bytes_per_s: v,
            source: BandwidthSource::Override,
        })),
        Some(value) => Err(ProfileError::InvalidOverride { which, value }),
        None => Ok(meas.filter(|&v| valid_rate(v)).map(|v| Bandwidth {
            bytes_per_s: v,
            source: BandwidthSource::Profile,
        })),
    };
    Ok(ResolvedBandwidths {
        b_h: pick("b_h", override_b_h, measured.map(|p| p.b_h))?,
        b_p: pick("b_p", override_b_p, measured.map(|p| p.b_p))?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A unique directory under the system temp dir, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new() -> TempDir {
            static N: AtomicU32 = AtomicU32::new(0);
            let nanos = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0);
            let name = format!(
                "ft-actor-policy-profile-{}-{}-{}",
                std::process::id(),
                nanos,
                N.fetch_add(1, Ordering::Relaxed)
            );
            let p = std::env::temp_dir().join(name);
            fs::create_dir_all(&p).unwrap();
            TempDir(p)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn sample() -> BandwidthProfile {
        BandwidthProfile::new(
            48e9,
            24e9,
            "AMD Ryzen 9 7950X 32c 62GiB",
            "cuda:RTX 4090",
            "bf16",
        )
    }

    #[test]
    fn save_then_load_round_trips() {
        let tmp = TempDir::new();
        let p = sample();
        let path = save(&tmp.0, &p).unwrap();
        assert_eq!(path, profiles_dir(&tmp.0).join(format!("{}.json", p.key())));
        assert!(path.starts_with(tmp.0.join("ft-actor").join("profiles")));
        assert_eq!(load(&tmp.0, &p.key()).unwrap(), Some(p.clone()));
        // Overwrite in place.
        let mut q = p.clone();
        q.b_p = 30e9;
        save(&tmp.0, &q).unwrap();
        assert_eq!(load(&tmp.0, &p.key()).unwrap().unwrap().b_p, 30e9);
        let leftovers: Vec<_> = fs::read_dir(profiles_dir(&tmp.0)).unwrap().collect();
        assert_eq!(leftovers.len(), 1, "temporary files must not remain");
    }

    #[test]
    fn missing_profile_is_none() {
        let tmp = TempDir::new();
        assert!(load(&tmp.0, "nothing-here").unwrap().is_none());
    }

    #[test]
    fn corrupt_and_invalid_files_are_errors() {
        let tmp = TempDir::new();
        let dir = profiles_dir(&tmp.0);
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("bad.json"), "{ not json").unwrap();
        assert!(matches!(
            load(&tmp.0, "bad"),
            Err(ProfileError::Parse { .. })
        ));
        let mut p = sample();
        p.b_h = -1.0;
        fs::write(dir.join("neg.json"), serde_json::to_string(&p).unwrap()).unwrap();
        let err = load(&tmp.0, "neg").unwrap_err();
        assert!(err.to_string().contains("b_h"), "{err}");
        assert!(matches!(
            save(&tmp.0, &p),
            Err(ProfileError::Invalid { .. })
        ));
    }

    #[test]
    fn keys_are_safe_and_distinct() {
        let k = profile_key(
            "AMD Ryzen 9 7950X 16-Core Processor 32c 62GiB",
            "cuda:RTX 4090",
            "bf16",
        );
        assert!(
            k.starts_with("amd-ryzen-9-7950x-16-core-processor-32c-62gib-cuda-rtx-4090-bf16-"),
            "{k}"
        );
        assert!(check_key(&k).is_ok());
        assert_ne!(profile_key("a b", "c", "d"), profile_key("a-b", "c", "d"));
        assert_ne!(profile_key("ab", "c", "d"), profile_key("a", "bc", "d"));
        assert_eq!(profile_key("x", "y", "z"), profile_key("x", "y", "z"));
        let weird = profile_key("../../etc", "/", "\u{1F600}");
        assert!(check_key(&weird).is_ok() && !weird.contains('/') && !weird.starts_with('.'));
        assert!(check_key(&profile_key("", "", "")).is_ok());
        let long = profile_key(&"x".repeat(500), "cuda", "bf16");
        assert!(long.len() <= KEY_TEXT_MAX + 17);
    }

    #[test]
    fn unsafe_keys_are_refused() {
        let tmp = TempDir::new();
        for key in ["", "../x", "a/b", ".hidden", "a\\b"] {
            assert!(
                matches!(load(&tmp.0, key), Err(ProfileError::InvalidKey(_))),
                "{key:?}"
            );
        }
    }

    #[test]
    fn machine_id_from_proc_files() {
        let cpu =
            "processor\t: 0\nmodel name\t: AMD Ryzen 9   7950X 16-Core Processor\nflags\t: sse\n\
                   processor\t: 1\nmodel name\t: AMD Ryzen 9 7950X 16-Core Processor\n";
        let mem = "MemTotal:       65536000 kB\nMemFree:        1000 kB\n";
        assert_eq!(
            machine_id_from(Some(cpu), Some(mem), Some(32)),
            "AMD Ryzen 9 7950X 16-Core Processor 32c 63GiB"
        );
        let arm = "processor\t: 0\nBogoMIPS\t: 50.00\nHardware\t: BCM2835\n";
        assert_eq!(machine_id_from(Some(arm), None, Some(4)), "BCM2835 4c");
        assert_eq!(machine_id_from(None, None, None), std::env::consts::ARCH);
        assert_eq!(
            machine_id_from(Some("garbage"), Some("MemTotal: x kB"), Some(0)),
            std::env::consts::ARCH
        );
        // The real machine: never empty, never panics.
        assert!(!machine_id().is_empty());
    }

    #[test]
    fn overrides_win_one_at_a_time() {
        let p = sample();
        let r = resolve(Some(&p), None, None).unwrap();
        assert_eq!(r.values(), Some((48e9, 24e9)));
        assert_eq!(r.b_h.unwrap().source, BandwidthSource::Profile);

        let r = resolve(Some(&p), None, Some(12e9)).unwrap();
        assert_eq!(r.values(), Some((48e9, 12e9)));
        assert_eq!(r.b_p.unwrap().source, BandwidthSource::Override);
        assert_eq!(r.b_h.unwrap().source, BandwidthSource::Profile);

        let r = resolve(None, Some(5e9), None).unwrap();
        assert!(!r.is_complete() && r.values().is_none());
        assert_eq!(r.b_h.unwrap().bytes_per_s, 5e9);
        assert!(r.b_p.is_none());

        assert!(!resolve(None, None, None).unwrap().is_complete());
        assert!(matches!(
            resolve(Some(&p), Some(0.0), None),
            Err(ProfileError::InvalidOverride { which: "b_h", .. })
        ));
        assert!(resolve(None, None, Some(f64::NAN)).is_err());

        let mut broken = sample();
        broken.b_p = f64::INFINITY;
        let r = resolve(Some(&broken), None, None).unwrap();
        assert!(r.b_h.is_some() && r.b_p.is_none());
    }

    #[test]
    fn default_cache_dir_is_absolute_when_known() {
        if let Some(d) = default_cache_dir() {
            assert!(d.is_absolute());
        }
    }
}
