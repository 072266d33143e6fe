//! The decode miss split: of `m` uncached experts, fetch `q` over PCIe, run `m − q` on the CPU.
//!
//! Both branches run concurrently, so a step's MoE work finishes when the later branch does.
//! Fetching costs `q · s / B_P` (plus device compute of what arrives); computing on the CPU
//! costs `(m − q) · s / B_H`, because a decode-time expert is memory-bound: the CPU must stream
//! its weights once. Equalising the two linear terms gives the continuous optimum
//! `q* = m · B_P / (B_P + B_H)` ([`q_star`]). The engine needs an integer, and real branches
//! carry fixed costs (a copy launch and event wait, a thread-pool dispatch and join) that make
//! the ends `q = 0` and `q = m` special, so [`choose_q`] minimises the exact integer cost
//! instead of rounding the formula. Ties go to the smaller `q`: fewer fetches means fewer
//! evictions of experts that later tokens may want.
//!
//! Which misses to fetch is a separate choice ([`select_fetches`]): a fetched expert stays in
//! the cache, so it should be one likely to be used again. The `--moe` modes that override the
//! split live in [`super::mode`].

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::cache::ExpertKey;

/// Relative tolerance below which two finishing times count as a tie (float noise must not
/// decide between two equally good splits).
const REL_TIE: f64 = 1e-12;

/// Measured rates and overheads that price one decode step's misses.
///
/// Bandwidths that are zero, negative or NaN make their branch unusable (infinite cost);
/// negative or NaN overheads count as zero.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct SplitCosts {
    /// Bytes of one expert's weights (`s`).
    pub expert_bytes: u64,
    /// Host→device copy bandwidth, bytes/s (`B_P`).
    pub b_p: f64,
    /// Rate at which the CPU executors stream expert weights, bytes/s (`B_H`).
    pub b_h: f64,
    /// Paid once per step when anything is fetched (copy launch, event wait).
    pub transfer_latency_s: f64,
    /// Paid once per step when anything runs on the CPU (dispatch, join, partial-output copy).
    pub cpu_job_latency_s: f64,
    /// Device compute time per fetched expert, after its copy lands.
    pub device_s_per_expert: f64,
}

impl SplitCosts {
    /// Costs with no fixed overheads: the setting in which `q*` is exact.
    pub fn new(expert_bytes: u64, b_p: f64, b_h: f64) -> SplitCosts {
        SplitCosts {
            expert_bytes,
            b_p,
            b_h,
            ..SplitCosts::default()
        }
    }
}

/// The two branches reduced to fixed and per-expert seconds, which is all the split needs.
///
/// The planner builds this directly (prefill experts see many rows, so their per-expert costs
/// are not just bytes over bandwidth). All fields are seconds.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct BranchCosts {
    /// Device time spent whatever `q` is (e.g. computing the hits); serialised before fetches.
    pub device_busy_s: f64,
    /// Added once to the device branch when `q > 0`.
    pub device_fixed_s: f64,
    /// Device branch cost per fetched expert (copy plus compute).
    pub device_per_expert_s: f64,
    /// Added once to the CPU branch when `m − q > 0`.
    pub cpu_fixed_s: f64,
    /// CPU branch cost per expert.
    pub cpu_per_expert_s: f64,
}

/// Seconds to move `bytes` at `rate`; an unusable rate is infinitely slow.
fn per_expert(bytes: u64, rate: f64) -> f64 {
    if rate.is_nan() || rate <= 0.0 {
        f64::INFINITY
    } else {
        bytes as f64 / rate
    }
}

/// Overheads are only ever added, so a nonsensical one is ignored rather than rewarded.
fn overhead(x: f64) -> f64 {
    if x.is_nan() || x < 0.0 {
        0.0
    } else {
        x
    }
}

