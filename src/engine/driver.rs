//! The sequence driver: admits requests, advances every running sequence together in one
//! batched step at a time (decodes and prompt chunks), turns sampled tokens into text and
//! events, and applies cache resizes at step boundaries. It never computes: steps go to the
//! device stream, which replies later.

use super::api::*;
use crate::actors::device::{DeviceMsg, SeqSpec, StepOutput, StepRequest};
use crate::sampling::StopChecker;
use crate::tokenizer::{StreamDecoder, Tokenizer};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;

/// Identifies a sequence inside the engine.
pub type SeqId = u64;

/// Messages of the driver.
pub enum EngineMsg {
    /// A new generation.
    Submit { req: Box<EngineRequest>, events: mpsc::UnboundedSender<GenEvent>, reply: RpcReplyPort<Result<SeqId, EngineError>> },
    /// Stop a generation.
    Cancel { seq: SeqId },
    /// Full-sequence logits of a prompt.
    Logits { prompt: Vec<u32>, reply: RpcReplyPort<Result<Vec<f32>, EngineError>> },
    /// Change the expert cache capacity at the next step boundary.
    Resize { slots: u64, reply: RpcReplyPort<Result<u64, EngineError>> },
    /// Read the counters.
    Stats { reply: RpcReplyPort<Result<EngineStats, EngineError>> },
    /// Reset the counters.
    ResetStats { reply: RpcReplyPort<()> },
    /// A batched step the device stream finished: each sequence's next token (`None` while
    /// its prompt is being prefilled) or error; the whole step's error if it never ran.
    StepDone { results: Result<Vec<(SeqId, Result<Option<StepOutput>, EngineError>)>, EngineError> },
    /// A resize or logits job finished.
    ExclusiveDone,
}

/// What the driver needs to run.
pub struct DriverArgs {
    /// The device stream.
    pub device: ActorRef<DeviceMsg>,
    /// Facts (context, eos ids).
    pub info: Arc<EngineInfo>,
    /// For incremental detokenisation.
    pub tokenizer: Option<Arc<Tokenizer>>,
    /// Concurrency limits.
    pub max_active: usize,
    /// Queue limit.
    pub max_queue: usize,
}

struct Sequence {
    id: SeqId,
    req: Box<EngineRequest>,
    events: mpsc::UnboundedSender<GenEvent>,
    stops: StopChecker,
    decoder: Option<StreamDecoder>,
    eos: Vec<u32>,
    generated: usize,
    budget: usize,
    submitted: Instant,
    first_token: Option<Instant>,
    started: bool,
    cached: usize,
}

/// The driver's state.
pub struct DriverState {
    args: DriverArgs,
    next_id: SeqId,
    queue: VecDeque<Sequence>,
    active: VecDeque<Sequence>,
    /// The sequences of the step in flight (empty: the device stream is idle).
    in_flight: Vec<SeqId>,
    busy_exclusive: bool,
    pending_resize: Vec<(u64, RpcReplyPort<Result<u64, EngineError>>)>,
    pending_logits: VecDeque<(Vec<u32>, RpcReplyPort<Result<Vec<f32>, EngineError>>)>,
    cancelled: Vec<SeqId>,
    stats: EngineStats,
}

/// The sequence driver actor.
pub struct EngineDriver;

/// Work that needs the device stream to itself.
enum ExclusiveJob {
    Resize(Vec<(u64, RpcReplyPort<Result<u64, EngineError>>)>),
    Logits(Vec<u32>, RpcReplyPort<Result<Vec<f32>, EngineError>>),
}

/// Calls the device stream and flattens its transport and job errors.
async fn ask_device<T: Send + 'static, E: Into<EngineError> + Send + 'static>(
    device: &ActorRef<DeviceMsg>,
    msg: impl FnOnce(RpcReplyPort<Result<T, E>>) -> DeviceMsg,
) -> Result<T, EngineError> {
    device
        .call(msg, None)
        .await
        .map_err(|_| EngineError::Stopped)?
        .success_or(EngineError::Stopped)?
        .map_err(Into::into)
}

