//! Log-probabilities of the model's distribution (the raw logits, before penalties and
//! temperature, as OpenAI reports them) for a sampled token and the most likely ones.

/// The most alternatives a request may ask for (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// One token's log-probability and the `n` most likely tokens' at its step.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprobs {
    /// `log p(token)`.
    pub logprob: f32,
    /// The most likely ids, best first (ties to the lower id), with their log-probabilities.
    pub top: Vec<(u32, f32)>,
}

/// `log_softmax(logits)[token]` and the `top` best entries, in f64 for the normaliser.
pub fn token_logprobs(logits: &[f32], token: u32, top: usize) -> TokenLogprobs {
    let max = logits.iter().copied().filter(|l| !l.is_nan()).fold(f32::NEG_INFINITY, f32::max) as f64;
    let log_z = max + logits.iter().filter(|l| !l.is_nan()).map(|&l| (l as f64 - max).exp()).sum::<f64>().ln();
    let lp = |l: f32| if l.is_nan() { f32::NEG_INFINITY } else { (l as f64 - log_z) as f32 };
    let mut order: Vec<u32> = (0..logits.len() as u32).collect();
    let n = top.min(order.len());
    let better = |a: &u32, b: &u32| lp(logits[*b as usize]).total_cmp(&lp(logits[*a as usize])).then(a.cmp(b));
    if n > 0 && n < order.len() {
        order.select_nth_unstable_by(n - 1, better);
    }
    order.truncate(n);
    order.sort_by(better);
    TokenLogprobs {
        logprob: logits.get(token as usize).map_or(f32::NEG_INFINITY, |&l| lp(l)),
        top: order.into_iter().map(|id| (id, lp(logits[id as usize]))).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_softmax_of_the_token_and_the_best_alternatives() {
        let logits = [1.0f32, 3.0, 2.0, 3.0, -1.0];
        let z: f64 = logits.iter().map(|&l| (l as f64).exp()).sum();
        let want = |i: usize| ((logits[i] as f64).exp() / z).ln() as f32;
        let t = token_logprobs(&logits, 2, 3);
        assert!((t.logprob - want(2)).abs() < 1e-6);
        let ids: Vec<u32> = t.top.iter().map(|(i, _)| *i).collect();
        assert_eq!(ids, vec![1, 3, 2], "best first, ties to the lower id");
        assert!(t.top.iter().all(|(i, l)| (l - want(*i as usize)).abs() < 1e-6));
        let probs: f64 = (0..5).map(|i| (token_logprobs(&logits, i, 0).logprob as f64).exp()).sum();
        assert!((probs - 1.0).abs() < 1e-6);
        assert!(token_logprobs(&logits, 0, 0).top.is_empty());
        assert_eq!(token_logprobs(&logits, 0, 99).top.len(), 5);
    }
}
