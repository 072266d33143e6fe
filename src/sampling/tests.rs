//! Unit tests of the sampler: each filter on a known distribution, determinism, and
//! frequencies against softmax.

use super::*;

fn sampler(p: SamplingParams) -> Sampler {
    Sampler::new(p).expect("valid params")
}

fn seeded(seed: u64) -> SamplingParams {
    SamplingParams {
        seed: Some(seed),
        ..SamplingParams::default()
    }
}

fn softmax(l: &[f32]) -> Vec<f64> {
    let m = l.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let e: Vec<f64> = l.iter().map(|&x| (x as f64 - m).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|x| x / s).collect()
}

fn frequencies(s: &mut Sampler, logits: &[f32], draws: usize) -> Vec<f64> {
    let mut counts = vec![0usize; logits.len()];
    for _ in 0..draws {
        counts[s.sample(logits, &[]) as usize] += 1;
    }
    counts.iter().map(|&c| c as f64 / draws as f64).collect()
}

#[test]
fn fast_exp_matches_std() {
    assert_eq!(exp_nonpositive(0.0), 1.0);
    assert_eq!(exp_nonpositive(-100.0), 0.0);
    assert_eq!(exp_nonpositive(f32::NEG_INFINITY), 0.0);
    let mut x = 0.0f32;
    while x > -80.0 {
        let (got, want) = (exp_nonpositive(x) as f64, (x as f64).exp());
        let tol = 3e-7 + 1e-7 * x.abs() as f64;
        assert!(
            ((got - want) / want).abs() < tol,
            "exp({x}) = {got}, want {want}"
        );
        x -= 0.0137;
    }
}

#[test]
fn greedy_picks_argmax_with_ties_to_lower_index() {
    let mut s = sampler(SamplingParams::greedy());
    assert_eq!(s.sample(&[0.1, 2.0, -1.0, 2.0], &[]), 1);
    assert_eq!(s.sample(&[f32::NAN, 0.5, f32::NAN], &[]), 1);
    assert_eq!(s.sample(&[], &[]), 0);
}

#[test]
fn top_k_one_equals_greedy() {
    let logits = [0.3, 1.2, 1.1, -4.0, 0.9];
    let mut s = sampler(SamplingParams {
        top_k: 1,
        ..seeded(7)
    });
    for _ in 0..100 {
        assert_eq!(s.sample(&logits, &[]), 1);
    }
}

#[test]
fn top_k_restricts_support() {
    let logits = [0.0, 3.0, 1.0, 2.0, -1.0];
    let mut s = sampler(SamplingParams {
        top_k: 2,
        ..seeded(1)
    });
    for _ in 0..500 {
        let t = s.sample(&logits, &[]);
        assert!(t == 1 || t == 3, "token {t} outside top-2");
    }
}

#[test]
fn tiny_top_p_is_argmax() {
    let logits = [0.0, 0.5, 2.5, 2.4, 1.0];
    let mut s = sampler(SamplingParams {
        top_p: 1e-6,
        ..seeded(3)
    });
    for _ in 0..200 {
        assert_eq!(s.sample(&logits, &[]), 2);
    }
}

#[test]
fn top_p_keeps_smallest_covering_set() {
    // probs 0.5, 0.3, 0.15, 0.05 (as logits of their logs)
    let logits: Vec<f32> = [0.5f32, 0.3, 0.15, 0.05].iter().map(|p| p.ln()).collect();
    // 0.5 + 0.3 = 0.8 >= 0.75: exactly tokens 0 and 1 remain.
    let mut s = sampler(SamplingParams {
        top_p: 0.75,
        ..seeded(11)
    });
    let f = frequencies(&mut s, &logits, 5000);
    assert_eq!(f[2] + f[3], 0.0);
    assert!(f[0] > 0.0 && f[1] > 0.0);
}

