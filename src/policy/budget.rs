//! Device memory budget: how much VRAM goes to fixed needs and how many expert slots remain.
//!
//! The expert cache is whatever is left after the things that must be on the device: non-expert
//! weights, the KV pool shared by the sequences' caches (see `kv_pool`), kernel scratch,
//! and — only if streaming prefill is enabled — two layer buffers (`2 · E · s`) for double
//! buffering. Planning this once, in plain arithmetic, lets `ft-actor info` show the plan before
//! any allocation and turns an impossible configuration into a message instead of an OOM.
//!
//! `--vram-budget auto` keeps a safety margin below the free memory measured at start-up
//! (before this process allocates anything): `max(5 % of total, 256 MiB)`, because drivers,
//! the display server and allocator fragmentation take memory that `free` does not predict.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::kv_pool::{size_kv_pool, MIN_KV_TOKENS};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// Smallest safety margin kept below free memory by `--vram-budget auto`.
pub const AUTO_MARGIN_MIN: u64 = 256 * MIB;
/// Fraction of total device memory kept free by `--vram-budget auto`, if larger than the minimum.
pub const AUTO_MARGIN_FRACTION: f64 = 0.05;

/// A `--vram-budget` (or any byte size) string could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ParseBytesError {
    /// Nothing given.
    #[error("empty size; expected e.g. 12GiB, 8G, 6000MB, 123456 or auto")]
    Empty,
    /// The text does not start with a non-negative number.
    #[error("invalid size {0:?}; expected a non-negative number and unit, e.g. 12GiB, 8G, 6000MB or 123456")]
    InvalidNumber(String),
    /// The unit is not one of B, K/KiB, M/MiB, G/GiB, T/TiB, KB, MB, GB, TB.
    #[error(
        "unknown size unit {0:?}; use B, KiB, MiB, GiB, TiB (or K, M, G, T) or KB, MB, GB, TB"
    )]
    UnknownUnit(String),
    /// The value does not fit in 64 bits.
    #[error("size {0:?} is too large")]
    Overflow(String),
}

/// Parses a byte size: a number (fractions allowed) and an optional unit, case-insensitive,
/// spaces allowed between. `K/M/G/T` and `KiB/MiB/GiB/TiB` are binary (as in `-Xmx8G` and
/// `nvidia-smi`'s MiB); `KB/MB/GB/TB` are decimal (SI). Fractional bytes round down.
pub fn parse_bytes(s: &str) -> Result<u64, ParseBytesError> {
    let t = s.trim();
    if t.is_empty() {
        return Err(ParseBytesError::Empty);
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let num: String = num.chars().filter(|&c| c != '_').collect();
    if num.is_empty() || num == "." || num.matches('.').count() > 1 {
        return Err(ParseBytesError::InvalidNumber(t.to_string()));
    }
    let mult = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => KIB,
        "m" | "mib" => MIB,
        "g" | "gib" => GIB,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => return Err(ParseBytesError::UnknownUnit(unit.trim().to_string())),
    };
    // Integers stay exact; only a fraction goes through f64.
    if let Ok(n) = num.parse::<u64>() {
        return n
            .checked_mul(mult)
            .ok_or_else(|| ParseBytesError::Overflow(s.trim().to_string()));
    }
    let x: f64 = num
        .parse()
        .map_err(|_| ParseBytesError::InvalidNumber(t.to_string()))?;
    let bytes = x * mult as f64;
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(ParseBytesError::Overflow(s.trim().to_string()));
    }
    Ok(bytes.floor() as u64)
}

/// Human-readable binary size for messages, e.g. `"11.50 GiB"`.
pub fn format_bytes(b: u64) -> String {
    if b >= GIB {
        format!("{:.2} GiB", b as f64 / GIB as f64)
    } else if b >= MIB {
        format!("{:.1} MiB", b as f64 / MIB as f64)
    } else if b >= KIB {
        format!("{:.1} KiB", b as f64 / KIB as f64)
    } else {
        format!("{b} B")
    }
}

/// `--vram-budget`: how much device memory ft-actor may use in total.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum VramBudget {
    /// Free memory minus a safety margin.
    #[default]
    Auto,
    /// An explicit number of bytes.
    Bytes(u64),
}

