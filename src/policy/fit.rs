//! `ft-actor plan`'s decode prediction: seconds per token from the bytes a token reads, the
//! rates they stream at, and — with a GPU — how many routed experts hit the cache.
//!
//! Per MoE layer a token routes to `k` experts. Hits are computed on the device from its
//! memory; each of the `m = k·(1 − h)` misses is fetched over the link (`B_P`) or computed by
//! the CPU executors (`B_H`), split as the engine splits them ([`choose_q`](super::choose_q)),
//! both branches running at once. Non-expert weights stream on the device (a GPU) or with the
//! experts (CPU only). The hit rate `h` at a given number of slots comes from
//! [`simulate_hit_rate`]: an LRU cache driven by a synthetic routing trace.

use super::split::{choose_q_branches, BranchCosts};
use super::mode::ResolvedMode;
use serde::Serialize;

/// What one decoded token reads, in bytes, and at what rate each part streams.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TokenReads {
    /// Non-expert bytes read per token, with the rate (bytes/s) the CPU streams each part at.
    pub dense: Vec<(u64, f64)>,
    /// Routed-expert bytes read per token on the CPU, with their CPU rates.
    pub experts: Vec<(u64, f64)>,
    /// Bytes of one routed expert.
    pub expert_bytes: u64,
    /// Routed experts per token per MoE layer.
    pub top_k: usize,
    /// MoE layers.
    pub moe_layers: usize,
    /// KV cache bytes read per token at the context predicted for.
    pub kv_bytes: u64,
}

/// A GPU's rates.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct GpuRates {
    /// Device memory bandwidth, bytes/s.
    pub memory: f64,
    /// Host→device copy bandwidth, bytes/s (`B_P`).
    pub link: f64,
}

/// A predicted decode speed for one MoE mode.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Prediction {
    /// `cpu`, `offload` or `hybrid`.
    pub mode: String,
    /// Tokens per second.
    pub tokens_per_s: f64,
    /// Expert cache hit rate used (0 without a cache).
    pub hit_rate: f64,
    /// Misses fetched per MoE layer (of `m`), for the hybrid split.
    pub fetched_per_layer: f64,
    /// Seconds per token by part: non-expert weights, expert hits, misses, KV.
    pub breakdown: Breakdown,
}

/// Seconds per token by part.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct Breakdown {
    /// Non-expert weights.
    pub dense_s: f64,
    /// Routed experts computed where they are (CPU mode: all; GPU: cache hits).
    pub experts_s: f64,
    /// Misses (fetch and CPU branches, the later of the two).
    pub misses_s: f64,
    /// KV cache reads.
    pub kv_s: f64,
}

fn secs(parts: &[(u64, f64)]) -> f64 {
    parts.iter().map(|&(b, r)| if r > 0.0 { b as f64 / r } else { f64::INFINITY }).sum()
}

fn total_bytes(parts: &[(u64, f64)]) -> u64 {
    parts.iter().map(|p| p.0).sum()
}

/// CPU only: every byte streams through the CPU kernels.
pub fn predict_cpu(r: &TokenReads) -> Prediction {
    let dense_s = secs(&r.dense);
    let experts_s = secs(&r.experts);
    // KV is f16/f32 values read by the attention kernel at about the dense rate.
    let kv_rate = r.dense.first().map_or(0.0, |p| p.1);
    let kv_s = if r.kv_bytes == 0 { 0.0 } else { secs(&[(r.kv_bytes, kv_rate)]) };
    let breakdown = Breakdown { dense_s, experts_s, misses_s: 0.0, kv_s };
    Prediction { mode: "cpu".into(), tokens_per_s: 1.0 / (dense_s + experts_s + kv_s), hit_rate: 0.0, fetched_per_layer: 0.0, breakdown }
}

