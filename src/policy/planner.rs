//! Prefill planner: per-token routing through the cache, or whole-layer streaming?
//!
//! A prompt of `T` tokens with top-`k` routing over `E` experts touches, in expectation,
//! `E · (1 − (1 − k/E)^T)` distinct experts per layer (each token picks `k` of `E`; treating
//! routing as uniform is pessimistic for the cache, which is the safe side for planning). Two
//! ways to run it:
//!
//! - **Decode path.** Route the layer, then fetch `q` of the misses and run the rest on the CPU
//!   (the split of [`super::split`]). Transfers can only start once routing is known, so they
//!   do not overlap the layer's attention. Wins when few experts are touched or most are cached.
//! - **Layer streaming.** While the device computes layer `l`, all `E` experts of layer `l + 1`
//!   stream into the second of two buffers. Per layer `≈ max(E · s / B_P, compute(l))`, plus
//!   filling the first buffer and draining the last layer. Wins when nearly every expert is
//!   touched, because the copy then hides behind compute and the cache is left undisturbed.
//!
//! Compute is modelled in FLOPs: `expert_flops_per_token` (≈ 2 × the parameters of one expert)
//! at the device's or the CPU pool's effective FLOP/s, and a per-token device time for the
//! non-expert part of a layer (attention's quadratic term is ignored: it is paid on both paths,
//! so it barely moves the choice). A CPU expert in prefill sees many rows, so its cost is the
//! larger of streaming its weights and computing them. Estimates are for choosing a path, not
//! for reporting latency.

use serde::{Deserialize, Serialize};

use super::mode::ResolvedMode;
use super::split::BranchCosts;

/// What is known about the cache contents of the layers being prefilled.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Residency {
    /// This many of the layer's `E` experts are resident (assumed independent of routing).
    CachedExperts(usize),
    /// Expected fraction of touched experts that are resident, `0..=1`.
    HitRate(f64),
}

impl Residency {
    /// The expected hit fraction, clamped to `0..=1` (NaN counts as no hits).
    pub fn hit_fraction(self, experts: usize) -> f64 {
        let h = match self {
            Residency::CachedExperts(c) if experts > 0 => c.min(experts) as f64 / experts as f64,
            Residency::CachedExperts(_) => 0.0,
            Residency::HitRate(h) => h,
        };
        if h.is_nan() {
            0.0
        } else {
            h.clamp(0.0, 1.0)
        }
    }
}

/// Everything the planner needs about a prompt, a model and a machine.
///
/// Rates that are zero, negative or NaN mean "unknown or unusable": a bandwidth makes its
/// transfer infinitely slow, a FLOP rate makes its compute free (the model then only sees
/// bytes); set them all for a real decision.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PrefillInputs {
    /// Prompt tokens still to prefill (`T`).
    pub tokens: usize,
    /// Routed experts per MoE layer (`E`).
    pub experts: usize,
    /// Experts per token (`k`).
    pub top_k: usize,
    /// Number of MoE layers.
    pub moe_layers: usize,
    /// Cache contents per layer.
    pub residency: Residency,
    /// Bytes of one expert (`s`).
    pub expert_bytes: u64,
    /// Host→device bandwidth, bytes/s.
    pub b_p: f64,
    /// CPU expert-streaming bandwidth, bytes/s.
    pub b_h: f64,
    /// FLOPs to apply one expert to one token (≈ 2 × its parameter count).
    pub expert_flops_per_token: f64,
    /// Effective device FLOP/s on expert matmuls.
    pub device_flops: f64,
    /// Effective FLOP/s of the CPU executor pool.
    pub cpu_flops: f64,
    /// Device seconds per token per layer for the non-expert part (attention, norms, router).
    pub non_expert_s_per_token: f64,
    /// Fixed cost of a batch of copies (launch, event wait), per layer.
    pub transfer_latency_s: f64,
    /// Fixed cost of a batch of CPU expert jobs (dispatch, join), per layer.
    pub cpu_job_latency_s: f64,
    /// How misses are split on the decode path; `Cpu` also rules out streaming, since it
    /// means routed experts never go to the device.
    pub mode: ResolvedMode,
    /// Whether the two layer buffers fit in the memory plan.
    pub streaming_available: bool,
}

/// Which way to prefill.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PrefillPath {
    /// Per-token routing with cached experts on the device and misses split.
    DecodePath,
    /// Whole-layer streaming with double buffering.
    LayerStreaming,
}

