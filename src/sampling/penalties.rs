//! OpenAI's frequency and presence penalties and logit bias: `logit[j] += bias[j] −
//! count[j]·frequency − (count[j] > 0)·presence`, where `count` covers the tokens generated
//! so far (not the prompt), as OpenAI and vLLM define them.

use std::collections::HashMap;

/// How often each id was generated, kept up to date from the history the sampler is given.
#[derive(Debug, Clone, Default)]
pub(super) struct Generated {
    /// Length of the prompt: the history at the first sample.
    prompt_len: Option<usize>,
    /// History entries already counted.
    counted: usize,
    counts: HashMap<u32, u32>,
}

impl Generated {
    /// Counts what `history` gained since the last call (the first call's history is the
    /// prompt, and counts nothing).
    pub(super) fn update(&mut self, history: &[u32]) {
        let start = *self.prompt_len.get_or_insert(history.len());
        let from = self.counted.max(start);
        for &id in history.get(from..).unwrap_or_default() {
            *self.counts.entry(id).or_insert(0) += 1;
        }
        self.counted = history.len();
    }

    /// Applies the penalties and the bias to `logits`.
    pub(super) fn apply(&self, logits: &mut [f32], frequency: f32, presence: f32, bias: &[(u32, f32)]) {
        if frequency != 0.0 || presence != 0.0 {
            for (&id, &n) in &self.counts {
                if let Some(l) = logits.get_mut(id as usize) {
                    *l -= n as f32 * frequency + presence;
                }
            }
        }
        for &(id, b) in bias {
            if let Some(l) = logits.get_mut(id as usize) {
                *l += b;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_generated_tokens_are_counted_and_penalised() {
        let mut g = Generated::default();
        g.update(&[5, 5, 1]); // the prompt
        g.update(&[5, 5, 1, 2]);
        g.update(&[5, 5, 1, 2, 2, 5]);
        let mut l = vec![0.0f32; 6];
        g.apply(&mut l, 0.5, 0.25, &[(0, 3.0), (9, 1.0)]);
        // 2 generated twice, 5 once (its prompt uses do not count), 1 never; 0 biased.
        assert_eq!(l, vec![3.0, 0.0, -1.25, 0.0, 0.0, -0.75]);
    }
}