/// With a GPU holding the non-expert weights and `hit_rate` of the routed experts.
pub fn predict_gpu(r: &TokenReads, gpu: GpuRates, hit_rate: f64, mode: ResolvedMode) -> Prediction {
    let h = hit_rate.clamp(0.0, 1.0);
    let dense_s = total_bytes(&r.dense) as f64 / gpu.memory;
    let kv_s = r.kv_bytes as f64 / gpu.memory;
    let per_layer_hits = r.top_k as f64 * h;
    let experts_s = r.moe_layers as f64 * per_layer_hits * r.expert_bytes as f64 / gpu.memory;
    // Misses per layer, split as the engine splits an integer `m`; a fractional expected `m`
    // is priced by interpolating its two neighbours.
    let m = r.top_k as f64 * (1.0 - h);
    let cpu_rate = if r.experts.is_empty() { 0.0 } else { total_bytes(&r.experts) as f64 / secs(&r.experts) };
    let costs = BranchCosts {
        device_busy_s: 0.0,
        device_fixed_s: 0.0,
        device_per_expert_s: r.expert_bytes as f64 / gpu.link + r.expert_bytes as f64 / gpu.memory,
        cpu_fixed_s: 0.0,
        cpu_per_expert_s: if cpu_rate > 0.0 { r.expert_bytes as f64 / cpu_rate } else { f64::INFINITY },
    };
    let layer = |m: usize| -> (f64, f64) {
        let q = match mode {
            ResolvedMode::Offload => m,
            ResolvedMode::Cpu => 0,
            ResolvedMode::Hybrid => choose_q_branches(m, m, &costs),
        };
        (costs.finish_time(m, q), q as f64)
    };
    let (lo, hi) = (m.floor() as usize, m.ceil() as usize);
    let w = m - lo as f64;
    let ((t_lo, q_lo), (t_hi, q_hi)) = (layer(lo), layer(hi));
    let misses_s = r.moe_layers as f64 * ((1.0 - w) * t_lo + w * t_hi);
    let fetched = (1.0 - w) * q_lo + w * q_hi;
    let breakdown = Breakdown { dense_s, experts_s, misses_s, kv_s };
    Prediction { mode: mode.to_string(), tokens_per_s: 1.0 / (dense_s + experts_s + misses_s + kv_s), hit_rate: h, fetched_per_layer: fetched, breakdown }
}

/// The synthetic routing trace [`simulate_hit_rate`] replays.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct TraceShape {
    /// Zipf exponent of expert popularity within a layer (0: uniform).
    pub zipf: f64,
    /// Tokens replayed after the cache is warm.
    pub tokens: usize,
    /// Seed of the trace.
    pub seed: u64,
}

impl Default for TraceShape {
    /// Popularity skewed as trained routers are (a few experts take a large share), over
    /// enough tokens for a stable rate.
    fn default() -> TraceShape {
        TraceShape { zipf: 0.8, tokens: 4000, seed: 0x5eed }
    }
}

