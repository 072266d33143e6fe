//! The step planner: how many tokens each running sequence advances in one batched step.
//!
//! Every decoding sequence advances one token every step, so a long prompt never stalls the
//! streams already running; prompts fill the rest of the step's token budget in arrival
//! order, in chunks that end where the prefix store wants an anchor.

/// What one sequence could do this step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepDemand {
    /// Prompt tokens not yet prefilled (0: the sequence is decoding).
    pub prompt_left: usize,
    /// Prompt tokens until the next point where its state is to be saved, if any.
    pub until_stop: Option<usize>,
}

/// The fewest prompt tokens the oldest prefilling sequence advances in a step, even when
/// decodes take the whole budget, so that prompts always progress.
pub const MIN_PREFILL_CHUNK: usize = 16;

/// Tokens per sequence for one step (same order as `demands`), under `budget` tokens.
///
/// Decodes take one token each first; prefills then take what is left of the budget
/// (at least [`MIN_PREFILL_CHUNK`] for the first), oldest first, each chunk stopping at its
/// next anchor point. A sequence may get 0 (it waits for a later step).
pub fn plan_step(demands: &[StepDemand], budget: usize) -> Vec<usize> {
    let decodes = demands.iter().filter(|d| d.prompt_left == 0).count();
    let mut left = budget.saturating_sub(decodes);
    let mut first_prefill = true;
    demands
        .iter()
        .map(|d| {
            if d.prompt_left == 0 {
                return 1;
            }
            let room = if first_prefill { left.max(MIN_PREFILL_CHUNK) } else { left };
            first_prefill = false;
            let cap = d.until_stop.filter(|&s| s > 0).unwrap_or(usize::MAX);
            let take = d.prompt_left.min(cap).min(room);
            left = left.saturating_sub(take);
            take
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode() -> StepDemand {
        StepDemand { prompt_left: 0, until_stop: None }
    }

    fn prompt(n: usize) -> StepDemand {
        StepDemand { prompt_left: n, until_stop: None }
    }

    #[test]
    fn every_decode_advances_and_a_long_prompt_is_chunked() {
        let d = [decode(), prompt(4096), decode(), decode(), decode()];
        assert_eq!(plan_step(&d, 512), vec![1, 508, 1, 1, 1]);
    }

    #[test]
    fn prompts_share_the_budget_oldest_first() {
        assert_eq!(plan_step(&[prompt(300), prompt(300), prompt(300)], 512), vec![300, 212, 0]);
        assert_eq!(plan_step(&[prompt(10), prompt(20)], 512), vec![10, 20]);
    }

    #[test]
    fn a_prompt_progresses_even_when_decodes_fill_the_budget() {
        let d = [decode(), decode(), decode(), decode(), prompt(100), prompt(100)];
        assert_eq!(plan_step(&d, 4), vec![1, 1, 1, 1, MIN_PREFILL_CHUNK, 0]);
    }

    #[test]
    fn chunks_end_at_anchor_points() {
        let d = [StepDemand { prompt_left: 1000, until_stop: Some(300) }, prompt(1000)];
        assert_eq!(plan_step(&d, 512), vec![300, 212]);
        // A stop at 0 (already there) does not hold the prompt back.
        assert_eq!(plan_step(&[StepDemand { prompt_left: 50, until_stop: Some(0) }], 512), vec![50]);
    }

    #[test]
    fn nothing_to_do_plans_nothing() {
        assert!(plan_step(&[], 512).is_empty());
        assert_eq!(plan_step(&[decode(); 8], 512), vec![1; 8]);
    }
}
