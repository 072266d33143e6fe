//! Token sampling: repetition, frequency and presence penalties, logit bias, temperature,
//! top-k, top-p, min-p, a seeded PRNG, and incremental stop-string detection.
//!
//! The filter order and semantics follow Hugging Face transformers' logits warpers (and
//! llama.cpp's sampler chain): repetition penalty on the raw logits, then OpenAI's frequency
//! and presence penalties and logit bias, then temperature, then top-k, top-p and min-p on
//! the resulting distribution, then one draw from what is left.

pub mod grammar;
mod logprobs;
mod penalties;
mod rng;
mod stop;

use thiserror::Error;

pub use logprobs::{token_logprobs, TokenLogprobs, MAX_TOP_LOGPROBS};
pub use rng::{splitmix64, Rng};
pub use stop::{StopChecker, StopOutput};

/// Invalid sampling parameters.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum SamplingError {
    /// Temperature must be a finite number >= 0 (0 means greedy).
    #[error("temperature must be a finite number >= 0 (0 = greedy), got {0}")]
    Temperature(f32),
    /// top_p must lie in (0, 1].
    #[error("top_p must be in (0, 1] (1 = off), got {0}")]
    TopP(f32),
    /// min_p must lie in [0, 1].
    #[error("min_p must be in [0, 1] (0 = off), got {0}")]
    MinP(f32),
    /// repetition_penalty must be finite and > 0.
    #[error("repetition_penalty must be a finite number > 0 (1 = off), got {0}")]
    RepetitionPenalty(f32),
    /// frequency_penalty and presence_penalty lie in [-2, 2].
    #[error("{0} must be between -2 and 2, got {1}")]
    Penalty(&'static str, f32),
    /// A logit bias lies in [-100, 100].
    #[error("logit_bias of token {0} must be between -100 and 100, got {1}")]
    LogitBias(u32, f32),
}

/// Parameters of one sampling configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; `<= 0` means greedy (argmax, ties to the lower id).
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; 0 disables the filter.
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability mass is >= `top_p`;
    /// 1.0 disables the filter.
    pub top_p: f32,
    /// Drop tokens whose probability is below `min_p` times the largest probability;
    /// 0 disables the filter.
    pub min_p: f32,
    /// Penalty for ids already in the history (positive logits divided, negative multiplied);
    /// 1.0 disables it.
    pub repetition_penalty: f32,
    /// Subtracted from a logit once per time its id was generated (0 disables it).
    pub frequency_penalty: f32,
    /// Subtracted from the logit of every id generated at least once (0 disables it).
    pub presence_penalty: f32,
    /// Added to the logits of these ids (OpenAI's `logit_bias`).
    pub logit_bias: Vec<(u32, f32)>,
    /// PRNG seed; `None` seeds from the clock (non-reproducible).
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    /// Plain sampling from the model's distribution: temperature 1 and every filter off.
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            logit_bias: Vec::new(),
            seed: None,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding (always the most likely token).
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            ..Self::default()
        }
    }

    /// Checks every field's range; the error names the offending field and value.
    pub fn validate(&self) -> Result<(), SamplingError> {
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(SamplingError::Temperature(self.temperature));
        }
        // `!(x > 0)` also rejects NaN.
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(SamplingError::TopP(self.top_p));
        }
        if !(self.min_p >= 0.0 && self.min_p <= 1.0) {
            return Err(SamplingError::MinP(self.min_p));
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return Err(SamplingError::RepetitionPenalty(self.repetition_penalty));
        }
        for (name, p) in [("frequency_penalty", self.frequency_penalty), ("presence_penalty", self.presence_penalty)] {
            if !(-2.0..=2.0).contains(&p) {
                return Err(SamplingError::Penalty(name, p));
            }
        }
        if let Some(&(id, b)) = self.logit_bias.iter().find(|(_, b)| !(-100.0..=100.0).contains(b)) {
            return Err(SamplingError::LogitBias(id, b));
        }
        Ok(())
    }

    /// True when the configuration always picks the argmax.
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0 || self.top_k == 1
    }
}

/// Draws token ids from logits according to [`SamplingParams`]; owns its PRNG and scratch
/// buffers so repeated calls do not allocate.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: Rng,
    /// Penalised copy of the logits (only used when a repetition penalty applies).
    logits: Vec<f32>,
    /// (token id, weight) candidates; weights are logits first, then unnormalised probs.
    cands: Vec<(u32, f32)>,
    /// One bit per vocabulary id, to penalise each distinct history id once without
    /// sorting the history; cleared after every use.
    seen: Vec<u64>,
    /// Generated ids, for the frequency and presence penalties.
    generated: penalties::Generated,
}

