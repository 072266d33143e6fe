//! RoPE inverse frequencies and attention scaling, as transformers computes them.

use super::config::{RopeConfig, RopeScaling};

/// Inverse frequencies (`rotary_dim / 2` values) and the factor applied to cos/sin.
pub fn inv_freq(rope: &RopeConfig, rotary_dim: usize) -> (Vec<f32>, f32) {
    let base = rope.theta as f64;
    let dim = rotary_dim as f64;
    let pos_freqs: Vec<f64> = (0..rotary_dim / 2).map(|i| base.powf((2 * i) as f64 / dim)).collect();
    match &rope.scaling {
        RopeScaling::None => (pos_freqs.iter().map(|p| (1.0 / p) as f32).collect(), 1.0),
        RopeScaling::Linear { factor } => {
            (pos_freqs.iter().map(|p| (1.0 / (p * *factor as f64)) as f32).collect(), 1.0)
        }
        RopeScaling::Yarn {
            factor,
            original_max_position,
            beta_fast,
            beta_slow,
            mscale,
            mscale_all_dim,
            attention_factor,
            truncate,
        } => {
            let factor = *factor as f64;
            let correction_dim = |rotations: f64| {
                dim * ((*original_max_position as f64) / (rotations * 2.0 * std::f64::consts::PI)).ln()
                    / (2.0 * base.ln())
            };
            let (mut low, mut high) = (correction_dim(*beta_fast as f64), correction_dim(*beta_slow as f64));
            if *truncate {
                low = low.floor();
                high = high.ceil();
            }
            let low = low.max(0.0);
            let high = high.min(dim - 1.0);
            let span = if low == high { 0.001 } else { high - low };
            let inv: Vec<f32> = pos_freqs
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    let ramp = ((i as f64 - low) / span).clamp(0.0, 1.0);
                    let extrapolation_factor = 1.0 - ramp;
                    let (extra, inter) = (1.0 / p, 1.0 / (factor * p));
                    (inter * (1.0 - extrapolation_factor) + extra * extrapolation_factor) as f32
                })
                .collect();
            let scaling = attention_factor.map(|a| a as f64).unwrap_or_else(|| {
                if *mscale != 0.0 && *mscale_all_dim != 0.0 {
                    yarn_mscale(factor, *mscale as f64) / yarn_mscale(factor, *mscale_all_dim as f64)
                } else {
                    yarn_mscale(factor, 1.0)
                }
            });
            (inv, scaling as f32)
        }
        RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position } => {
            let (factor, lo, hi) = (*factor as f64, *low_freq_factor as f64, *high_freq_factor as f64);
            let old = *original_max_position as f64;
            let inv = pos_freqs
                .iter()
                .map(|p| {
                    let f = 1.0 / p;
                    let wavelen = 2.0 * std::f64::consts::PI / f;
                    let v = if wavelen < old / hi {
                        f
                    } else if wavelen > old / lo {
                        f / factor
                    } else {
                        let smooth = (old / wavelen - lo) / (hi - lo);
                        (1.0 - smooth) * f / factor + smooth * f
                    };
                    v as f32
                })
                .collect();
            (inv, 1.0)
        }
    }
}

/// YaRN's magnitude correction `0.1 · m · ln(s) + 1` (1 for `s <= 1`).
pub fn yarn_mscale(scale: f64, m: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * m * scale.ln() + 1.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_frequencies_follow_theta() {
        let rope = RopeConfig { theta: 10000.0, partial_rotary_factor: 1.0, scaling: RopeScaling::None };
        let (inv, s) = inv_freq(&rope, 8);
        assert_eq!(s, 1.0);
        let expect = [1.0, 0.1, 0.01, 0.001];
        for (a, b) in inv.iter().zip(expect) {
            assert!((a - b).abs() < 1e-7 * b.max(1.0), "{a} vs {b}");
        }
    }

    #[test]
    fn yarn_keeps_high_frequencies_and_interpolates_low_ones() {
        let rope = RopeConfig {
            theta: 10000.0,
            partial_rotary_factor: 1.0,
            scaling: RopeScaling::Yarn {
                factor: 4.0,
                original_max_position: 1024,
                beta_fast: 32.0,
                beta_slow: 1.0,
                mscale: 1.0,
                mscale_all_dim: 0.0,
                attention_factor: None,
                truncate: true,
            },
        };
        let (inv, s) = inv_freq(&rope, 64);
        let (plain, _) = inv_freq(&RopeConfig { scaling: RopeScaling::None, ..rope.clone() }, 64);
        assert!((inv[0] - plain[0]).abs() < 1e-7);
        assert!((inv[31] - plain[31] / 4.0).abs() < 1e-9);
        assert!((s - (0.1 * 4f32.ln() + 1.0)).abs() < 1e-6);
    }
}
