//! Run-time choice of the vector instruction set.
//!
//! Every kernel takes a [`SimdLevel`] and clamps it to what the CPU really has
//! ([`SimdLevel::effective`]) before touching an intrinsic, so the safe `pub fn` kernels stay
//! sound even when a caller asks for a level this machine lacks.

/// Which vector instruction set the kernels use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum SimdLevel {
    /// The best level the CPU offers, detected at run time.
    #[default]
    Auto,
    /// Portable Rust only (what the compiler makes of it for the baseline target).
    Scalar,
    /// AVX2 with FMA and F16C (x86-64-v3).
    Avx2,
    /// AVX-512 F/BW/VL on top of AVX2 (x86-64-v4).
    Avx512,
}

impl SimdLevel {
    /// The best level this CPU supports (never `Auto`).
    pub fn detected() -> SimdLevel {
        detect()
    }

    /// The level kernels actually run at: `Auto` becomes [`SimdLevel::detected`], and a level
    /// the CPU lacks falls back to the best one it has. Never returns `Auto`.
    pub fn effective(self) -> SimdLevel {
        let best = detect();
        match self {
            SimdLevel::Auto => best,
            wanted if wanted.rank() <= best.rank() => wanted,
            _ => best,
        }
    }

    /// Lower-case name for logs and device descriptions.
    pub fn name(self) -> &'static str {
        match self {
            SimdLevel::Auto => "auto",
            SimdLevel::Scalar => "scalar",
            SimdLevel::Avx2 => "avx2",
            SimdLevel::Avx512 => "avx512",
        }
    }

    /// Parses `auto`, `scalar`, `avx2`, `avx512` (case-insensitive).
    pub fn parse(s: &str) -> Option<SimdLevel> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Some(SimdLevel::Auto),
            "scalar" | "none" => Some(SimdLevel::Scalar),
            "avx2" => Some(SimdLevel::Avx2),
            "avx512" | "avx-512" => Some(SimdLevel::Avx512),
            _ => None,
        }
    }

    fn rank(self) -> u8 {
        match self {
            SimdLevel::Auto | SimdLevel::Scalar => 0,
            SimdLevel::Avx2 => 1,
            SimdLevel::Avx512 => 2,
        }
    }
}

impl std::fmt::Display for SimdLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(target_arch = "x86_64")]
fn detect() -> SimdLevel {
    // The std macro caches its CPUID results, so calling this per kernel launch is cheap.
    let avx2 = is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c");
    let avx512 = is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl");
    match (avx2, avx512) {
        (true, true) => SimdLevel::Avx512,
        (true, false) => SimdLevel::Avx2,
        _ => SimdLevel::Scalar,
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn detect() -> SimdLevel {
    SimdLevel::Scalar
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn effective_never_exceeds_detected() {
        let best = SimdLevel::detected();
        for l in [
            SimdLevel::Auto,
            SimdLevel::Scalar,
            SimdLevel::Avx2,
            SimdLevel::Avx512,
        ] {
            let e = l.effective();
            assert_ne!(e, SimdLevel::Auto);
            assert!(e.rank() <= best.rank());
        }
        assert_eq!(SimdLevel::Scalar.effective(), SimdLevel::Scalar);
        assert_eq!(SimdLevel::parse("AVX512"), Some(SimdLevel::Avx512));
    }
}