impl DriverState {
    /// Text still held by the detokeniser and the stop checker, at the end of a sequence.
    fn drain_text(&self, seq: &mut Sequence) -> String {
        let mut text = String::new();
        if let (Some(dec), Some(tok)) = (seq.decoder.as_mut(), self.args.tokenizer.as_deref()) {
            if let Ok(Some(piece)) = dec.flush(tok) {
                let out = seq.stops.push(&piece);
                text.push_str(&out.text);
                if out.stopped {
                    return text;
                }
            }
        }
        text.push_str(&seq.stops.flush());
        text
    }

    fn finish(&mut self, seq: Sequence, finish: FinishReason, myself_device: &ActorRef<DeviceMsg>) {
        let now = Instant::now();
        let _ = seq.events.send(GenEvent::Done(Completion {
            finish,
            prompt_tokens: seq.req.prompt.len(),
            cached_tokens: seq.cached,
            completion_tokens: seq.generated,
            time_to_first_token: seq.first_token.map_or(now - seq.submitted, |t| t - seq.submitted),
            total_time: now - seq.submitted,
        }));
        self.stats.requests += 1;
        if seq.started {
            let _ = myself_device.cast(DeviceMsg::DropSeq { seq: seq.id });
        }
    }

    /// Sends `out`'s token as text; the sequence back if it runs on.
    fn deliver(&mut self, mut s: Sequence, out: StepOutput) -> Option<Sequence> {
        s.generated += 1;
        self.stats.tokens_generated += 1;
        let dev = self.args.device.clone();
        let (mut text, mut finish) = (String::new(), None);
        if s.eos.contains(&out.token) {
            finish = Some(FinishReason::Eos);
        } else if let (Some(dec), Some(tok)) = (s.decoder.as_mut(), self.args.tokenizer.as_deref()) {
            match dec.step(tok, out.token) {
                Ok(Some(piece)) => {
                    let o = s.stops.push(&piece);
                    text = o.text;
                    if o.stopped {
                        finish = Some(FinishReason::StopString);
                    }
                }
                Ok(None) => {}
                Err(e) => tracing::warn!("detokenisation failed: {e}"),
            }
        }
        if finish.is_none() && s.generated >= s.budget {
            finish = Some(FinishReason::Length);
        }
        if matches!(finish, Some(FinishReason::Eos | FinishReason::Length)) {
            text.push_str(&self.drain_text(&mut s));
        }
        let alive = s.events.send(GenEvent::Token { id: out.token, text, logits: out.logits, logprobs: out.logprobs }).is_ok();
        match finish {
            Some(f) => {
                self.finish(s, f, &dev);
                None
            }
            // The client went away: free its state now.
            None if !alive => {
                let _ = dev.cast(DeviceMsg::DropSeq { seq: s.id });
                None
            }
            None => Some(s),
        }
    }

    fn fail(&mut self, seq: Sequence, err: EngineError) {
        let _ = seq.events.send(GenEvent::Error(err));
        if seq.started {
            let _ = self.args.device.cast(DeviceMsg::DropSeq { seq: seq.id });
        }
    }
}

