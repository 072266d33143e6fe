//! The KV pool: how much device memory the per-token caches of all sequences share, and which
//! sequences run, wait or are preempted when it fills.
//!
//! A worst-case reservation (`context × max_active`) is what made the shipped configurations
//! refuse to start: four agents at 64k tokens each is more KV than a 24 GB card holds, yet
//! they rarely all run long at once. So the pool is sized for what a device can spare, the
//! sequences' caches grow inside it as tokens arrive, and when the next step would overflow
//! it the youngest running sequence is preempted: its state is saved to the prefix store (host
//! memory when the device copy does not fit) and dropped, and it is rebuilt from its tokens
//! once room returns. Its output is the same as if it had never stopped.

use super::budget::{format_bytes, KvReserve};

/// Fewest tokens a sequence may hold; a pool smaller than this is an error, not a plan.
pub const MIN_KV_TOKENS: u64 = 1024;
/// Share of the memory left after the fixed needs that `auto` gives the pool, when that is
/// more than one full-context sequence needs (several sequences share it).
pub const KV_AUTO_FRACTION: f64 = 0.25;
/// Most of that memory `auto` gives the pool: the expert cache keeps the rest even when one
/// full-context sequence would need more (the context is then shortened, with a warning).
pub const KV_MAX_FRACTION: f64 = 0.75;

/// The pool's size and the longest sequence it allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvPoolPlan {
    /// Bytes of the pool.
    pub bytes: u64,
    /// Tokens one sequence may hold (the configured context, or less when the pool is smaller).
    pub context: u64,
    /// How the size was chosen (for `ft-actor info`).
    pub note: String,
    /// Set when the context had to be shortened.
    pub warning: Option<String>,
}

/// Sizes the pool within `room`, the device memory left after weights and scratch (`None`:
/// unknown or not a device limit, e.g. the CPU backend's host memory). An explicit
/// `kv.pool` is used as given; `auto` takes the worst case when it fits in
/// [`KV_AUTO_FRACTION`] of `room`, at least one full-context sequence, and at most
/// [`KV_MAX_FRACTION`] of `room`.
pub fn size_kv_pool(kv: &KvReserve, room: Option<u64>) -> Result<KvPoolPlan, String> {
    if kv.bytes_per_token == 0 {
        // Only fixed-size (recurrent) state: nothing grows with the context.
        return Ok(KvPoolPlan { bytes: 0, context: kv.context, note: "no per-token cache".into(), warning: None });
    }
    let bpt = kv.bytes_per_token;
    let worst = kv.bytes();
    let one = bpt.saturating_mul(kv.context);
    let f = format_bytes;
    let (bytes, note) = match (kv.pool, room) {
        (Some(p), Some(r)) if p > r => {
            return Err(format!("kv_budget {} exceeds the {} of device memory left after the weights and scratch", f(p), f(r)))
        }
        (Some(p), _) => (p.min(worst), format!("KV pool {} (kv_budget)", f(p.min(worst)))),
        (None, None) => (worst, format!("KV pool {}: {} tokens × {} sequences", f(worst), kv.context, kv.sequences)),
        (None, Some(r)) => {
            let share = (r as f64 * KV_AUTO_FRACTION) as u64;
            let most = (r as f64 * KV_MAX_FRACTION) as u64;
            let b = worst.min(share.max(one)).min(most);
            (b, format!("KV pool {} of the {} left after weights and scratch (auto)", f(b), f(r)))
        }
    };
    let context = (bytes / bpt).min(kv.context);
    if context < MIN_KV_TOKENS.min(kv.context) {
        return Err(format!(
            "the KV pool ({}) holds {context} tokens, fewer than the {} a sequence needs at least; \
             raise --vram-budget or kv_budget, or use --backend cpu",
            f(bytes),
            MIN_KV_TOKENS.min(kv.context)
        ));
    }
    let warning = (context < kv.context).then(|| {
        format!(
            "context limited to {context} tokens (ctx_size {}): that is what the KV pool of {} holds; \
             set kv_budget, lower the expert cache or raise --vram-budget for more",
            kv.context,
            f(bytes)
        )
    });
    Ok(KvPoolPlan { bytes, context, note, warning })
}

/// Rows a per-token cache has after it grows to hold `tokens` (from `allocated` rows, at
/// most `capacity`): at least twice what it had, as `SequenceState::reserve` grows.
pub fn rows_after(allocated: usize, tokens: usize, capacity: usize) -> usize {
    if tokens <= allocated {
        allocated
    } else {
        tokens.max(allocated * 2).min(capacity)
    }
}

/// One sequence of a step, oldest first, as the pool sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvUse {
    /// Bytes it holds after this step if it runs (a waiting one: after it is rebuilt whole).
    pub need: u64,
    /// Whether it is waiting (never started, or preempted) and holds no cache.
    pub waiting: bool,
}

/// What a step does to fit the pool.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KvDecision {
    /// Per sequence: whether it runs this step.
    pub runs: Vec<bool>,
    /// Running sequences to preempt (youngest first).
    pub preempt: Vec<usize>,
    /// Waiting sequences to (re)start.
    pub resume: Vec<usize>,
}