impl FromStr for VramBudget {
    type Err = ParseBytesError;
    fn from_str(s: &str) -> Result<VramBudget, ParseBytesError> {
        if s.trim().eq_ignore_ascii_case("auto") {
            Ok(VramBudget::Auto)
        } else {
            parse_bytes(s).map(VramBudget::Bytes)
        }
    }
}

impl fmt::Display for VramBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VramBudget::Auto => f.write_str("auto"),
            VramBudget::Bytes(b) => write!(f, "{b}"),
        }
    }
}

/// What the KV pool is sized from: the worst case is `bytes_per_token × context × sequences`
/// (see [`super::kv_pool::size_kv_pool`] for what `auto` takes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct KvReserve {
    /// KV bytes per token, all layers together.
    pub bytes_per_token: u64,
    /// Context length reserved per sequence.
    pub context: u64,
    /// Sequences served in parallel.
    pub sequences: u64,
    /// `kv_budget`: the pool's size as configured (`None`: auto).
    pub pool: Option<u64>,
}

impl KvReserve {
    /// The worst case: every sequence at full context (saturating: an absurd configuration
    /// then simply does not fit).
    pub fn bytes(&self) -> u64 {
        self.bytes_per_token
            .saturating_mul(self.context)
            .saturating_mul(self.sequences)
    }
}

/// Facts and settings that determine the memory plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct MemoryInputs {
    /// Free device memory at start-up. With `device_total == 0` both are taken as unknown.
    pub device_free: u64,
    /// Total device memory.
    pub device_total: u64,
    /// `--vram-budget`.
    pub budget: VramBudget,
    /// Non-expert weights on the device (embeddings, attention, norms, gates, shared experts,
    /// lm_head).
    pub non_expert_bytes: u64,
    /// KV reservation.
    pub kv: KvReserve,
    /// Kernel workspace and activations.
    pub scratch_bytes: u64,
    /// Bytes of one routed expert (`s`), i.e. of one cache slot.
    pub expert_bytes: u64,
    /// Routed experts per MoE layer (`E`).
    pub experts_per_layer: u64,
    /// Number of MoE layers.
    pub moe_layers: u64,
    /// Whether streaming prefill is wanted (it needs two layer buffers).
    pub streaming_prefill: bool,
    /// `--expert-cache-slots N`.
    pub cache_slots_override: Option<u64>,
}

/// How device memory is divided.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct MemoryPlan {
    /// The budget everything is planned within.
    pub budget_bytes: u64,
    /// Expert cache slots.
    pub cache_slots: u64,
    /// `cache_slots × expert_bytes`.
    pub cache_bytes: u64,
    /// Non-expert weights.
    pub non_expert_bytes: u64,
    /// The KV pool all sequences' per-token caches share.
    pub kv_bytes: u64,
    /// Tokens one sequence may hold: the configured context, or what the pool holds if less.
    pub kv_context: u64,
    /// Scratch reservation.
    pub scratch_bytes: u64,
    /// Two layer buffers, or 0 when streaming prefill is off or did not fit.
    pub stream_buffers_bytes: u64,
    /// Whether streaming prefill stays enabled.
    pub streaming_prefill: bool,
    /// Every routed expert of the model (`E × layers`); slots never exceed it.
    pub total_experts: u64,
    /// The most slots a resize may ask for: what the budget holds after the fixed needs (at
    /// least the slots planned), or every expert when the device's size is unknown.
    pub max_cache_slots: u64,
    /// False when the model cannot run with this budget; `error` says why.
    pub fits: bool,
    /// The reason for `fits == false`, ready to show the user.
    pub error: Option<String>,
    /// Informational lines for `ft-actor info` and logs.
    pub notes: Vec<String>,
    /// Things the user probably wants to know (a feature turned off, a budget exceeded).
    pub warnings: Vec<String>,
}

impl MemoryPlan {
    /// Bytes the plan allocates on the device.
    pub fn total_bytes(&self) -> u64 {
        self.non_expert_bytes
            .saturating_add(self.kv_bytes)
            .saturating_add(self.scratch_bytes)
            .saturating_add(self.stream_buffers_bytes)
            .saturating_add(self.cache_bytes)
    }
}