impl Sampler {
    /// Validates `params` and creates a sampler seeded from `params.seed` (or the clock).
    pub fn new(params: SamplingParams) -> Result<Self, SamplingError> {
        params.validate()?;
        let rng = match params.seed {
            Some(seed) => Rng::new(seed),
            None => Rng::from_entropy(),
        };
        Ok(Self {
            params,
            rng,
            logits: Vec::new(),
            cands: Vec::new(),
            seen: Vec::new(),
            generated: Default::default(),
        })
    }

    /// The parameters this sampler was built with.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Picks the next token id from `logits` (one per vocabulary entry), given the ids
    /// prompted and generated so far (`history`: the prompt at the first call, one more id
    /// at each later one), which the penalties read.
    ///
    /// NaN logits are never chosen; if no logit is usable (empty input, all NaN or -inf)
    /// the result is 0.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        let p = &self.params;
        let openai = p.frequency_penalty != 0.0 || p.presence_penalty != 0.0 || !p.logit_bias.is_empty();
        if openai {
            self.generated.update(history);
        }
        if (self.params.repetition_penalty == 1.0 || history.is_empty()) && !openai {
            return self.pick(logits);
        }
        // The caller's logits stay untouched; penalise a reused scratch copy.
        let mut buf = std::mem::take(&mut self.logits);
        buf.clear();
        buf.extend_from_slice(logits);
        if self.params.repetition_penalty != 1.0 {
            self.apply_repetition_penalty(&mut buf, history);
        }
        if openai {
            let p = &self.params;
            self.generated.apply(&mut buf, p.frequency_penalty, p.presence_penalty, &p.logit_bias);
        }
        let id = self.pick(&buf);
        self.logits = buf;
        id
    }

    /// Everything after the repetition penalty.
    fn pick(&mut self, logits: &[f32]) -> u32 {
        if self.params.is_greedy() {
            return argmax(logits);
        }
        self.collect_candidates(logits);
        if self.cands.is_empty() {
            return 0;
        }
        let total = self.exponentiate();
        if self.params.top_p < 1.0 {
            self.apply_top_p(total);
        }
        if self.params.min_p > 0.0 {
            // After `exponentiate` the best candidate has weight exactly 1, so the cut-off
            // relative to the max probability is just `min_p`; the best always survives.
            let threshold = self.params.min_p;
            self.cands.retain(|&(_, w)| w >= threshold);
        }
        self.draw()
    }

    /// Divides positive / multiplies negative logits of every distinct id in `history`
    /// (a token seen twice is penalised once, as in transformers).
    fn apply_repetition_penalty(&mut self, logits: &mut [f32], history: &[u32]) {
        let penalty = self.params.repetition_penalty;
        let words = logits.len().div_ceil(64);
        if self.seen.len() < words {
            self.seen.resize(words, 0);
        }
        for &id in history {
            let i = id as usize;
            let Some(l) = logits.get_mut(i) else { continue };
            let (word, bit) = (i / 64, 1u64 << (i % 64));
            if self.seen[word] & bit != 0 {
                continue;
            }
            self.seen[word] |= bit;
            *l = if *l > 0.0 { *l / penalty } else { *l * penalty };
        }
        for &id in history {
            if let Some(w) = self.seen.get_mut(id as usize / 64) {
                *w = 0;
            }
        }
    }

    /// Fills `cands` with the usable tokens and their logits, already reduced to the top-k
    /// (and, when it is exact to do so, to the min-p survivors) so that softmax runs over
    /// as few entries as possible. Temperature is applied later, in `exponentiate`: it is
    /// monotonic, so the selection is the same either way.
    fn collect_candidates(&mut self, logits: &[f32]) {
        // NaN and -inf can never be drawn; +inf is clamped so softmax stays finite and the
        // +inf tokens share all the mass.
        let usable = logits
            .iter()
            .enumerate()
            .filter(|(_, l)| !l.is_nan() && **l != f32::NEG_INFINITY)
            .map(|(i, &l)| (i as u32, l.clamp(f32::MIN, f32::MAX)));
        self.cands.clear();
        let k = self.params.top_k;
        if k > 0 && k < logits.len() {
            // Streaming top-k: buffer candidates above the current k-th best and prune the
            // buffer with an O(len) selection when it fills; most of a 150k vocabulary is
            // rejected by one comparison.
            let cap = (2 * k).max(64);
            let mut floor = f32::NEG_INFINITY;
            for (i, x) in usable {
                if x <= floor && self.cands.len() >= k {
                    continue;
                }
                self.cands.push((i, x));
                if self.cands.len() >= cap {
                    floor = self.keep_top(k);
                }
            }
            if self.cands.len() > k {
                self.keep_top(k);
            }
        } else if self.params.min_p > 0.0 && self.params.top_p >= 1.0 {
            // min-p is a fixed offset in logit space: p < min_p * p_max  <=>
            // l < l_max + T ln(min_p). Filtering here skips the exp of most of the vocabulary.
            // (Not when top-p is on: it must see the full mass first.) The exact test on
            // probabilities still runs later; the slack only guards against rounding.
            let max = usable
                .clone()
                .map(|c| c.1)
                .fold(f32::NEG_INFINITY, f32::max);
            let cutoff = max + (self.params.min_p.ln() - 1e-3) * self.params.temperature;
            self.cands.extend(usable.filter(|c| c.1 >= cutoff));
        } else {
            self.cands.reserve(logits.len());
            self.cands.extend(usable);
        }
    }

    /// Keeps the `k` largest candidates (unordered) and returns the smallest kept value.
    fn keep_top(&mut self, k: usize) -> f32 {
        self.cands
            .select_nth_unstable_by(k - 1, |a, b| b.1.total_cmp(&a.1));
        self.cands.truncate(k);
        self.cands[k - 1].1
    }

    /// Replaces logits by `exp((l - max) / T)` in place and returns their sum (the max
    /// weight is exactly 1).
    fn exponentiate(&mut self) -> f64 {
        let inv_t = 1.0 / self.params.temperature;
        let max = self
            .cands
            .iter()
            .fold(f32::NEG_INFINITY, |m, c| if c.1 > m { c.1 } else { m });
        for c in &mut self.cands {
            // Subtracting before scaling keeps a tiny temperature from overflowing
            // (which would turn near-greedy sampling into a tie between overflowed logits).
            c.1 = exp_nonpositive((c.1 - max) * inv_t);
        }
        weight_sum(&self.cands)
    }

    /// Keeps the smallest prefix (by descending probability) whose mass reaches `top_p`.
    ///
    /// Instead of sorting the whole vocabulary, sorts only a growing head of the candidates
    /// (select the best m, sort them, check the mass, double m): real distributions are
    /// peaked, so this usually touches a few dozen entries.
    fn apply_top_p(&mut self, total: f64) {
        let target = self.params.top_p as f64 * total;
        let n = self.cands.len();
        let mut m = 64.min(n);
        loop {
            if m < n {
                self.cands
                    .select_nth_unstable_by(m - 1, |a, b| b.1.total_cmp(&a.1));
            }
            self.cands[..m].sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            let mut cum = 0.0f64;
            for i in 0..m {
                cum += self.cands[i].1 as f64;
                if cum >= target {
                    self.cands.truncate(i + 1);
                    return;
                }
            }
            if m == n {
                // Rounding left the sum just short of the target: keep everything.
                return;
            }
            m = (m * 2).min(n);
        }
    }

    /// Draws one candidate proportionally to its weight.
    fn draw(&mut self) -> u32 {
        let Some(last) = self.cands.last() else {
            return 0;
        };
        let fallback = last.0;
        let mut r = self.rng.next_f64() * weight_sum(&self.cands);
        // Skip whole blocks by their (vectorised) sums; walk only the block that holds r.
        for block in self.cands.chunks(64) {
            let block_sum = weight_sum(block);
            if r >= block_sum {
                r -= block_sum;
                continue;
            }
            for &(id, w) in block {
                r -= w as f64;
                if r < 0.0 {
                    return id;
                }
            }
        }
        // Only reachable through rounding when r lands on the very end of the range.
        fallback
    }
}