impl From<&SplitCosts> for BranchCosts {
    fn from(c: &SplitCosts) -> BranchCosts {
        BranchCosts {
            device_busy_s: 0.0,
            device_fixed_s: overhead(c.transfer_latency_s),
            device_per_expert_s: per_expert(c.expert_bytes, c.b_p)
                + overhead(c.device_s_per_expert),
            cpu_fixed_s: overhead(c.cpu_job_latency_s),
            cpu_per_expert_s: per_expert(c.expert_bytes, c.b_h),
        }
    }
}

impl BranchCosts {
    fn sanitised(&self) -> BranchCosts {
        let per = |x: f64| {
            if x.is_nan() {
                f64::INFINITY
            } else {
                x.max(0.0)
            }
        };
        BranchCosts {
            device_busy_s: overhead(self.device_busy_s),
            device_fixed_s: overhead(self.device_fixed_s),
            device_per_expert_s: per(self.device_per_expert_s),
            cpu_fixed_s: overhead(self.cpu_fixed_s),
            cpu_per_expert_s: per(self.cpu_per_expert_s),
        }
    }

    /// Device branch time when `q` experts are fetched.
    pub fn device_time(&self, q: usize) -> f64 {
        // Guarded so that 0 × ∞ (an unusable branch given no work) is 0, not NaN.
        let fetch = if q == 0 {
            0.0
        } else {
            self.device_fixed_s + q as f64 * self.device_per_expert_s
        };
        self.device_busy_s + fetch
    }

    /// CPU branch time for `n` experts.
    pub fn cpu_time(&self, n: usize) -> f64 {
        if n == 0 {
            0.0
        } else {
            self.cpu_fixed_s + n as f64 * self.cpu_per_expert_s
        }
    }

    /// When the step's expert work is done: the later of the two concurrent branches.
    pub fn finish_time(&self, m: usize, q: usize) -> f64 {
        let q = q.min(m);
        self.device_time(q).max(self.cpu_time(m - q))
    }
}

/// The continuous optimum `m · B_P / (B_P + B_H)` with no overheads; NaN-free (0 when both
/// bandwidths are unusable, `m` when only the CPU is).
pub fn q_star(m: usize, b_p: f64, b_h: f64) -> f64 {
    let usable = |b: f64| if b.is_nan() || b <= 0.0 { 0.0 } else { b };
    let (bp, bh) = (usable(b_p), usable(b_h));
    if bp == 0.0 {
        0.0
    } else if bh == 0.0 || (bp.is_infinite() && bh.is_finite()) {
        m as f64
    } else if bh.is_infinite() {
        0.0
    } else {
        m as f64 * bp / (bp + bh)
    }
}

/// The integer `q` in `0..=m` that minimises the finishing time of the later branch; ties go
/// to the smaller `q`.
pub fn choose_q(m: usize, costs: &SplitCosts) -> usize {
    choose_q_branches(m, m, &BranchCosts::from(costs))
}

/// [`choose_q`] with at most `max_fetch` fetches (free plus evictable cache slots).
pub fn choose_q_capped(m: usize, max_fetch: usize, costs: &SplitCosts) -> usize {
    choose_q_branches(m, max_fetch, &BranchCosts::from(costs))
}