impl EngineDriver {
    /// Starts the next unit of work if the device stream is idle.
    fn schedule(&self, myself: &ActorRef<EngineMsg>, st: &mut DriverState) {
        if !st.in_flight.is_empty() || st.busy_exclusive {
            return;
        }
        // Resizes and logits jobs run alone, between steps (so no slot is leased then).
        let job: Option<ExclusiveJob> = if !st.pending_resize.is_empty() {
            Some(ExclusiveJob::Resize(std::mem::take(&mut st.pending_resize)))
        } else {
            st.pending_logits.pop_front().map(|(prompt, reply)| ExclusiveJob::Logits(prompt, reply))
        };
        if let Some(job) = job {
            st.busy_exclusive = true;
            let (device, me) = (st.args.device.clone(), myself.clone());
            tokio::spawn(async move {
                match job {
                    ExclusiveJob::Resize(resizes) => {
                        for (slots, reply) in resizes {
                            let _ = reply.send(ask_device(&device, |r| DeviceMsg::Resize { slots, reply: r }).await);
                        }
                    }
                    ExclusiveJob::Logits(prompt, reply) => {
                        let _ = reply.send(ask_device(&device, |r| DeviceMsg::FullLogits { prompt, reply: r }).await);
                    }
                }
                let _ = me.cast(EngineMsg::ExclusiveDone);
            });
            return;
        }
        while st.active.len() < st.args.max_active {
            match st.queue.pop_front() {
                Some(s) => st.active.push_back(s),
                None => break,
            }
        }
        if st.active.is_empty() {
            return;
        }
        let mut seqs = Vec::with_capacity(st.active.len());
        for seq in st.active.iter_mut() {
            let start = (!seq.started).then(|| {
                let spec = SeqSpec {
                    capacity: seq.req.prompt.len() + seq.budget,
                    sampling: seq.req.sampling.clone(),
                    return_logits: seq.req.return_logits,
                    logprobs: seq.req.logprobs,
                    constraint: seq.req.constraint.take(),
                };
                (spec, seq.req.prompt.clone())
            });
            seq.started = true;
            seqs.push(StepRequest { seq: seq.id, start });
        }
        st.in_flight = seqs.iter().map(|r| r.seq).collect();
        let device = st.args.device.clone();
        let me = myself.clone();
        tokio::spawn(async move {
            let results = match device.call(|reply| DeviceMsg::StepBatch { seqs, reply }, None).await {
                Ok(ractor::rpc::CallResult::Success(r)) => Ok(r),
                _ => Err(EngineError::Stopped),
            };
            let _ = me.cast(EngineMsg::StepDone { results });
        });
    }
}

impl Actor for EngineDriver {
    type Msg = EngineMsg;
    type State = DriverState;
    type Arguments = DriverArgs;

    async fn pre_start(&self, _myself: ActorRef<Self::Msg>, args: DriverArgs) -> Result<DriverState, ActorProcessingErr> {
        Ok(DriverState {
            args,
            next_id: 1,
            queue: VecDeque::new(),
            active: VecDeque::new(),
            in_flight: Vec::new(),
            busy_exclusive: false,
            pending_resize: vec![],
            pending_logits: VecDeque::new(),
            cancelled: vec![],
            stats: EngineStats::default(),
        })
    }