/// The decision and the estimates behind it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PrefillPlan {
    /// The cheaper path (the decode path on a tie: it keeps the cache warm).
    pub path: PrefillPath,
    /// Estimated seconds for the whole prompt on the decode path.
    pub est_decode_s: f64,
    /// Estimated seconds with layer streaming (infinite when streaming is unavailable).
    pub est_stream_s: f64,
    /// Expected distinct experts touched per layer.
    pub distinct_experts: f64,
    /// Expected misses per layer on the decode path (rounded).
    pub misses_per_layer: usize,
    /// Of those, how many the decode path would fetch.
    pub fetches_per_layer: usize,
}

/// Expected number of distinct experts that `tokens` tokens touch with top-`k` of `experts`,
/// `E · (1 − (1 − k/E)^T)`, assuming uniform routing.
pub fn expected_distinct_experts(tokens: usize, experts: usize, top_k: usize) -> f64 {
    if experts == 0 || tokens == 0 || top_k == 0 {
        return 0.0;
    }
    if top_k >= experts {
        return experts as f64;
    }
    let p = top_k as f64 / experts as f64;
    // exp(T · ln(1 − p)) stays accurate for large T where powi would need an i32 exponent.
    let untouched = (tokens as f64 * (-p).ln_1p()).exp();
    experts as f64 * (1.0 - untouched)
}

/// Seconds for `flops` at `rate`; unknown rates make compute free (see [`PrefillInputs`]).
fn compute_s(flops: f64, rate: f64) -> f64 {
    if rate.is_finite() && rate > 0.0 && flops.is_finite() && flops > 0.0 {
        flops / rate
    } else {
        0.0
    }
}

fn transfer_s(bytes: f64, rate: f64) -> f64 {
    if bytes <= 0.0 {
        0.0
    } else if rate.is_nan() || rate <= 0.0 {
        f64::INFINITY
    } else {
        bytes / rate
    }
}

fn nonneg(x: f64) -> f64 {
    if x.is_nan() || x < 0.0 {
        0.0
    } else {
        x
    }
}

/// Per-layer estimates, for callers that plan layer by layer (pass that layer's residency).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LayerEstimate {
    /// Seconds for this layer on the decode path.
    pub decode_s: f64,
    /// Seconds for this layer in steady-state streaming: `max(E·s/B_P, compute)`.
    pub stream_s: f64,
    /// Seconds to fill one layer buffer (the streaming pipeline's prologue).
    pub stream_load_s: f64,
    /// Device compute of the layer (non-expert plus all expert rows).
    pub compute_s: f64,
    /// Expected distinct experts touched.
    pub distinct_experts: f64,
    /// Expected misses (rounded).
    pub misses: usize,
    /// Misses the decode path would fetch.
    pub fetches: usize,
}

/// Estimates one MoE layer both ways.
pub fn estimate_layer(inp: &PrefillInputs) -> LayerEstimate {
    let k = inp.top_k.min(inp.experts);
    let t = inp.tokens as f64;
    let distinct = expected_distinct_experts(inp.tokens, inp.experts, k);
    let hit = inp.residency.hit_fraction(inp.experts);
    let hits = distinct * hit;
    // Rounded and capped so that float noise never yields more misses than experts.
    let misses = ((distinct * (1.0 - hit)).round().max(0.0) as usize).min(inp.experts);
    let rows = if distinct > 0.0 {
        t * k as f64 / distinct
    } else {
        0.0
    };

    let fpt = inp.expert_flops_per_token;
    let dev_expert = compute_s(rows * fpt, inp.device_flops);
    let cpu_expert = compute_s(rows * fpt, inp.cpu_flops);
    let s = inp.expert_bytes as f64;
    let non_expert = nonneg(inp.non_expert_s_per_token) * t;
    let expert_compute = compute_s(t * k as f64 * fpt, inp.device_flops);
    let compute = non_expert + expert_compute;

    let branches = BranchCosts {
        // Hits are computed on the device; conservatively serialised before the fetches.
        device_busy_s: hits * dev_expert,
        device_fixed_s: nonneg(inp.transfer_latency_s),
        device_per_expert_s: transfer_s(s, inp.b_p) + dev_expert,
        cpu_fixed_s: nonneg(inp.cpu_job_latency_s),
        cpu_per_expert_s: transfer_s(s, inp.b_h).max(cpu_expert),
    };
    let fetches = inp.mode.choose_q(misses, misses, &branches);
    let decode_s = if inp.tokens == 0 {
        0.0
    } else {
        non_expert + branches.finish_time(misses, fetches)
    };

    let stream_load_s = if inp.experts == 0 {
        0.0
    } else {
        nonneg(inp.transfer_latency_s) + transfer_s(inp.experts as f64 * s, inp.b_p)
    };
    LayerEstimate {
        decode_s,
        stream_s: stream_load_s.max(compute),
        stream_load_s,
        compute_s: compute,
        distinct_experts: distinct,
        misses,
        fetches,
    }
}