/// Decides which sequences of a step run within `budget` bytes (`seqs` oldest first).
///
/// Running sequences are kept, youngest preempted first, until their needs fit; one alone
/// always runs (the context limit keeps it inside the pool). Waiting sequences then start
/// oldest first while their whole need fits, and none starts before an older one: a long
/// prompt is not overtaken forever by short ones.
pub fn plan_kv(budget: u64, seqs: &[KvUse]) -> KvDecision {
    let mut runs: Vec<bool> = seqs.iter().map(|s| !s.waiting).collect();
    let mut total: u64 = seqs.iter().filter(|s| !s.waiting).map(|s| s.need).sum();
    let mut running = runs.iter().filter(|r| **r).count();
    let mut preempt = Vec::new();
    for i in (0..seqs.len()).rev() {
        if total <= budget || running <= 1 {
            break;
        }
        if runs[i] {
            runs[i] = false;
            running -= 1;
            total -= seqs[i].need;
            preempt.push(i);
        }
    }
    let mut resume = Vec::new();
    // A sequence preempted now waits for a later step.
    for (i, s) in seqs.iter().enumerate().filter(|(_, s)| s.waiting) {
        let alone = total == 0;
        if total.saturating_add(s.need) > budget && !alone {
            break;
        }
        runs[i] = true;
        total = total.saturating_add(s.need);
        resume.push(i);
    }
    KvDecision { runs, preempt, resume }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    fn kv(context: u64, sequences: u64, pool: Option<u64>) -> KvReserve {
        KvReserve { bytes_per_token: 96 * 1024, context, sequences, pool }
    }

    #[test]
    fn auto_takes_the_worst_case_when_it_is_small() {
        let p = size_kv_pool(&kv(4096, 2, None), Some(20 * GIB)).unwrap();
        assert_eq!(p.bytes, 96 * 1024 * 4096 * 2);
        assert_eq!(p.context, 4096);
        assert!(p.warning.is_none());
    }

    #[test]
    fn auto_gives_at_least_one_full_context_and_shares_the_rest() {
        // 64k × 4 × 96 KiB = 24 GiB worst case; one sequence 6 GiB; a quarter of 18 GiB is 4.5.
        let p = size_kv_pool(&kv(65536, 4, None), Some(18 * GIB)).unwrap();
        assert_eq!(p.bytes, 6 * GIB);
        assert_eq!(p.context, 65536);
        // With 40 GiB left a quarter (10 GiB) is more than one sequence needs.
        let p = size_kv_pool(&kv(65536, 4, None), Some(40 * GIB)).unwrap();
        assert_eq!(p.bytes, 10 * GIB);
    }

    #[test]
    fn auto_shortens_the_context_rather_than_starve_the_experts() {
        let p = size_kv_pool(&kv(65536, 1, None), Some(4 * GIB)).unwrap();
        assert_eq!(p.bytes, 3 * GIB);
        assert_eq!(p.context, 3 * GIB / (96 * 1024));
        assert!(p.warning.unwrap().contains("context limited to 32768 tokens"));
    }

    #[test]
    fn too_small_a_pool_is_an_error() {
        let e = size_kv_pool(&kv(65536, 1, None), Some(100 * MIB)).unwrap_err();
        assert!(e.contains("fewer than the 1024"), "{e}");
        let e = size_kv_pool(&kv(65536, 1, Some(2 * GIB)), Some(GIB)).unwrap_err();
        assert!(e.contains("kv_budget"), "{e}");
    }

    #[test]
    fn an_explicit_pool_is_kept_and_unknown_room_takes_the_worst_case() {
        let p = size_kv_pool(&kv(65536, 4, Some(GIB)), Some(10 * GIB)).unwrap();
        assert_eq!((p.bytes, p.context), (GIB, GIB / (96 * 1024)));
        let p = size_kv_pool(&kv(8192, 4, None), None).unwrap();
        assert_eq!(p.bytes, 96 * 1024 * 8192 * 4);
    }

    #[test]
    fn rows_double_within_capacity() {
        assert_eq!(rows_after(256, 100, 1000), 256);
        assert_eq!(rows_after(256, 257, 1000), 512);
        assert_eq!(rows_after(256, 700, 1000), 700);
        assert_eq!(rows_after(512, 600, 700), 700);
        assert_eq!(rows_after(1, 300, 4096), 300);
    }

    fn run(need: u64) -> KvUse {
        KvUse { need, waiting: false }
    }
    fn wait(need: u64) -> KvUse {
        KvUse { need, waiting: true }
    }

    #[test]
    fn everything_runs_when_it_fits() {
        let d = plan_kv(100, &[run(20), run(20), wait(30)]);
        assert_eq!(d.runs, vec![true, true, true]);
        assert!(d.preempt.is_empty());
        assert_eq!(d.resume, vec![2]);
    }

    #[test]
    fn the_youngest_running_sequence_is_preempted() {
        let d = plan_kv(100, &[run(50), run(40), run(30)]);
        assert_eq!(d.runs, vec![true, true, false]);
        assert_eq!(d.preempt, vec![2]);
        let d = plan_kv(60, &[run(50), run(40), run(30)]);
        assert_eq!(d.preempt, vec![2, 1]);
        // One alone always runs.
        let d = plan_kv(10, &[run(50), run(40)]);
        assert_eq!(d.runs, vec![true, false]);
    }

    #[test]
    fn waiting_sequences_start_oldest_first_when_room_returns() {
        let d = plan_kv(100, &[run(40), wait(70), wait(10)]);
        assert_eq!(d.runs, vec![true, false, false], "the younger one waits behind the older");
        assert!(d.resume.is_empty());
        let d = plan_kv(100, &[run(40), wait(50), wait(10)]);
        assert_eq!(d.resume, vec![1, 2]);
        // With nothing running, the oldest starts even if it needs more than the pool.
        let d = plan_kv(100, &[wait(150), wait(10)]);
        assert_eq!(d.runs, vec![true, false]);
    }
}
