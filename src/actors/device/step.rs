//! The device stream's batched step: which tokens each sequence runs (the planner's
//! division of the step budget), one forward pass for all of them, then sampling, anchors and
//! the recompute of a failed step's sequences.

use super::{unknown_seq, Seq, SeqSpec, StepOutput, StepRequest, Worker};
use crate::actors::pipeline::{PipelineExperts, StreamingExperts};
use crate::engine::EngineError;
use crate::kv::{SequenceState, INITIAL_ROWS};
use crate::model::batch::BatchItem;
use crate::model::{Logits, ModelError};
use crate::policy::{plan_kv, plan_step, KvUse, StepDemand};
use crate::sampling::grammar::{Constraint, GrammarError, Mask as TokenMask};
use crate::sampling::Sampler;
use std::time::Instant;

impl Worker {
    /// Runs a batch through the model: layer streaming or the decode pipeline for the
    /// experts, as the planner picks for the batch's token count.
    pub(super) fn forward_items(&mut self, items: &mut [BatchItem<'_>]) -> Result<Vec<Vec<f32>>, ModelError> {
        let tokens = items.iter().map(|i| i.tokens.len()).sum();
        let model = self.args.model.clone();
        if self.use_streaming(tokens) {
            let mut runner = StreamingExperts::new(&self.args.links, &mut self.run, self.moe_layers.clone());
            model.forward_batch(items, None, &mut runner)
        } else {
            let first_moe_layer = self.moe_layers.first().copied().unwrap_or(0);
            let mut runner = PipelineExperts::new(&self.args.links, &mut self.run, first_moe_layer, self.args.mode);
            let out = model.forward_batch(items, None, &mut runner)?;
            runner.finish()?;
            Ok(out)
        }
    }

    /// An empty state for up to `capacity` tokens: in the pool's pages (it takes none until
    /// tokens arrive); a model without paged caches gets its buffers, one row of each while
    /// it `waits` for room in the KV pool.
    fn fresh_state(&self, capacity: usize, waits: bool) -> Result<SequenceState, ModelError> {
        match &self.pages {
            Some(pool) => SequenceState::in_pool(&self.args.model, capacity, pool),
            None => SequenceState::with_rows(&self.args.model, capacity, if waits { 1 } else { INITIAL_ROWS }, self.args.kv_dtype),
        }
    }

    /// A new sequence, waiting for its first step (when the KV pool has room, [`Self::restart`]
    /// gives it its state).
    fn start_seq(&mut self, spec: SeqSpec, prompt: Vec<u32>) -> Result<Seq, ModelError> {
        if prompt.is_empty() {
            return Err(ModelError::Invalid("the prompt is empty".into()));
        }
        let state = self.fresh_state(spec.capacity, true)?;
        let sampler = Sampler::new(spec.sampling).map_err(|e| ModelError::Invalid(e.to_string()))?;
        Ok(Seq {
            state,
            sampler,
            history: prompt,
            return_logits: spec.return_logits,
            logprobs: spec.logprobs,
            constraint: spec.constraint,
            last_anchor: 0,
            broken: false,
            fed: 0,
            stops: Default::default(),
            cached: 0,
            sampled: false,
            retried: false,
            waiting: true,
        })
    }

    /// Gives `s` a fresh state built from its tokens (prompt and generated): the longest
    /// saved prefix restored, the rest left to prefill; its next token is then sampled as usual.
    fn restart(&mut self, s: &mut Seq) -> Result<(), ModelError> {
        let mut state = self.fresh_state(s.state.capacity(), false)?;
        let cached = self.args.reuse.restore(&s.history, &mut state);
        s.state = state;
        s.stops = self.args.reuse.prefill_stops(&s.history, cached).into();
        s.fed = cached;
        s.last_anchor = cached;
        if !s.sampled {
            s.cached = cached;
        }
        s.sampled = false;
        s.waiting = false;
        Ok(())
    }

    /// Starts `s` over after a failed step (once; a second failure fails it).
    fn rebuild(&mut self, s: &mut Seq) -> Result<(), ModelError> {
        self.restart(s)?;
        s.retried = true;
        Ok(())
    }

    /// Frees `s`'s caches for the KV pool: what it holds is saved in the prefix store first
    /// (which moves it to host memory when the device's share is full), so its restart
    /// restores rather than recomputes it.
    fn preempt(&mut self, s: &mut Seq) -> Result<(), ModelError> {
        Self::record_anchor(&mut self.args.reuse, s);
        s.state = self.fresh_state(s.state.capacity(), true)?;
        s.waiting = true;
        self.dev.preemptions += 1;
        Ok(())
    }

    /// Which of the batch's sequences run this step within the KV pool: preempts and
    /// restarts as [`plan_kv`] decides; the rest wait. Errors go to `results`.
    fn fit_kv_pool(&mut self, batch: &mut Vec<(u64, Seq)>, results: &mut Vec<(u64, Result<Option<StepOutput>, EngineError>)>) -> Vec<bool> {
        let step = self.args.step_tokens.max(1);
        let uses: Vec<KvUse> = batch
            .iter()
            .map(|(_, s)| {
                // What it holds after this step; a waiting one is rebuilt whole from a fresh state.
                let need = if s.waiting {
                    s.state.fresh_bytes_for(s.history.len() + 1)
                } else {
                    s.state.bytes_after(s.state.len() + s.prompt_left().min(step).max(1))
                };
                KvUse { need, waiting: s.waiting }
            })
            .collect();
        let plan = plan_kv(self.args.kv_pool, &uses);
        let mut failed = vec![];
        for &i in plan.preempt.iter().chain(&plan.resume) {
            let s = &mut batch[i].1;
            let r = if s.waiting { self.restart(s) } else { self.preempt(s) };
            if let Err(e) = r {
                failed.push((i, e));
            }
        }
        let mut runs = plan.runs;
        // Failed ones leave the batch (highest index first, so the others keep theirs).
        failed.sort_by_key(|(i, _)| std::cmp::Reverse(*i));
        for (i, e) in failed {
            let (id, _) = batch.remove(i);
            runs.remove(i);
            results.push((id, Err(e.into())));
        }
        runs
    }

    /// One batched step over `reqs` (see [`DeviceMsg::StepBatch`]).
    pub(super) fn step_batch(&mut self, reqs: Vec<StepRequest>) -> Vec<(u64, Result<Option<StepOutput>, EngineError>)> {
        let mut results = Vec::with_capacity(reqs.len());
        // The batch's sequences leave the map for the step, so each can be borrowed mutably.
        let mut batch: Vec<(u64, Seq)> = Vec::with_capacity(reqs.len());
        for r in reqs {
            let seq = match r.start {
                Some((spec, prompt)) => self.start_seq(spec, prompt),
                None => self.seqs.remove(&r.seq).ok_or_else(unknown_seq),
            };
            match seq {
                Ok(s) => batch.push((r.seq, s)),
                Err(e) => results.push((r.seq, Err(e.into()))),
            }
        }
        let runs = self.fit_kv_pool(&mut batch, &mut results);
        let demands: Vec<StepDemand> = batch
            .iter()
            .map(|(_, s)| StepDemand { prompt_left: s.prompt_left(), until_stop: s.stops.front().map(|&p| p.saturating_sub(s.fed)) })
            .collect();
        // Waiting sequences take no part in the step: they advance 0 tokens.
        let running: Vec<StepDemand> = demands.iter().zip(&runs).filter(|(_, r)| **r).map(|(d, _)| *d).collect();
        let mut planned = plan_step(&running, self.args.step_tokens.max(1)).into_iter();
        let counts: Vec<usize> = runs.iter().map(|&r| if r { planned.next().unwrap_or(0) } else { 0 }).collect();
        let decodes = demands.iter().zip(&counts).filter(|(d, &c)| d.prompt_left == 0 && c > 0).count();
        let prefill_tokens: usize = counts.iter().zip(&demands).filter(|(_, d)| d.prompt_left > 0).map(|(c, _)| c).sum();
        // Which sequences sample a token this step: decodes, and prompts that finish.
        let samples: Vec<bool> = counts.iter().zip(&demands).map(|(&c, d)| c > 0 && c == d.prompt_left.max(1)).collect();
        let start = Instant::now();
        let messaging_before = self.run.messaging_s;
        let phase_before = self.run.expert_phase_s;
        let read_before = crate::model::reads::total();
        // Grammar masks for this step are computed beside the forward pass, not after it.
        let mut constraints: Vec<Option<Constraint>> =
            batch.iter_mut().zip(&samples).map(|((_, s), &go)| if go { s.constraint.take() } else { None }).collect();
        let (logits, masks) = std::thread::scope(|scope| {
            let masks: Vec<_> = constraints.iter_mut().map(|c| c.as_mut().map(|c| scope.spawn(move || c.mask()))).collect();
            let mut items: Vec<BatchItem<'_>> = Vec::new();
            for ((_, s), (&c, &go)) in batch.iter_mut().zip(counts.iter().zip(&samples)) {
                if c == 0 {
                    continue;
                }
                let (tokens, logits) = if s.sampled {
                    (&s.history[s.history.len() - 1..], Logits::Last)
                } else {
                    (&s.history[s.fed..s.fed + c], if go { Logits::Last } else { Logits::None })
                };
                items.push(BatchItem { state: &mut s.state, tokens, logits });
            }
            let logits = self.forward_items(&mut items);
            (logits, masks.into_iter().map(|m| m.map(|h| h.join())).collect::<Vec<_>>())
        });
        let logits = match logits {
            Ok(l) => l,
            Err(e) => {
                // A failed step leaves every state in it half advanced. Alone, the sequence
                // fails; in a batch the fault may belong to another's part, so each is
                // recomputed from its tokens once before it is failed.
                let retry = counts.iter().filter(|&&c| c > 0).count() > 1;
                let e = EngineError::from(e);
                for (((id, mut s), c), &n) in batch.into_iter().zip(constraints).zip(&counts) {
                    s.constraint = s.constraint.or(c);
                    if n == 0 {
                        // It took no part in the step: untouched.
                        self.seqs.insert(id, s);
                        results.push((id, Ok(None)));
                        continue;
                    }
                    if retry && !s.retried && self.rebuild(&mut s).is_ok() {
                        self.dev.recomputes += 1;
                        self.seqs.insert(id, s);
                        results.push((id, Ok(None)));
                        continue;
                    }
                    s.broken = true;
                    self.seqs.insert(id, s);
                    results.push((id, Err(e.clone())));
                }
                return results;
            }
        };
        let elapsed = start.elapsed().as_secs_f64();
        self.dev.steps += 1;
        self.dev.max_step_s = self.dev.max_step_s.max(elapsed);
        self.dev.step_sequences += counts.iter().filter(|&&c| c > 0).count() as u64;
        self.dev.step_tokens += counts.iter().sum::<usize>() as u64;
        self.dev.max_batch = self.dev.max_batch.max(counts.iter().filter(|&&c| c > 0).count() as u64);
        self.dev.prefill_tokens += prefill_tokens as u64;
        if prefill_tokens == 0 && decodes > 0 {
            self.dev.decode_steps += 1;
            self.dev.decode_tokens += decodes as u64;
            self.dev.decode_s += elapsed;
            self.dev.decode_weight_bytes += crate::model::reads::total() - read_before;
            self.dev.actor_overhead_s += self.run.messaging_s - messaging_before;
            self.dev.decode_expert_s += self.run.expert_phase_s - phase_before;
        } else if decodes > 0 {
            self.dev.mixed_steps += 1;
        }
        let mut logits = logits.into_iter();
        for ((((id, mut s), &c), go), (constraint, mask)) in
            batch.into_iter().zip(&counts).zip(samples).zip(constraints.into_iter().zip(masks))
        {
            if c == 0 {
                self.seqs.insert(id, s);
                results.push((id, Ok(None)));
                continue;
            }
            let l = logits.next().unwrap_or_default();
            s.retried = false;
            let out = if s.sampled {
                if self.args.reuse.anchor_after_decode(s.history[s.history.len() - 1], s.state.len(), s.last_anchor) {
                    Self::record_anchor(&mut self.args.reuse, &mut s);
                }
                Self::sample(&mut s, l, constraint, mask).map(Some)
            } else {
                s.fed += c;
                let at_stop = s.stops.front() == Some(&s.fed);
                if at_stop {
                    s.stops.pop_front();
                }
                // Attention state is saved once, when the sequence ends (it covers the prompt
                // too); recurrent state must be captured at the stops and the prompt's end.
                if at_stop || (go && self.args.reuse.needs_snapshots()) {
                    Self::record_anchor(&mut self.args.reuse, &mut s);
                }
                if go {
                    s.sampled = true;
                    let cached = s.cached;
                    Self::sample(&mut s, l, constraint, mask).map(|o| Some(StepOutput { cached, ..o }))
                } else {
                    Ok(None)
                }
            };
            if out.is_err() {
                s.broken = true;
            }
            self.seqs.insert(id, s);
            results.push((id, out.map_err(EngineError::from)));
        }
        results
    }

    /// Samples the next token of `s` from `logits`, within the grammar's `mask` if any.
    fn sample(
        s: &mut Seq,
        logits: Vec<f32>,
        mut constraint: Option<Constraint>,
        mask: Option<std::thread::Result<Result<TokenMask, GrammarError>>>,
    ) -> Result<StepOutput, ModelError> {
        let mask = match mask {
            None => None,
            Some(Ok(Ok(m))) => Some(m),
            Some(Ok(Err(e))) => return Err(ModelError::Invalid(e.to_string())),
            Some(Err(_)) => return Err(ModelError::Invalid("constrained decoding failed".into())),
        };
        let token = match &mask {
            Some(m) => {
                let mut allowed = logits.clone();
                m.apply(&mut allowed);
                s.sampler.sample(&allowed, &s.history)
            }
            None => s.sampler.sample(&logits, &s.history),
        };
        if let Some(c) = constraint.as_mut() {
            c.consume(token).map_err(|e| ModelError::Invalid(e.to_string()))?;
        }
        s.constraint = constraint;
        s.history.push(token);
        let logprobs = s.logprobs.map(|n| crate::sampling::token_logprobs(&logits, token, n));
        Ok(StepOutput { token, logits: s.return_logits.then_some(logits), cached: 0, logprobs })
    }
}