/// Sum of candidate weights in f64, with independent partial sums: a single serial chain
/// over a 150k vocabulary would cost more than the exponentials.
fn weight_sum(cands: &[(u32, f32)]) -> f64 {
    let mut lanes = [0.0f64; 8];
    let mut chunks = cands.chunks_exact(8);
    for chunk in &mut chunks {
        for (acc, c) in lanes.iter_mut().zip(chunk) {
            *acc += c.1 as f64;
        }
    }
    let rest: f64 = chunks.remainder().iter().map(|c| c.1 as f64).sum();
    lanes.iter().sum::<f64>() + rest
}

/// `e^x` for `x <= 0` (the softmax case after subtracting the max), branch-free so the
/// loop over a whole vocabulary vectorises; relative error about 1e-7 near 0, growing to a
/// few 1e-6 near -80 (from rounding `x * log2 e`), far below what sampling can notice;
/// exactly 1 at 0.
///
/// `e^x = 2^n * 2^f` with `n = round(x * log2 e)` and `|f| <= 0.5`; `2^f` is a degree-6
/// Taylor polynomial of `e^(f ln 2)`, and `2^n` is built in the exponent bits.
#[inline]
fn exp_nonpositive(x: f32) -> f32 {
    // Below ~-87 the result underflows f32's normal range; treat it as zero mass.
    let underflow = x < -87.0;
    let t = x.max(-87.0) * std::f32::consts::LOG2_E;
    // Round to nearest by the 1.5 * 2^23 trick: `f32::round` is a libm call on baseline
    // x86-64 and would stop the loop from vectorising.
    const MAGIC: f32 = 12_582_912.0;
    let n = (t + MAGIC) - MAGIC;
    let g = (t - n) * std::f32::consts::LN_2;
    let p = 1.0
        + g * (1.0
            + g * (0.5
                + g * (1.0 / 6.0 + g * (1.0 / 24.0 + g * (1.0 / 120.0 + g * (1.0 / 720.0))))));
    let scale = f32::from_bits(((n as i32 + 127) as u32) << 23);
    if underflow {
        0.0
    } else {
        p * scale
    }
}