#[test]
fn top_p_over_large_vocab_uses_growing_head() {
    // Flat distribution over 10k ids: top_p = 0.5 must keep exactly 5000 of them,
    // which forces several rounds of the partial sort.
    let logits = vec![0.0f32; 10_000];
    let mut s = sampler(SamplingParams {
        top_p: 0.5,
        ..seeded(5)
    });
    s.sample(&logits, &[]);
    assert_eq!(s.cands.len(), 5000);
}

#[test]
fn min_p_drops_unlikely_tokens() {
    // probs 0.6, 0.3, 0.08, 0.02; min_p 0.2 -> threshold 0.12: tokens 0 and 1 remain.
    let logits: Vec<f32> = [0.6f32, 0.3, 0.08, 0.02].iter().map(|p| p.ln()).collect();
    let mut s = sampler(SamplingParams {
        min_p: 0.2,
        ..seeded(2)
    });
    let f = frequencies(&mut s, &logits, 5000);
    assert_eq!(f[2] + f[3], 0.0);
    assert!((f[0] - 2.0 / 3.0).abs() < 0.03, "{f:?}");
}

#[test]
fn repetition_penalty_divides_positive_and_multiplies_negative() {
    let mut s = sampler(SamplingParams {
        repetition_penalty: 2.0,
        ..SamplingParams::greedy()
    });
    // Token 0 (3.0 -> 1.5) loses to token 1 (2.0) once seen, even if seen twice.
    assert_eq!(s.sample(&[3.0, 2.0, -1.0], &[0, 0]), 1);
    assert_eq!(s.logits, vec![1.5, 2.0, -1.0]);
    assert!(s.seen.iter().all(|&w| w == 0), "seen bits must be cleared");
    // Negative logits are pushed further down.
    s.sample(&[3.0, 2.0, -1.0], &[2, 99]);
    assert_eq!(s.logits, vec![3.0, 2.0, -2.0]);
}

#[test]
fn same_seed_same_sequence() {
    let logits: Vec<f32> = (0..1000).map(|i| ((i * 37) % 101) as f32 / 25.0).collect();
    let params = SamplingParams {
        temperature: 0.8,
        top_k: 50,
        top_p: 0.9,
        ..seeded(42)
    };
    let run = |p: &SamplingParams| {
        let mut s = sampler(p.clone());
        (0..200).map(|_| s.sample(&logits, &[])).collect::<Vec<_>>()
    };
    assert_eq!(run(&params), run(&params));
    let other = SamplingParams {
        seed: Some(43),
        ..params.clone()
    };
    assert_ne!(run(&params), run(&other));
}

/// 20000 draws: the standard error of each frequency is at most sqrt(0.25/20000) ≈
/// 0.0035, so a 0.015 tolerance is over 4 sigma (and the seed is fixed anyway).
#[test]
fn frequencies_match_softmax() {
    let logits = [1.0f32, 0.0, 2.0, -1.0, 0.5];
    let temperature = 0.7f32;
    let mut s = sampler(SamplingParams {
        temperature,
        ..seeded(1234)
    });
    let f = frequencies(&mut s, &logits, 20_000);
    let scaled: Vec<f32> = logits.iter().map(|l| l / temperature).collect();
    for (got, want) in f.iter().zip(softmax(&scaled)) {
        assert!((got - want).abs() < 0.015, "got {f:?}, want {want}");
    }

    // With top-k the frequencies match the renormalised top-3 softmax.
    let mut s = sampler(SamplingParams {
        top_k: 3,
        ..seeded(99)
    });
    let f = frequencies(&mut s, &logits, 20_000);
    let top3 = softmax(&[1.0, 2.0, 0.5]);
    let want = [top3[0], 0.0, top3[1], 0.0, top3[2]];
    for (got, want) in f.iter().zip(want) {
        assert!((got - want).abs() < 0.015, "got {f:?}, want {want:?}");
    }
}

#[test]
fn tiny_temperature_is_near_greedy() {
    let mut s = sampler(SamplingParams {
        temperature: 1e-30,
        ..seeded(8)
    });
    for _ in 0..100 {
        assert_eq!(s.sample(&[1.0, 3.0, 2.999, -5.0], &[]), 1);
    }
}