/// The split on reduced branch costs, at most `max_fetch` fetches.
///
/// O(1): the later-branch time is the max of a non-decreasing and a non-increasing function of
/// `q`, hence quasi-convex, so its smallest minimiser is one of the ends, their neighbours
/// (where the fixed costs switch on) or the two integers around the crossing of the two lines.
/// If every option is infinitely slow (a branch is unusable and the other cannot take all the
/// work), fetch as many as allowed when copies are possible at all, since the device is then
/// the only finite path for those experts.
pub fn choose_q_branches(m: usize, max_fetch: usize, costs: &BranchCosts) -> usize {
    let c = costs.sanitised();
    let cap = max_fetch.min(m);
    let mut cands = vec![0, 1.min(cap), cap.saturating_sub(1), cap];
    // Crossing of busy + fixed + q·a and cpu_fixed + (m − q)·b.
    let x = (c.cpu_fixed_s + m as f64 * c.cpu_per_expert_s - c.device_busy_s - c.device_fixed_s)
        / (c.device_per_expert_s + c.cpu_per_expert_s);
    if x.is_finite() {
        let x = x.clamp(0.0, cap as f64);
        // In range after the clamp, so the casts are exact.
        cands.push(x.floor() as usize);
        cands.push(x.ceil() as usize);
    }
    cands.sort_unstable();
    cands.dedup();
    let mut best = (0, f64::INFINITY);
    for q in cands {
        let t = c.finish_time(m, q);
        if clearly_less(t, best.1) {
            best = (q, t);
        }
    }
    if best.1.is_infinite() {
        return if c.device_per_expert_s.is_finite() {
            cap
        } else {
            0
        };
    }
    best.0
}

fn clearly_less(t: f64, best: f64) -> bool {
    if best.is_infinite() {
        t < best
    } else {
        t < best - best.abs() * REL_TIE
    }
}

/// Which misses go where.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SplitAssignment {
    /// Experts to fetch into the cache, most valuable first (fetch in this order).
    pub fetch: Vec<ExpertKey>,
    /// Experts to compute on the CPU from host memory.
    pub cpu: Vec<ExpertKey>,
}

/// Picks which `q` of the misses to fetch: the ones used most recently often, since a fetched
/// expert is cached and pays off again only if reused; ties go to the lower key so the choice is
/// deterministic. Duplicate misses are merged; `q` larger than the misses fetches them all.
pub fn select_fetches<F>(misses: &[ExpertKey], q: usize, popularity: F) -> SplitAssignment
where
    F: Fn(&ExpertKey) -> u64,
{
    let mut ranked: Vec<(u64, ExpertKey)> = misses.iter().map(|k| (popularity(k), *k)).collect();
    ranked.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    ranked.dedup_by(|a, b| a.1 == b.1);
    let q = q.min(ranked.len());
    let cpu = ranked.split_off(q).into_iter().map(|(_, k)| k).collect();
    SplitAssignment {
        fetch: ranked.into_iter().map(|(_, k)| k).collect(),
        cpu,
    }
}

/// Recent routing counts per expert, the popularity signal for [`select_fetches`].
///
/// Counts halve every `half_life_steps` steps so that the signal follows the current
/// conversation instead of the whole uptime.
#[derive(Debug, Clone, Default)]
pub struct UsageTracker {
    counts: HashMap<ExpertKey, u64>,
    half_life_steps: u64,
    steps: u64,
}

impl UsageTracker {
    /// A tracker whose counts halve every `half_life_steps` (0 = never decay).
    pub fn new(half_life_steps: u64) -> UsageTracker {
        UsageTracker {
            counts: HashMap::new(),
            half_life_steps,
            steps: 0,
        }
    }

    /// Counts one routing of each key (call with all experts a step routed to, hits included).
    pub fn record<I: IntoIterator<Item = ExpertKey>>(&mut self, keys: I) {
        for k in keys {
            let c = self.counts.entry(k).or_insert(0);
            *c = c.saturating_add(1);
        }
    }

    /// Marks the end of a step, applying decay when due.
    pub fn end_step(&mut self) {
        self.steps += 1;
        if self.steps.checked_rem(self.half_life_steps) == Some(0) {
            self.counts.retain(|_, c| {
                *c /= 2;
                *c > 0
            });
        }
    }

    /// Current count for `key`.
    pub fn count(&self, key: &ExpertKey) -> u64 {
        self.counts.get(key).copied().unwrap_or(0)
    }