/// Index of the largest logit, ignoring NaN; ties go to the lower index; 0 when nothing is
/// larger than -inf.
pub fn argmax(logits: &[f32]) -> u32 {
    // Two branch-free passes (lane-wise max, then the first index holding it) vectorise,
    // unlike a single loop that tracks the index; a 150k vocabulary takes tens of µs.
    const LANES: usize = 16;
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let mut chunks = logits.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (m, &x) in lanes.iter_mut().zip(chunk) {
            // `x > m` is false for NaN, so NaN never becomes the maximum.
            *m = if x > *m { x } else { *m };
        }
    }
    let max = chunks
        .remainder()
        .iter()
        .chain(&lanes)
        .fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m });
    if max == f32::NEG_INFINITY {
        return 0;
    }
    logits.iter().position(|&x| x == max).unwrap_or(0) as u32
}

#[cfg(test)]
mod tests;

/// Sampling fields of a request or command line, layered over the model's defaults.
#[derive(Clone, Debug, Default)]
pub struct SamplingOverrides {
    /// Temperature.
    pub temperature: Option<f32>,
    /// Nucleus mass.
    pub top_p: Option<f32>,
    /// Top-k (0: off).
    pub top_k: Option<usize>,
    /// Min-p.
    pub min_p: Option<f32>,
    /// Repetition penalty.
    pub repetition_penalty: Option<f32>,
    /// Frequency penalty.
    pub frequency_penalty: Option<f32>,
    /// Presence penalty.
    pub presence_penalty: Option<f32>,
    /// Logit bias by token id.
    pub logit_bias: Vec<(u32, f32)>,
    /// Seed.
    pub seed: Option<u64>,
}

impl SamplingOverrides {
    /// The model's defaults with the request's values on top.
    pub fn apply(&self, base: &SamplingParams) -> SamplingParams {
        let mut s = base.clone();
        if let Some(t) = self.temperature {
            s.temperature = t;
        }
        if let Some(p) = self.top_p {
            s.top_p = p;
        }
        if let Some(k) = self.top_k {
            s.top_k = k;
        }
        if let Some(m) = self.min_p {
            s.min_p = m;
        }
        if let Some(r) = self.repetition_penalty {
            s.repetition_penalty = r;
        }
        if let Some(f) = self.frequency_penalty {
            s.frequency_penalty = f;
        }
        if let Some(p) = self.presence_penalty {
            s.presence_penalty = p;
        }
        s.logit_bias = self.logit_bias.clone();
        s.seed = self.seed;
        s
    }
}