/// Chooses the prefill path for a whole prompt, all MoE layers alike.
pub fn plan_prefill(inp: &PrefillInputs) -> PrefillPlan {
    let layer = estimate_layer(inp);
    let layers = inp.moe_layers as f64;
    let est_decode_s = if inp.moe_layers == 0 {
        0.0
    } else {
        layers * layer.decode_s
    };
    let streaming = inp.streaming_available && inp.mode != ResolvedMode::Cpu && inp.tokens > 0;
    let est_stream_s = if !streaming {
        f64::INFINITY
    } else if inp.moe_layers == 0 {
        0.0
    } else {
        // Fill buffer 0, overlap each next load with the current compute, drain the last.
        layer.stream_load_s + (layers - 1.0) * layer.stream_s + layer.compute_s
    };
    // Only a strictly cheaper stream switches paths: ties and NaN keep the decode path.
    let path = match est_decode_s.partial_cmp(&est_stream_s) {
        Some(std::cmp::Ordering::Greater) => PrefillPath::LayerStreaming,
        _ => PrefillPath::DecodePath,
    };
    PrefillPlan {
        path,
        est_decode_s,
        est_stream_s,
        distinct_experts: layer.distinct_experts,
        misses_per_layer: layer.misses,
        fetches_per_layer: layer.fetches,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Qwen3-30B-A3B-like model (128 experts, top-8, 48 layers, ~9.4 MB BF16 experts) on a
    /// PCIe 4 desktop: 25 GB/s copies, 50 GB/s CPU streaming, 100 TFLOP/s device, 0.5 TFLOP/s CPU.
    fn desktop(tokens: usize, residency: Residency) -> PrefillInputs {
        let params = 3.0 * 2048.0 * 768.0;
        PrefillInputs {
            tokens,
            experts: 128,
            top_k: 8,
            moe_layers: 48,
            residency,
            expert_bytes: (params * 2.0) as u64,
            b_p: 25e9,
            b_h: 50e9,
            expert_flops_per_token: 2.0 * params,
            device_flops: 100e12,
            cpu_flops: 0.5e12,
            non_expert_s_per_token: 1e-6,
            transfer_latency_s: 20e-6,
            cpu_job_latency_s: 20e-6,
            mode: ResolvedMode::Hybrid,
            streaming_available: true,
        }
    }

    #[test]
    fn distinct_experts_formula() {
        assert_eq!(expected_distinct_experts(0, 128, 8), 0.0);
        assert_eq!(expected_distinct_experts(10, 0, 8), 0.0);
        assert_eq!(expected_distinct_experts(10, 128, 0), 0.0);
        assert!((expected_distinct_experts(1, 128, 8) - 8.0).abs() < 1e-9);
        let two = 128.0 * (1.0 - (1.0 - 8.0 / 128.0f64).powi(2));
        assert!((expected_distinct_experts(2, 128, 8) - two).abs() < 1e-9);
        assert!(expected_distinct_experts(100_000, 128, 8) > 127.999);
        assert_eq!(expected_distinct_experts(5, 8, 8), 8.0);
        assert_eq!(expected_distinct_experts(5, 4, 8), 4.0);
        let mut prev = 0.0;
        for t in 1..2000 {
            let d = expected_distinct_experts(t, 64, 6);
            assert!(d >= prev && d <= 64.0);
            prev = d;
        }
    }

    #[test]
    fn residency_hit_fraction() {
        assert_eq!(Residency::CachedExperts(32).hit_fraction(128), 0.25);
        assert_eq!(Residency::CachedExperts(500).hit_fraction(128), 1.0);
        assert_eq!(Residency::CachedExperts(5).hit_fraction(0), 0.0);
        assert_eq!(Residency::HitRate(1.7).hit_fraction(8), 1.0);
        assert_eq!(Residency::HitRate(f64::NAN).hit_fraction(8), 0.0);
    }

    #[test]
    fn short_prompts_take_the_decode_path() {
        for t in [1, 2, 4, 16] {
            let p = plan_prefill(&desktop(t, Residency::CachedExperts(16)));
            assert_eq!(p.path, PrefillPath::DecodePath, "T={t}: {p:?}");
            assert!(p.est_decode_s < p.est_stream_s);
        }
    }

    #[test]
    fn long_prompts_with_a_small_cache_stream() {
        for t in [8192, 32768] {
            let p = plan_prefill(&desktop(t, Residency::CachedExperts(8)));
            assert_eq!(p.path, PrefillPath::LayerStreaming, "T={t}: {p:?}");
            assert!(p.distinct_experts > 127.0);
        }
    }

    #[test]
    fn long_prompts_with_a_warm_cache_stay_on_the_decode_path() {
        let p = plan_prefill(&desktop(8192, Residency::HitRate(0.97)));
        assert_eq!(p.path, PrefillPath::DecodePath, "{p:?}");
        let p = plan_prefill(&desktop(8192, Residency::CachedExperts(128)));
        assert_eq!(
            (p.path, p.misses_per_layer, p.fetches_per_layer),
            (PrefillPath::DecodePath, 0, 0)
        );
    }

    #[test]
    fn estimates_grow_with_tokens_and_the_path_switches_once() {
        for residency in [
            Residency::CachedExperts(0),
            Residency::CachedExperts(16),
            Residency::HitRate(0.5),
        ] {
            let mut prev: Option<PrefillPlan> = None;
            let mut switches = 0;
            let mut t = 1usize;
            while t <= 65536 {
                let p = plan_prefill(&desktop(t, residency));
                if let Some(q) = prev {
                    assert!(
                        p.est_decode_s >= q.est_decode_s,
                        "decode not monotone at T={t}"
                    );
                    assert!(
                        p.est_stream_s >= q.est_stream_s,
                        "stream not monotone at T={t}"
                    );
                    if p.path != q.path {
                        assert_eq!(
                            p.path,
                            PrefillPath::LayerStreaming,
                            "switched back at T={t}"
                        );
                        switches += 1;
                    }
                }
                prev = Some(p);
                t += 1 + t / 8;
            }
            // Short prompts take the decode path, long ones stream: exactly one crossover.
            assert_eq!(switches, 1, "{residency:?}");
        }
    }

    #[test]
    fn streaming_needs_buffers_and_a_device_mode() {
        let mut inp = desktop(32768, Residency::CachedExperts(0));
        inp.streaming_available = false;
        let p = plan_prefill(&inp);
        assert_eq!(p.path, PrefillPath::DecodePath);
        assert!(p.est_stream_s.is_infinite());
        let mut inp = desktop(32768, Residency::CachedExperts(0));
        inp.mode = ResolvedMode::Cpu;
        let p = plan_prefill(&inp);
        assert_eq!((p.path, p.fetches_per_layer), (PrefillPath::DecodePath, 0));
    }

    #[test]
    fn offload_mode_fetches_every_miss() {
        let mut inp = desktop(4, Residency::CachedExperts(0));
        inp.mode = ResolvedMode::Offload;
        let l = estimate_layer(&inp);
        assert_eq!(l.fetches, l.misses);
        assert!(l.misses >= 28 && l.misses <= 32, "{l:?}");
    }

    #[test]
    fn streaming_time_matches_the_pipeline_formula() {
        let inp = desktop(4096, Residency::CachedExperts(0));
        let l = estimate_layer(&inp);
        let load = 20e-6 + 128.0 * inp.expert_bytes as f64 / 25e9;
        assert!((l.stream_load_s - load).abs() < 1e-12);
        assert_eq!(l.stream_s, load.max(l.compute_s));
        let p = plan_prefill(&inp);
        assert!((p.est_stream_s - (load + 47.0 * l.stream_s + l.compute_s)).abs() < 1e-9);
    }

    #[test]
    fn degenerate_inputs_do_not_panic() {
        let mut inp = desktop(0, Residency::HitRate(0.0));
        assert_eq!(plan_prefill(&inp).path, PrefillPath::DecodePath);
        inp.tokens = 10;
        inp.experts = 0;
        inp.moe_layers = 0;
        let p = plan_prefill(&inp);
        assert_eq!((p.est_decode_s, p.path), (0.0, PrefillPath::DecodePath));
        let mut inp = desktop(100, Residency::HitRate(0.0));
        inp.b_p = 0.0;
        inp.b_h = f64::NAN;
        inp.device_flops = -1.0;
        let p = plan_prefill(&inp);
        assert_eq!(p.path, PrefillPath::DecodePath);
    }
}
