//! `--moe` modes: how routed experts are placed, and how `auto` picks one.
//!
//! A user may force pure offloading (every miss fetched, as offloading engines do), pure CPU
//! execution of misses, or the hybrid split; `auto` decides from the measured bandwidths,
//! because a branch that would get only a sliver of `q*` costs threads, synchronisation and
//! pinned buffers while saving almost nothing. Whatever was asked, no cache slots means no
//! fetches.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::split::{choose_q_branches, BranchCosts};

/// How routed experts are placed, as given by `--moe`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MoeMode {
    /// Pick from the measured bandwidths and the cache size ([`MoeMode::resolve`]).
    #[default]
    Auto,
    /// Fetch every miss into the cache (`q = m`), as a pure offloading engine would.
    Offload,
    /// Run every miss on the CPU (`q = 0`); the cache only serves what is resident.
    Cpu,
    /// Split misses by [`choose_q`](super::split::choose_q).
    Hybrid,
}

/// The mode in effect after `Auto` and impossible requests are resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ResolvedMode {
    /// `q = m` (capped by what the cache can take; the rest must still run on the CPU).
    Offload,
    /// `q = 0`.
    Cpu,
    /// `q` from [`choose_q_branches`].
    Hybrid,
}

/// A branch whose share of `q*` is below this is not worth running: with typical top-k it
/// would get no expert at all, yet costs threads, synchronisation and pinned buffers.
pub const AUTO_MIN_SHARE: f64 = 0.05;

/// `--moe` was not one of the known modes.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("unknown MoE mode {0:?}; expected auto, offload, cpu or hybrid")]
pub struct ParseMoeModeError(pub String);

impl FromStr for MoeMode {
    type Err = ParseMoeModeError;
    fn from_str(s: &str) -> Result<MoeMode, ParseMoeModeError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(MoeMode::Auto),
            "offload" => Ok(MoeMode::Offload),
            "cpu" => Ok(MoeMode::Cpu),
            "hybrid" => Ok(MoeMode::Hybrid),
            _ => Err(ParseMoeModeError(s.to_string())),
        }
    }
}

impl fmt::Display for MoeMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MoeMode::Auto => "auto",
            MoeMode::Offload => "offload",
            MoeMode::Cpu => "cpu",
            MoeMode::Hybrid => "hybrid",
        })
    }
}

impl fmt::Display for ResolvedMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ResolvedMode::Offload => "offload",
            ResolvedMode::Cpu => "cpu",
            ResolvedMode::Hybrid => "hybrid",
        })
    }
}

impl MoeMode {
    /// The mode to run, given bandwidths (bytes/s) and the number of cache slots.
    pub fn resolve(self, b_p: f64, b_h: f64, cache_slots: usize) -> ResolvedMode {
        self.resolve_explained(b_p, b_h, cache_slots).0
    }

    /// [`resolve`](Self::resolve) plus a one-line reason for logs and `ft-actor info`.
    pub fn resolve_explained(
        self,
        b_p: f64,
        b_h: f64,
        cache_slots: usize,
    ) -> (ResolvedMode, &'static str) {
        // Nothing can be fetched without a slot to land in, whatever was asked for.
        if cache_slots == 0 && self != MoeMode::Cpu {
            return (
                ResolvedMode::Cpu,
                "no expert cache slots: misses run on the CPU",
            );
        }
        match self {
            MoeMode::Offload => (ResolvedMode::Offload, "--moe offload"),
            MoeMode::Cpu => (ResolvedMode::Cpu, "--moe cpu"),
            MoeMode::Hybrid => (ResolvedMode::Hybrid, "--moe hybrid"),
            MoeMode::Auto => {
                let usable = |b: f64| b.is_finite() && b > 0.0;
                match (usable(b_p), usable(b_h)) {
                    (false, false) => {
                        (ResolvedMode::Hybrid, "bandwidths unknown: split adaptively")
                    }
                    (false, true) => (ResolvedMode::Cpu, "host→device bandwidth unusable"),
                    (true, false) => (ResolvedMode::Offload, "CPU expert bandwidth unusable"),
                    (true, true) => {
                        let cpu_share = b_h / (b_p + b_h);
                        if cpu_share < AUTO_MIN_SHARE {
                            (
                                ResolvedMode::Offload,
                                "CPU branch would take under 5% of misses",
                            )
                        } else if 1.0 - cpu_share < AUTO_MIN_SHARE {
                            (
                                ResolvedMode::Cpu,
                                "PCIe branch would take under 5% of misses",
                            )
                        } else {
                            (ResolvedMode::Hybrid, "both branches useful")
                        }
                    }
                }
            }
        }
    }
}