/// The safety margin `--vram-budget auto` keeps below free memory.
pub fn auto_margin(device_total: u64) -> u64 {
    ((device_total as f64 * AUTO_MARGIN_FRACTION) as u64).max(AUTO_MARGIN_MIN)
}

/// Divides device memory: fixed needs first, then stream buffers, then the expert cache.
pub fn plan_memory(inp: &MemoryInputs) -> MemoryPlan {
    let known = inp.device_total > 0;
    let mut plan = MemoryPlan {
        non_expert_bytes: inp.non_expert_bytes,
        scratch_bytes: inp.scratch_bytes,
        total_experts: inp.experts_per_layer.saturating_mul(inp.moe_layers),
        fits: true,
        ..MemoryPlan::default()
    };
    let f = format_bytes;

    plan.budget_bytes = match inp.budget {
        VramBudget::Auto if !known => {
            plan.warnings.push(
                "device memory size is unknown; pass --vram-budget to use device memory".into(),
            );
            0
        }
        VramBudget::Auto => {
            let margin = auto_margin(inp.device_total);
            plan.notes.push(format!(
                "VRAM budget auto: {} free − {} safety margin",
                f(inp.device_free),
                f(margin)
            ));
            inp.device_free.saturating_sub(margin)
        }
        VramBudget::Bytes(b) if known && b > inp.device_free => {
            plan.warnings.push(format!(
                "--vram-budget {} exceeds the {} free on the device; using {}",
                f(b),
                f(inp.device_free),
                f(inp.device_free)
            ));
            inp.device_free
        }
        VramBudget::Bytes(b) => b,
    };

    // The KV pool takes its share of what the weights and scratch leave; where the device's
    // size is unknown (and no budget given) the worst case is planned, as nothing limits it.
    let base = plan.non_expert_bytes.saturating_add(plan.scratch_bytes);
    let room = (known || matches!(inp.budget, VramBudget::Bytes(_))).then(|| plan.budget_bytes.saturating_sub(base));
    match size_kv_pool(&inp.kv, room) {
        Ok(p) => {
            plan.kv_bytes = p.bytes;
            plan.kv_context = p.context;
            plan.notes.push(p.note);
            plan.warnings.extend(p.warning);
        }
        Err(e) if base <= plan.budget_bytes => {
            plan.fits = false;
            plan.error = Some(e);
            return plan;
        }
        // The weights alone do not fit: said below.
        Err(_) => plan.kv_bytes = inp.kv.bytes_per_token.saturating_mul(MIN_KV_TOKENS.min(inp.kv.context)),
    }
    let fixed = plan
        .non_expert_bytes
        .saturating_add(plan.kv_bytes)
        .saturating_add(plan.scratch_bytes);
    if fixed > plan.budget_bytes {
        plan.fits = false;
        plan.error = Some(format!(
            "non-expert weights ({}) + KV pool ({}) + scratch ({}) = {} exceed the VRAM budget \
             of {} by {}; lower kv_budget or the context length, raise --vram-budget, \
             or use --backend cpu",
            f(plan.non_expert_bytes),
            f(plan.kv_bytes),
            f(plan.scratch_bytes),
            f(fixed),
            f(plan.budget_bytes),
            f(fixed - plan.budget_bytes)
        ));
        return plan;
    }
    let mut left = plan.budget_bytes - fixed;

    if inp.streaming_prefill {
        let buffers = inp
            .experts_per_layer
            .saturating_mul(inp.expert_bytes)
            .saturating_mul(2);
        if buffers <= left {
            plan.stream_buffers_bytes = buffers;
            plan.streaming_prefill = true;
            left -= buffers;
        } else {
            plan.warnings.push(format!(
                "streaming prefill disabled: two layer buffers need {} but only {} remain",
                f(buffers),
                f(left)
            ));
        }
    }

    // Zero-byte experts (nothing routed on the device) never limit the slot count.
    let auto_slots = left
        .checked_div(inp.expert_bytes)
        .unwrap_or(plan.total_experts);
    let mut slots = auto_slots.min(plan.total_experts);
    if let Some(n) = inp.cache_slots_override {
        slots = n.min(plan.total_experts);
        if n > plan.total_experts {
            plan.notes.push(format!(
                "--expert-cache-slots {n} capped at the model's {} experts",
                plan.total_experts
            ));
        }
        let need = slots.saturating_mul(inp.expert_bytes);
        // The override may exceed the budget (the user knows their machine), never the device.
        let physical = if known {
            inp.device_free
                .saturating_sub(fixed)
                .saturating_sub(plan.stream_buffers_bytes)
        } else {
            u64::MAX
        };
        if need > physical {
            plan.fits = false;
            plan.error = Some(format!(
                "--expert-cache-slots {slots} needs {} but only {} of device memory remain after \
                 the fixed reservations; lower it or drop it to size the cache automatically",
                f(need),
                f(physical)
            ));
        } else if need > left {
            plan.warnings.push(format!(
                "--expert-cache-slots {slots} ({}) exceeds the {} left in the VRAM budget",
                f(need),
                f(left)
            ));
        }
    }
    plan.cache_slots = slots;
    plan.cache_bytes = slots.saturating_mul(inp.expert_bytes);
    plan.max_cache_slots = if known { auto_slots.min(plan.total_experts).max(slots) } else { plan.total_experts };

    if plan.total_experts > 0 && slots == plan.total_experts {
        plan.notes
            .push("every routed expert fits on the device; no expert traffic after warm-up".into());
    } else if plan.total_experts > 0 && slots == 0 && inp.cache_slots_override == Some(0) {
        // Asked for (or chosen because the device is the CPU itself): not worth a warning.
        plan.notes
            .push("no expert cache: routed experts run on the CPU".into());
    } else if plan.total_experts > 0 && slots == 0 && plan.fits {
        plan.warnings
            .push("no room for an expert cache; routed experts run on the CPU".into());
    } else if plan.total_experts > 0 {
        plan.notes.push(format!(
            "expert cache: {slots} of {} experts ({:.1} %), {}",
            plan.total_experts,
            100.0 * slots as f64 / plan.total_experts as f64,
            f(plan.cache_bytes)
        ));
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sizes() {
        assert_eq!(parse_bytes("123456"), Ok(123_456));
        assert_eq!(parse_bytes("12GiB"), Ok(12 * GIB));
        assert_eq!(parse_bytes("8G"), Ok(8 * GIB));
        assert_eq!(parse_bytes("8g"), Ok(8 * GIB));
        assert_eq!(parse_bytes("6000MB"), Ok(6_000_000_000));
        assert_eq!(parse_bytes("512 MiB"), Ok(512 * MIB));
        assert_eq!(parse_bytes(" 1.5GiB "), Ok(3 * GIB / 2));
        assert_eq!(parse_bytes("64k"), Ok(64 * KIB));
        assert_eq!(parse_bytes("2TB"), Ok(2_000_000_000_000));
        assert_eq!(parse_bytes("100b"), Ok(100));
        assert_eq!(parse_bytes("1_000"), Ok(1000));
        assert_eq!(parse_bytes("0.5"), Ok(0));
    }

    #[test]
    fn size_errors_are_clear() {
        assert_eq!(parse_bytes(""), Err(ParseBytesError::Empty));
        assert_eq!(
            parse_bytes("GiB"),
            Err(ParseBytesError::InvalidNumber("GiB".into()))
        );
        assert_eq!(
            parse_bytes("1.2.3G"),
            Err(ParseBytesError::InvalidNumber("1.2.3G".into()))
        );
        assert_eq!(
            parse_bytes("-5G"),
            Err(ParseBytesError::InvalidNumber("-5G".into()))
        );
        assert_eq!(
            parse_bytes("12 parsecs"),
            Err(ParseBytesError::UnknownUnit("parsecs".into()))
        );
        assert!(matches!(
            parse_bytes("99999999999T"),
            Err(ParseBytesError::Overflow(_))
        ));
        assert!(matches!(
            parse_bytes("9999999999999999.5T"),
            Err(ParseBytesError::Overflow(_))
        ));
        let msg = parse_bytes("8 gigs").unwrap_err().to_string();
        assert!(msg.contains("GiB") && msg.contains("gigs"), "{msg}");
    }

    #[test]
    fn budget_strings() {
        assert_eq!("auto".parse::<VramBudget>(), Ok(VramBudget::Auto));
        assert_eq!(" AUTO".parse::<VramBudget>(), Ok(VramBudget::Auto));
        assert_eq!("8G".parse::<VramBudget>(), Ok(VramBudget::Bytes(8 * GIB)));
        assert!("lots".parse::<VramBudget>().is_err());
        assert_eq!(VramBudget::Bytes(5).to_string(), "5");
        assert_eq!(VramBudget::Auto.to_string(), "auto");
        assert_eq!(format_bytes(3 * GIB / 2), "1.50 GiB");
        assert_eq!(format_bytes(10), "10 B");
    }

    /// A 24 GiB card with 23 GiB free, a model with 48 layers × 128 experts of 9 MiB.
    fn card() -> MemoryInputs {
        MemoryInputs {
            device_free: 23 * GIB,
            device_total: 24 * GIB,
            budget: VramBudget::Auto,
            non_expert_bytes: 2 * GIB,
            kv: KvReserve {
                bytes_per_token: 96 * KIB,
                context: 32768,
                sequences: 1,
                pool: None,
            },
            scratch_bytes: 512 * MIB,
            expert_bytes: 9 * MIB,
            experts_per_layer: 128,
            moe_layers: 48,
            streaming_prefill: true,
            cache_slots_override: None,
        }
    }

    #[test]
    fn auto_budget_leaves_a_margin_and_fills_the_cache() {
        let p = plan_memory(&card());
        let margin = auto_margin(24 * GIB);
        assert_eq!(margin, (24.0 * GIB as f64 * 0.05) as u64);
        assert_eq!(p.budget_bytes, 23 * GIB - margin);
        assert_eq!(p.kv_bytes, 3 * GIB);
        assert_eq!(p.stream_buffers_bytes, 2 * 128 * 9 * MIB);
        assert!(p.fits && p.streaming_prefill && p.error.is_none());
        let left = p.budget_bytes - 2 * GIB - 3 * GIB - 512 * MIB - p.stream_buffers_bytes;
        assert_eq!(p.cache_slots, left / (9 * MIB));
        assert_eq!(p.cache_bytes, p.cache_slots * 9 * MIB);
        assert!(p.total_bytes() <= p.budget_bytes);
        assert_eq!(auto_margin(GIB), AUTO_MARGIN_MIN);
    }

    #[test]
    fn resizes_are_bounded_by_the_budget_not_by_the_start_size() {
        let auto = plan_memory(&card());
        assert_eq!(auto.max_cache_slots, auto.cache_slots);
        // Started with no cache (the CPU default): a resize may still grow to what fits.
        let mut inp = card();
        inp.cache_slots_override = Some(0);
        let p = plan_memory(&inp);
        assert_eq!((p.cache_slots, p.max_cache_slots), (0, auto.cache_slots));
        // An override past the budget (but within the device) stays allowed at its size.
        inp.cache_slots_override = Some(auto.cache_slots + 10);
        assert_eq!(plan_memory(&inp).max_cache_slots, auto.cache_slots + 10);
        // A device of unknown size: only the model bounds it (allocation failures roll back).
        inp.device_total = 0;
        inp.cache_slots_override = None;
        inp.budget = VramBudget::Bytes(8 * GIB);
        let p = plan_memory(&inp);
        assert!(p.fits && p.cache_slots < 100, "{p:?}");
        assert_eq!(p.max_cache_slots, 128 * 48);
    }

    #[test]
    fn slots_are_capped_at_the_model() {
        let mut inp = card();
        inp.moe_layers = 2;
        let p = plan_memory(&inp);
        assert_eq!(p.cache_slots, 256);
        assert!(p.notes.iter().any(|n| n.contains("every routed expert")));
    }

    #[test]
    fn non_expert_weights_over_budget_do_not_fit() {
        let mut inp = card();
        inp.budget = VramBudget::Bytes(4 * GIB);
        inp.non_expert_bytes = 5 * GIB;
        let p = plan_memory(&inp);
        assert!(!p.fits);
        let msg = p.error.unwrap();
        assert!(
            msg.contains("non-expert weights (5.00 GiB)") && msg.contains("exceed"),
            "{msg}"
        );
        assert_eq!((p.cache_slots, p.stream_buffers_bytes), (0, 0));
    }

    #[test]
    fn explicit_budget_is_capped_at_free_memory() {
        let mut inp = card();
        inp.budget = VramBudget::Bytes(100 * GIB);
        let p = plan_memory(&inp);
        assert_eq!(p.budget_bytes, 23 * GIB);
        assert!(p.warnings.iter().any(|w| w.contains("exceeds")));
        inp.budget = VramBudget::Bytes(10 * GIB);
        assert_eq!(plan_memory(&inp).budget_bytes, 10 * GIB);
    }

    #[test]
    fn streaming_buffers_that_do_not_fit_turn_streaming_off() {
        let mut inp = card();
        inp.budget = VramBudget::Bytes(2 * GIB + 3 * GIB + 512 * MIB + 1500 * MIB);
        let p = plan_memory(&inp);
        assert!(p.fits && !p.streaming_prefill);
        assert_eq!(p.stream_buffers_bytes, 0);
        assert!(p
            .warnings
            .iter()
            .any(|w| w.contains("streaming prefill disabled")));
        assert_eq!(p.cache_slots, 1500 / 9);
        inp.streaming_prefill = false;
        let p = plan_memory(&inp);
        assert!(p.warnings.is_empty() && !p.streaming_prefill);
    }

    #[test]
    fn slot_override_is_honoured_within_the_device() {
        let mut inp = card();
        inp.cache_slots_override = Some(100);
        let p = plan_memory(&inp);
        assert_eq!(
            (p.cache_slots, p.cache_bytes, p.fits),
            (100, 900 * MIB, true)
        );

        inp.cache_slots_override = Some(1_000_000);
        let p = plan_memory(&inp);
        assert_eq!(p.cache_slots, 128 * 48);
        assert!(!p.fits, "6144 × 9 MiB cannot fit in 23 GiB free");
        assert!(p.error.unwrap().contains("--expert-cache-slots"));

        // Above the auto budget but within free memory: allowed with a warning.
        let auto = plan_memory(&card()).cache_slots;
        inp.cache_slots_override = Some(auto + 50);
        let p = plan_memory(&inp);
        assert!(p.fits && p.cache_slots == auto + 50);
        assert!(p.warnings.iter().any(|w| w.contains("exceeds")));
    }

    #[test]
    fn zero_cache_and_unknown_device() {
        let mut inp = card();
        inp.budget = VramBudget::Bytes(2 * GIB + 3 * GIB + 512 * MIB + 4 * MIB);
        inp.streaming_prefill = false;
        // Auto keeps a quarter of what is left for experts, shortening the context...
        let p = plan_memory(&inp);
        assert!(p.fits && p.cache_slots > 0 && p.kv_context < 32768);
        assert!(p.warnings.iter().any(|w| w.contains("context limited")));
        // ...an explicit pool takes what it is given.
        inp.kv.pool = Some(3 * GIB);
        let p = plan_memory(&inp);
        assert!(p.fits && p.cache_slots == 0 && p.kv_context == 32768);
        assert!(p.warnings.iter().any(|w| w.contains("run on the CPU")));

        let mut inp = card();
        inp.device_free = 0;
        inp.device_total = 0;
        let p = plan_memory(&inp);
        assert!(!p.fits && p.budget_bytes == 0);
        inp.budget = VramBudget::Bytes(40 * GIB);
        let p = plan_memory(&inp);
        assert!(p.fits && p.budget_bytes == 40 * GIB);
    }

    #[test]
    fn saturating_kv_does_not_panic() {
        let mut inp = card();
        inp.kv = KvReserve {
            bytes_per_token: u64::MAX,
            context: u64::MAX,
            sequences: 2,
            pool: None,
        };
        let p = plan_memory(&inp);
        assert!(!p.fits);
        inp = card();
        inp.expert_bytes = 0;
        inp.experts_per_layer = 0;
        let p = plan_memory(&inp);
        assert!(p.fits && p.cache_slots == 0);
    }
}