    async fn handle(&self, myself: ActorRef<Self::Msg>, msg: EngineMsg, st: &mut DriverState) -> Result<(), ActorProcessingErr> {
        match msg {
            EngineMsg::Submit { req, events, reply } => {
                let context = st.args.info.context;
                let err = if req.prompt.is_empty() {
                    Some(EngineError::InvalidRequest("the prompt is empty".into()))
                } else if req.prompt.len() >= context {
                    Some(EngineError::PromptTooLong { prompt: req.prompt.len(), context })
                } else if let Some(bad) = req.prompt.iter().find(|&&t| t as usize >= st.args.info.config.vocab_size) {
                    Some(EngineError::InvalidRequest(format!("token id {bad} is outside the vocabulary")))
                } else if let Err(e) = req.sampling.validate() {
                    Some(EngineError::InvalidRequest(e.to_string()))
                } else if st.queue.len() + st.active.len() >= st.args.max_queue + st.args.max_active {
                    // Free running places count too: a queue of 0 still admits up to max_active.
                    Some(EngineError::QueueFull(st.queue.len()))
                } else {
                    None
                };
                if let Some(e) = err {
                    let _ = reply.send(Err(e));
                    return Ok(());
                }
                let id = st.next_id;
                st.next_id += 1;
                let mut eos = if req.ignore_eos { vec![] } else { st.args.info.eos_ids.clone() };
                eos.extend(&req.stop_ids);
                let budget = req.max_tokens.min(context - req.prompt.len());
                let seq = Sequence {
                    id,
                    stops: StopChecker::new(req.stop.iter().cloned()),
                    decoder: st.args.tokenizer.as_ref().map(|t| t.stream_decoder(!req.keep_special_tokens)),
                    eos,
                    generated: 0,
                    budget,
                    req,
                    events,
                    submitted: Instant::now(),
                    first_token: None,
                    started: false,
                    cached: 0,
                };
                let _ = reply.send(Ok(id));
                if budget == 0 {
                    let dev = st.args.device.clone();
                    st.finish(seq, FinishReason::Length, &dev);
                } else {
                    st.queue.push_back(seq);
                }
            }
            EngineMsg::Cancel { seq } => {
                if let Some(pos) = st.queue.iter().position(|s| s.id == seq) {
                    st.queue.remove(pos);
                } else if st.in_flight.contains(&seq) {
                    st.cancelled.push(seq);
                } else if let Some(pos) = st.active.iter().position(|s| s.id == seq) {
                    if let Some(s) = st.active.remove(pos) {
                        let _ = st.args.device.cast(DeviceMsg::DropSeq { seq: s.id });
                    }
                }
            }
            EngineMsg::Logits { prompt, reply } => {
                let context = st.args.info.context;
                if prompt.is_empty() || prompt.len() > context {
                    let _ = reply.send(Err(EngineError::PromptTooLong { prompt: prompt.len(), context }));
                } else {
                    st.pending_logits.push_back((prompt, reply));
                }
            }
            EngineMsg::Resize { slots, reply } => st.pending_resize.push((slots, reply)),
            EngineMsg::Stats { reply } => {
                let device = st.args.device.clone();
                let own = st.stats.clone();
                let (active, queued) = (st.active.len(), st.queue.len());
                tokio::spawn(async move {
                    let r = match device.call(|r| DeviceMsg::Stats { reply: r }, None).await {
                        Ok(ractor::rpc::CallResult::Success(d)) => Ok(EngineStats {
                            tokens_generated: own.tokens_generated,
                            prompt_tokens: own.prompt_tokens,
                            requests: own.requests,
                            active,
                            queued,
                            ..d
                        }),
                        _ => Err(EngineError::Stopped),
                    };
                    let _ = reply.send(r);
                });
            }
            EngineMsg::ResetStats { reply } => {
                st.stats = EngineStats::default();
                let _ = st.args.device.cast(DeviceMsg::ResetStats);
                let _ = reply.send(());
            }
            EngineMsg::ExclusiveDone => st.busy_exclusive = false,
            EngineMsg::StepDone { results } => {
                let stepped = std::mem::take(&mut st.in_flight);
                let mut results: std::collections::HashMap<SeqId, Result<Option<StepOutput>, EngineError>> = match results {
                    Ok(r) => r.into_iter().collect(),
                    Err(e) => stepped.iter().map(|&id| (id, Err(e.clone()))).collect(),
                };
                // Sequences keep their order (the oldest prompt gets the chunk budget first).
                for mut s in std::mem::take(&mut st.active) {
                    let Some(result) = results.remove(&s.id) else {
                        st.active.push_back(s);
                        continue;
                    };
                    if let Some(c) = st.cancelled.iter().position(|c| *c == s.id) {
                        st.cancelled.swap_remove(c);
                        let _ = st.args.device.cast(DeviceMsg::DropSeq { seq: s.id });
                        continue;
                    }
                    match result {
                        Err(e) => st.fail(s, e),
                        Ok(None) => st.active.push_back(s),
                        Ok(Some(out)) => {
                            if s.generated == 0 {
                                st.stats.prompt_tokens += s.req.prompt.len() as u64;
                                s.cached = out.cached;
                                s.first_token = Some(Instant::now());
                            }
                            if let Some(s) = st.deliver(s, out) {
                                st.active.push_back(s);
                            }
                        }
                    }
                }
                // Every sequence of the step has its result now: no cancel is pending.
                st.cancelled.clear();
            }
        }
        self.schedule(&myself, st);
        Ok(())
    }
}