impl ResolvedMode {
    /// Number of the `m` misses to fetch under this mode, at most `max_fetch`.
    pub fn choose_q(self, m: usize, max_fetch: usize, costs: &BranchCosts) -> usize {
        match self {
            ResolvedMode::Offload => m.min(max_fetch),
            ResolvedMode::Cpu => 0,
            ResolvedMode::Hybrid => choose_q_branches(m, max_fetch, costs),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::split::SplitCosts;

    const GB: f64 = 1e9;

    #[test]
    fn modes_parse_and_display() {
        for (s, m) in [
            ("auto", MoeMode::Auto),
            ("Offload", MoeMode::Offload),
            (" cpu ", MoeMode::Cpu),
            ("HYBRID", MoeMode::Hybrid),
        ] {
            let parsed: MoeMode = s.parse().unwrap();
            assert_eq!(parsed, m);
            assert_eq!(parsed.to_string().parse::<MoeMode>().unwrap(), m);
        }
        let err = "gpu".parse::<MoeMode>().unwrap_err();
        assert!(err.to_string().contains("auto, offload, cpu or hybrid"));
        assert_eq!(MoeMode::default(), MoeMode::Auto);
        assert_eq!(ResolvedMode::Hybrid.to_string(), "hybrid");
    }

    #[test]
    fn auto_resolution() {
        let r = |bp: f64, bh: f64, slots| MoeMode::Auto.resolve(bp * GB, bh * GB, slots);
        assert_eq!(r(25.0, 40.0, 100), ResolvedMode::Hybrid);
        assert_eq!(r(25.0, 0.5, 100), ResolvedMode::Offload);
        assert_eq!(r(0.5, 40.0, 100), ResolvedMode::Cpu);
        assert_eq!(r(25.0, 40.0, 0), ResolvedMode::Cpu);
        assert_eq!(r(0.0, 40.0, 10), ResolvedMode::Cpu);
        assert_eq!(r(25.0, 0.0, 10), ResolvedMode::Offload);
        assert_eq!(
            MoeMode::Auto.resolve(f64::NAN, f64::NAN, 10),
            ResolvedMode::Hybrid
        );
    }

    #[test]
    fn explicit_modes_resolve_to_themselves_unless_impossible() {
        assert_eq!(
            MoeMode::Offload.resolve(1.0, 1e12, 4),
            ResolvedMode::Offload
        );
        assert_eq!(MoeMode::Hybrid.resolve(1.0, 1.0, 4), ResolvedMode::Hybrid);
        assert_eq!(MoeMode::Cpu.resolve(1e12, 1.0, 4), ResolvedMode::Cpu);
        let (mode, why) = MoeMode::Offload.resolve_explained(1e12, 1.0, 0);
        assert_eq!(mode, ResolvedMode::Cpu);
        assert!(why.contains("no expert cache"));
    }

    #[test]
    fn resolved_mode_sets_q() {
        let c = BranchCosts::from(&SplitCosts::new(1 << 20, 10.0 * GB, 30.0 * GB));
        assert_eq!(ResolvedMode::Offload.choose_q(8, 5, &c), 5);
        assert_eq!(ResolvedMode::Offload.choose_q(8, 50, &c), 8);
        assert_eq!(ResolvedMode::Cpu.choose_q(8, 50, &c), 0);
        assert_eq!(ResolvedMode::Hybrid.choose_q(8, 50, &c), 2);
    }
}