    /// Number of experts with a non-zero count.
    pub fn tracked(&self) -> usize {
        self.counts.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GB: f64 = 1e9;

    fn brute(m: usize, cap: usize, c: &BranchCosts) -> usize {
        let c = c.sanitised();
        let mut best = (0, f64::INFINITY);
        for q in 0..=cap.min(m) {
            let t = c.finish_time(m, q);
            if clearly_less(t, best.1) {
                best = (q, t);
            }
        }
        if best.1.is_infinite() {
            return if c.device_per_expert_s.is_finite() {
                cap.min(m)
            } else {
                0
            };
        }
        best.0
    }

    #[test]
    fn matches_q_star_without_overheads() {
        let s = 20_000_000;
        for (m, bp, bh) in [
            (8, 25.0, 25.0),
            (8, 25.0, 75.0),
            (16, 30.0, 10.0),
            (100, 12.0, 50.0),
        ] {
            let c = SplitCosts::new(s, bp * GB, bh * GB);
            let q = choose_q(m, &c);
            let qs = q_star(m, bp * GB, bh * GB);
            assert!((q as f64 - qs).abs() < 1.0, "m={m} q={q} q*={qs}");
            // And it is the better of floor/ceil of q*.
            let bc = BranchCosts::from(&c);
            let lo = qs.floor() as usize;
            let best = lo.min(m);
            let alt = (lo + 1).min(m);
            assert!(bc.finish_time(m, q) <= bc.finish_time(m, best).min(bc.finish_time(m, alt)));
        }
    }

    #[test]
    fn exact_q_star_when_integral() {
        // m = 8, B_P : B_H = 1 : 3 → q* = 2 exactly.
        assert_eq!(
            choose_q(8, &SplitCosts::new(1 << 20, 10.0 * GB, 30.0 * GB)),
            2
        );
        assert_eq!(q_star(8, 10.0, 30.0), 2.0);
    }

    #[test]
    fn ties_choose_the_smaller_q() {
        // m = 3, equal bandwidths: q = 1 and q = 2 both finish at 2 s/B.
        let c = SplitCosts::new(1_000_000, 1e9, 1e9);
        assert_eq!(choose_q(3, &c), 1);
        // No misses: nothing to do.
        assert_eq!(choose_q(0, &c), 0);
    }

    #[test]
    fn one_sided_bandwidths() {
        let s = 10_000_000;
        assert_eq!(choose_q(8, &SplitCosts::new(s, 25.0 * GB, 0.0)), 8);
        assert_eq!(choose_q(8, &SplitCosts::new(s, 25.0 * GB, 1.0)), 8);
        assert_eq!(choose_q(8, &SplitCosts::new(s, 0.0, 50.0 * GB)), 0);
        assert_eq!(choose_q(8, &SplitCosts::new(s, 1.0, 50.0 * GB)), 0);
        assert_eq!(choose_q(8, &SplitCosts::new(s, f64::NAN, 50.0 * GB)), 0);
        assert_eq!(choose_q(8, &SplitCosts::new(s, 0.0, 0.0)), 0);
        assert_eq!(q_star(8, 0.0, 0.0), 0.0);
        assert_eq!(q_star(8, 5.0, 0.0), 8.0);
        assert_eq!(q_star(8, f64::INFINITY, 5.0), 8.0);
    }

    #[test]
    fn pcie_much_slower_than_cpu_gives_about_m_bp_over_bh() {
        // B_P ≪ B_H: q* ≈ m·B_P/B_H = 1.96, but the integer q = 1 finishes first
        // (0.99 s/GB on the CPU vs 1.0 s/GB over PCIe for q = 2).
        let c = SplitCosts::new(1 << 24, 2.0 * GB, 100.0 * GB);
        assert!((q_star(100, 2.0, 100.0) - 200.0 / 102.0).abs() < 1e-12);
        assert_eq!(choose_q(100, &c), 1);
    }

    #[test]
    fn fixed_cpu_overhead_pushes_small_work_to_the_device() {
        let mut c = SplitCosts::new(10_000_000, 20.0 * GB, 20.0 * GB);
        assert_eq!(choose_q(2, &c), 1);
        c.cpu_job_latency_s = 1e-3; // 1 ms dispatch dwarfs a 0.5 ms expert
        assert_eq!(choose_q(2, &c), 2);
        let mut c = SplitCosts::new(10_000_000, 20.0 * GB, 20.0 * GB);
        c.transfer_latency_s = 1e-3;
        assert_eq!(choose_q(2, &c), 0);
        c.device_s_per_expert = -5.0; // nonsense is ignored, not rewarded
        assert_eq!(choose_q(2, &c), 0);
    }

    #[test]
    fn cap_limits_fetches() {
        let c = SplitCosts::new(1 << 20, 50.0 * GB, 1.0 * GB);
        assert_eq!(choose_q(8, &c), 8);
        assert_eq!(choose_q_capped(8, 3, &c), 3);
        assert_eq!(choose_q_capped(8, 0, &c), 0);
        // CPU unusable and the cache cannot take everything: fetch as many as possible.
        assert_eq!(choose_q_capped(8, 3, &SplitCosts::new(1 << 20, GB, 0.0)), 3);
    }

    #[test]
    fn closed_form_matches_brute_force() {
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut pick = |zero_odds: u64, scale: f64| {
            let r = next();
            if r % zero_odds == 0 {
                0.0
            } else {
                (r >> 11) as f64 / (1u64 << 53) as f64 * scale
            }
        };
        for i in 0..20_000 {
            let c = BranchCosts {
                device_busy_s: pick(2, 5.0),
                device_fixed_s: pick(3, 3.0),
                device_per_expert_s: if i % 97 == 0 {
                    f64::INFINITY
                } else {
                    pick(9, 2.0)
                },
                cpu_fixed_s: pick(3, 3.0),
                cpu_per_expert_s: if i % 89 == 0 {
                    f64::INFINITY
                } else {
                    pick(9, 2.0)
                },
            };
            let m = (i % 40) as usize;
            let cap = if i % 3 == 0 { m } else { (i / 7 % 45) as usize };
            assert_eq!(
                choose_q_branches(m, cap, &c),
                brute(m, cap, &c),
                "m={m} cap={cap} {c:?}"
            );
        }
    }

    #[test]
    fn select_prefers_popular_then_lower_key() {
        let a = ExpertKey::new(0, 5);
        let b = ExpertKey::new(0, 2);
        let c = ExpertKey::new(1, 0);
        let d = ExpertKey::new(0, 9);
        let pop = |k: &ExpertKey| match k.expert {
            5 => 10,
            9 => 10,
            _ => 1,
        };
        let s = select_fetches(&[a, b, c, d], 2, pop);
        assert_eq!(s.fetch, vec![a, d]);
        assert_eq!(s.cpu, vec![b, c]);
        let s = select_fetches(&[a, b, c, d], 0, pop);
        assert!(s.fetch.is_empty());
        assert_eq!(s.cpu.len(), 4);
        let s = select_fetches(&[a, a, b], 10, pop);
        assert_eq!(s.fetch, vec![a, b]);
        assert!(s.cpu.is_empty());
        assert_eq!(select_fetches(&[], 3, pop), SplitAssignment::default());
    }

    #[test]
    fn usage_tracker_counts_and_decays() {
        let a = ExpertKey::new(0, 1);
        let b = ExpertKey::new(0, 2);
        let mut t = UsageTracker::new(2);
        t.record([a, a, a, b]);
        assert_eq!((t.count(&a), t.count(&b)), (3, 1));
        t.end_step();
        assert_eq!(t.count(&a), 3);
        t.end_step();
        assert_eq!((t.count(&a), t.count(&b), t.tracked()), (1, 0, 1));
        let s = select_fetches(&[b, a], 1, |k| t.count(k));
        assert_eq!(s.fetch, vec![a]);
        let mut never = UsageTracker::new(0);
        never.record([a]);
        never.end_step();
        assert_eq!(never.count(&a), 1);
    }
}