#[test]
fn nan_and_infinite_logits_do_not_panic() {
    let mut s = sampler(SamplingParams {
        top_p: 0.9,
        min_p: 0.1,
        ..seeded(0)
    });
    for _ in 0..50 {
        let t = s.sample(&[f32::NAN, 1.0, f32::NAN, 0.5], &[]);
        assert!(t == 1 || t == 3);
    }
    assert_eq!(s.sample(&[0.0, f32::INFINITY, 1.0], &[]), 1);
    assert_eq!(s.sample(&[f32::NAN, f32::NAN], &[]), 0);
    assert_eq!(s.sample(&[f32::NEG_INFINITY; 3], &[]), 0);
}

#[test]
fn validate_rejects_bad_values() {
    let bad = [
        SamplingParams {
            temperature: -0.1,
            ..Default::default()
        },
        SamplingParams {
            temperature: f32::NAN,
            ..Default::default()
        },
        SamplingParams {
            top_p: 0.0,
            ..Default::default()
        },
        SamplingParams {
            top_p: 1.5,
            ..Default::default()
        },
        SamplingParams {
            min_p: -0.1,
            ..Default::default()
        },
        SamplingParams {
            min_p: f32::NAN,
            ..Default::default()
        },
        SamplingParams {
            repetition_penalty: 0.0,
            ..Default::default()
        },
    ];
    for p in bad {
        assert!(p.validate().is_err(), "{p:?} accepted");
        assert!(Sampler::new(p).is_err());
    }
    assert!(SamplingParams::default().validate().is_ok());
    assert!(SamplingParams::greedy().validate().is_ok());
    let msg = SamplingParams {
        top_p: 2.0,
        ..Default::default()
    }
    .validate()
    .unwrap_err()
    .to_string();
    assert!(msg.contains("top_p") && msg.contains('2'), "{msg}");
}

#[test]
fn presence_and_frequency_penalties_read_only_generated_tokens() {
    let logits = [0.0, 1.0, 0.9, 0.2];
    let mut s = sampler(SamplingParams { presence_penalty: 0.5, ..SamplingParams::greedy() });
    // Token 1 is in the prompt: that is not a generated use.
    assert_eq!(s.sample(&logits, &[1, 1, 3]), 1);
    // Generated once: 1.0 - 0.5 < 0.9.
    assert_eq!(s.sample(&logits, &[1, 1, 3, 1]), 2);
    let mut f = sampler(SamplingParams { frequency_penalty: 0.4, ..SamplingParams::greedy() });
    assert_eq!(f.sample(&logits, &[0]), 1);
    assert_eq!(f.sample(&logits, &[0, 1]), 2, "1.0 - 0.4 < 0.9");
    assert_eq!(f.sample(&logits, &[0, 1, 2]), 1, "0.6 > 0.9 - 0.4");
    assert_eq!(f.sample(&logits, &[0, 1, 2, 1]), 2, "1.0 - 0.8 < 0.5");
    assert_eq!(logits, [0.0, 1.0, 0.9, 0.2], "the caller's logits are untouched");
}

#[test]
fn logit_bias_moves_the_choice_and_its_range_is_checked() {
    let logits = [0.0, 1.0, 0.9, 0.2];
    let mut s = sampler(SamplingParams { logit_bias: vec![(3, 5.0), (1, -100.0)], ..SamplingParams::greedy() });
    assert_eq!(s.sample(&logits, &[0]), 3);
    let bad = SamplingParams { logit_bias: vec![(2, 101.0)], ..SamplingParams::default() };
    assert_eq!(bad.validate(), Err(SamplingError::LogitBias(2, 101.0)));
    let bad = SamplingParams { presence_penalty: -2.5, ..SamplingParams::default() };
    assert_eq!(bad.validate(), Err(SamplingError::Penalty("presence_penalty", -2.5)));
}