/// Hit rate of a per-layer LRU cache of `slots_per_layer` slots over `experts` experts with
/// `top_k` routed per token, on a synthetic trace. Exact at the ends (no slots: 0; all: 1).
pub fn simulate_hit_rate(experts: usize, top_k: usize, slots_per_layer: usize, trace: TraceShape) -> f64 {
    let k = top_k.min(experts);
    if experts == 0 || k == 0 || slots_per_layer == 0 {
        return 0.0;
    }
    if slots_per_layer >= experts {
        return 1.0;
    }
    let mut rng = trace.seed | 1;
    let mut next = move || {
        // xorshift64*: a fixed trace for a fixed seed, with no dependency.
        rng ^= rng >> 12;
        rng ^= rng << 25;
        rng ^= rng >> 27;
        (rng.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    };
    let weights: Vec<f64> = (0..experts).map(|i| 1.0 / ((i + 1) as f64).powf(trace.zipf)).collect();
    let total: f64 = weights.iter().sum();
    let mut cdf = Vec::with_capacity(experts);
    let mut acc = 0.0;
    for w in &weights {
        acc += w / total;
        cdf.push(acc);
    }
    // `last_use[e]`: the step an expert was last routed to; the cache holds the
    // `slots_per_layer` most recent (LRU).
    let mut last_use: Vec<Option<usize>> = vec![None; experts];
    let mut resident: Vec<usize> = Vec::new();
    let (mut hits, mut lookups) = (0usize, 0usize);
    let warm = experts * 4 / k.max(1);
    let mut chosen = Vec::with_capacity(k);
    for step in 0..warm + trace.tokens {
        chosen.clear();
        while chosen.len() < k {
            let u = next();
            let e = cdf.partition_point(|&c| c < u).min(experts - 1);
            if !chosen.contains(&e) {
                chosen.push(e);
            }
        }
        for &e in &chosen {
            let hit = resident.contains(&e);
            if step >= warm {
                lookups += 1;
                hits += hit as usize;
            }
            if !hit {
                if resident.len() >= slots_per_layer {
                    // Evict the least recently used resident not routed this step.
                    let victim = resident
                        .iter()
                        .enumerate()
                        .filter(|(_, r)| !chosen.contains(r))
                        .min_by_key(|(_, r)| last_use[**r])
                        .map(|(i, _)| i);
                    match victim {
                        Some(i) => {
                            resident.swap_remove(i);
                        }
                        None => continue,
                    }
                }
                resident.push(e);
            }
            last_use[e] = Some(step);
        }
    }
    hits as f64 / lookups.max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reads() -> TokenReads {
        TokenReads { dense: vec![(1_000_000_000, 20e9)], experts: vec![(1_000_000_000, 25e9)], expert_bytes: 10_000_000, top_k: 8, moe_layers: 12, kv_bytes: 0 }
    }

    #[test]
    fn cpu_time_is_bytes_over_rates() {
        let p = predict_cpu(&reads());
        assert!((p.breakdown.dense_s - 0.05).abs() < 1e-12 && (p.breakdown.experts_s - 0.04).abs() < 1e-12);
        assert!((p.tokens_per_s - 1.0 / 0.09).abs() < 1e-9);
    }

    #[test]
    fn gpu_modes_order_as_the_split_says() {
        let gpu = GpuRates { memory: 1000e9, link: 25e9 };
        let r = reads();
        let all_hits = predict_gpu(&r, gpu, 1.0, ResolvedMode::Hybrid);
        assert_eq!(all_hits.breakdown.misses_s, 0.0);
        let (off, cpu, hyb) =
            (predict_gpu(&r, gpu, 0.5, ResolvedMode::Offload), predict_gpu(&r, gpu, 0.5, ResolvedMode::Cpu), predict_gpu(&r, gpu, 0.5, ResolvedMode::Hybrid));
        // The split is never slower than either pure branch, and fetches some of the misses
        // when the link and the CPU are comparable.
        assert!(hyb.tokens_per_s >= off.tokens_per_s - 1e-9 && hyb.tokens_per_s >= cpu.tokens_per_s - 1e-9);
        assert!(hyb.fetched_per_layer > 0.0 && hyb.fetched_per_layer < 4.0, "{}", hyb.fetched_per_layer);
        assert!(all_hits.tokens_per_s > hyb.tokens_per_s);
    }

    #[test]
    fn hit_rate_grows_with_slots_and_is_exact_at_the_ends() {
        let t = TraceShape { tokens: 1500, ..TraceShape::default() };
        assert_eq!(simulate_hit_rate(64, 8, 0, t), 0.0);
        assert_eq!(simulate_hit_rate(64, 8, 64, t), 1.0);
        let rates: Vec<f64> = [8, 16, 32, 48].iter().map(|&s| simulate_hit_rate(64, 8, s, t)).collect();
        assert!(rates.windows(2).all(|w| w[1] > w[0]), "{rates:?}");
        // Uniform routing: an LRU of half the experts hits about half the time.
        let uniform = simulate_hit_rate(64, 8, 32, TraceShape { zipf: 0.0, ..t });
        assert!((uniform - 0.5).abs() < 0.06, "{uniform}");
        // Skewed routing does better than uniform at the same size.
        assert!(rates[2] > uniform);
    }
}
