//! The device stream: owns the model's device weights and every sequence's state, and runs
//! forward steps on a dedicated worker thread (the actor itself only forwards messages, so
//! its async handler never computes).

use super::cache::CacheMsg;
use super::pipeline::{PipelineExperts, PipelineLinks, RunStats, StreamingExperts};
use super::router::RouterMsg;
use super::blocking_reply;
use crate::model::fault::PipelineFault;
use crate::model::ModelError;
use crate::policy::{CacheError, MoeMode};
use ft_backend::BackendError;
use crate::engine::{EngineStats, LayerStats, PrefillMode};
use crate::kv::reuse::PrefixStore;
use crate::kv::SequenceState;
use crate::model::{Logits, Model};
use crate::policy::{plan_prefill, PrefillInputs, PrefillPath, Residency, ResolvedMode};
use crate::sampling::{Sampler, SamplingParams};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use std::collections::HashMap;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Instant;

/// How a sequence starts.
#[derive(Clone, Debug)]
pub struct SeqSpec {
    /// Tokens of state to allocate.
    pub capacity: usize,
    /// Sampling.
    pub sampling: SamplingParams,
    /// Return each step's logits.
    pub return_logits: bool,
    /// Return each token's log-probability and this many alternatives'.
    pub logprobs: Option<usize>,
    /// What the output must match (constrained decoding).
    pub constraint: Option<crate::sampling::grammar::Constraint>,
}

/// The result of one step.
#[derive(Clone, Debug)]
pub struct StepOutput {
    /// The sampled token.
    pub token: u32,
    /// The logits it was sampled from, if asked for.
    pub logits: Option<Vec<f32>>,
    /// Prompt tokens restored from saved state instead of prefilled (first step only).
    pub cached: usize,
    /// The token's log-probability and alternatives, if asked for.
    pub logprobs: Option<crate::sampling::TokenLogprobs>,
}

/// Messages of the device stream.
pub enum DeviceMsg {
    /// Run a step of `seq`: the prompt (first step, with `spec`) or the last sampled token
    /// (`tokens` empty); sample the next token.
    Step { seq: u64, spec: Option<SeqSpec>, tokens: Vec<u32>, reply: RpcReplyPort<Result<StepOutput, ModelError>> },
    /// Full-sequence logits of a prompt on a scratch sequence.
    FullLogits { prompt: Vec<u32>, reply: RpcReplyPort<Result<Vec<f32>, ModelError>> },
    /// Free a sequence's state.
    DropSeq { seq: u64 },
    /// Change the expert cache capacity (the driver sends it between steps).
    Resize { slots: u64, reply: RpcReplyPort<Result<u64, ResizeError>> },
    /// Counters.
    Stats { reply: RpcReplyPort<EngineStats> },
    /// Reset counters.
    ResetStats,
}

/// Why the expert cache was not resized (the cache is then as it was).
#[derive(Debug, thiserror::Error)]
pub enum ResizeError {
    /// More slots than the memory budget holds.
    #[error("{requested} expert cache slots need {need_gib:.2} GiB, but the memory budget has room for {max} slots; ask for {max} or fewer")]
    OverBudget {
        /// Slots asked for.
        requested: u64,
        /// Their size in GiB.
        need_gib: f64,
        /// The most the budget holds.
        max: u64,
    },
    /// The device has no kernel for the experts' block type, so it cannot use a cache.
    #[error("the device has no matmul kernel for the experts' block type, so they all run on the CPU and an expert cache would never be used")]
    NoDeviceExperts,
    /// The device could not allocate the new slots.
    #[error("allocating {requested} expert cache slots failed: {source}")]
    Alloc {
        /// Slots asked for.
        requested: u64,
        /// What the backend said.
        #[source]
        source: BackendError,
    },
    /// The slot table refused (a slot still leased).
    #[error(transparent)]
    Cache(#[from] CacheError),
    /// An actor stopped.
    #[error(transparent)]
    Pipeline(#[from] PipelineFault),
}

/// What the device stream needs.
pub struct DeviceArgs {
    /// The loaded model.
    pub model: Arc<Model>,
    /// Links to the other actors.
    pub links: PipelineLinks,
    /// The cache manager (for resizes and stats).
    pub cache: ActorRef<CacheMsg>,
    /// Miss policy in effect (to choose the prefill path); resizes change it.
    pub mode: ResolvedMode,
    /// The miss policy asked for, resolved again after each resize.
    pub moe: MoeMode,
    /// The most expert cache slots the memory budget holds (resizes stop there).
    pub max_cache_slots: u64,
    /// Whether the device can compute the experts (has a matmul kernel for their type).
    pub device_experts: bool,
    /// Prefill choice.
    pub prefill: PrefillMode,
    /// Bandwidths for the planner: (b_p, b_h).
    pub bandwidths: (f64, f64),
    /// Whether layer buffers fit the memory plan.
    pub streaming_available: bool,
    /// Saved prefix states for agent-aware reuse.
    pub reuse: PrefixStore,
}

/// The device stream actor.
pub struct DeviceStream;

fn unknown_seq() -> ModelError {
    ModelError::Invalid("unknown sequence".into())
}

/// The actor's state: the channel to its worker.
pub struct DeviceState {
    jobs: mpsc::Sender<DeviceMsg>,
}

struct Seq {
    state: SequenceState,
    sampler: Sampler,
    history: Vec<u32>,
    return_logits: bool,
    logprobs: Option<usize>,
    constraint: Option<crate::sampling::grammar::Constraint>,
    /// State length at the last recorded anchor.
    last_anchor: usize,
    /// A step failed, so the state may not match `history`: never save it.
    broken: bool,
}

struct Worker {
    args: DeviceArgs,
    seqs: HashMap<u64, Seq>,
    run: RunStats,
    dev: EngineStats,
    moe_layers: Vec<usize>,
    /// Why the mode in effect was chosen.
    mode_why: &'static str,
}

impl Worker {
    fn use_streaming(&self, tokens: usize) -> bool {
        if tokens <= 1 || !self.args.streaming_available || self.moe_layers.is_empty() {
            return false;
        }
        match self.args.prefill {
            PrefillMode::Decode => false,
            PrefillMode::Stream => true,
            PrefillMode::Auto => {
                let cfg = self.args.model.config();
                let shape = self.args.links.pool.shape();
                let (b_p, b_h) = self.args.bandwidths;
                let flops = 6.0 * (shape.inter * shape.hidden) as f64;
                let inputs = PrefillInputs {
                    tokens,
                    experts: cfg.num_experts,
                    top_k: cfg.top_k,
                    moe_layers: self.moe_layers.len(),
                    residency: Residency::CachedExperts(self.args.links.pool.len() / self.moe_layers.len()),
                    expert_bytes: shape.bytes(),
                    b_p,
                    b_h,
                    expert_flops_per_token: flops,
                    // Expert matmuls stream weights once per batch; without a measured FLOP
                    // rate, assume both sides run at the rate they stream weights.
                    device_flops: b_p.max(b_h) * 2.0,
                    cpu_flops: b_h * 2.0,
                    non_expert_s_per_token: 0.0,
                    transfer_latency_s: 20e-6,
                    cpu_job_latency_s: 20e-6,
                    mode: self.args.mode,
                    streaming_available: true,
                };
                plan_prefill(&inputs).path == PrefillPath::LayerStreaming
            }
        }
    }

    fn forward(&mut self, seq: u64, tokens: &[u32], logits: Logits) -> Result<Vec<f32>, ModelError> {
        let streaming = self.use_streaming(tokens.len());
        let model = self.args.model.clone();
        let s = self.seqs.get_mut(&seq).ok_or_else(unknown_seq)?;
        let first_moe_layer = self.moe_layers.first().copied().unwrap_or(0);
        let r = if streaming {
            let mut runner = StreamingExperts::new(&self.args.links, &mut self.run, self.moe_layers.clone());
            model.forward_with(&mut s.state, tokens, logits, None, &mut runner)
        } else {
            let mut runner = PipelineExperts { links: &self.args.links, stats: &mut self.run, first_moe_layer };
            model.forward_with(&mut s.state, tokens, logits, None, &mut runner)
        };
        r
    }

    fn step(&mut self, seq: u64, spec: Option<SeqSpec>, tokens: Vec<u32>) -> Result<StepOutput, ModelError> {
        let r = self.step_inner(seq, spec, tokens);
        if r.is_err() {
            if let Some(s) = self.seqs.get_mut(&seq) {
                s.broken = true;
            }
        }
        r
    }

    fn step_inner(&mut self, seq: u64, spec: Option<SeqSpec>, tokens: Vec<u32>) -> Result<StepOutput, ModelError> {
        let mut cached = 0;
        if let Some(spec) = spec {
            let mut state = SequenceState::new(&self.args.model, spec.capacity)?;
            cached = self.args.reuse.restore(&tokens, &mut state);
            let sampler = Sampler::new(spec.sampling).map_err(|e| ModelError::Invalid(e.to_string()))?;
            let s = Seq {
                state,
                sampler,
                history: vec![],
                return_logits: spec.return_logits,
                logprobs: spec.logprobs,
                constraint: spec.constraint,
                last_anchor: cached,
                broken: false,
            };
            self.seqs.insert(seq, s);
        }
        let s = self.seqs.get_mut(&seq).ok_or_else(unknown_seq)?;
        let prompt = !tokens.is_empty();
        let tokens = if prompt {
            s.history.extend(&tokens);
            tokens
        } else {
            vec![*s.history.last().ok_or_else(|| ModelError::Invalid("no token to continue from".into()))?]
        };
        let start = Instant::now();
        let messaging_before = self.run.messaging_s;
        let phase_before = self.run.expert_phase_s;
        let read_before = crate::model::reads::total();
        // The grammar's mask for this step is computed beside the forward pass, not after it.
        let mut constraint = self.seqs.get_mut(&seq).and_then(|s| s.constraint.take());
        let (logits, mask) = std::thread::scope(|scope| {
            let mask = constraint.as_mut().map(|c| scope.spawn(move || c.mask()));
            let logits = if prompt { self.prefill(seq, &tokens, cached) } else { self.forward(seq, &tokens, Logits::Last) };
            (logits, mask.map(|h| h.join()))
        });
        let logits = logits?;
        let mask = match mask {
            None => None,
            Some(Ok(Ok(m))) => Some(m),
            Some(Ok(Err(e))) => return Err(ModelError::Invalid(e.to_string())),
            Some(Err(_)) => return Err(ModelError::Invalid("constrained decoding failed".into())),
        };
        self.dev.steps += 1;
        if !prompt {
            self.dev.decode_steps += 1;
            self.dev.decode_s += start.elapsed().as_secs_f64();
            self.dev.decode_weight_bytes += crate::model::reads::total() - read_before;
            self.dev.actor_overhead_s += self.run.messaging_s - messaging_before;
            self.dev.decode_expert_s += self.run.expert_phase_s - phase_before;
            let s = self.seqs.get_mut(&seq).ok_or_else(unknown_seq)?;
            if self.args.reuse.anchor_after_decode(tokens[0], s.state.len(), s.last_anchor) {
                self.save_anchor(seq);
            }
        }
        let s = self.seqs.get_mut(&seq).ok_or_else(unknown_seq)?;
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
        Ok(StepOutput { token, logits: s.return_logits.then_some(logits), cached, logprobs })
    }

    /// Runs a prompt from `cached` on, pausing where anchors are to be recorded.
    fn prefill(&mut self, seq: u64, prompt: &[u32], cached: usize) -> Result<Vec<f32>, ModelError> {
        let mut at = cached;
        for stop in self.args.reuse.prefill_stops(prompt, cached) {
            self.forward(seq, &prompt[at..stop], Logits::None)?;
            self.dev.prefill_tokens += (stop - at) as u64;
            at = stop;
            self.save_anchor(seq);
        }
        let logits = self.forward(seq, &prompt[at..], Logits::Last)?;
        self.dev.prefill_tokens += (prompt.len() - at) as u64;
        // Attention state is saved once, when the sequence ends (it covers the prompt too);
        // recurrent state must be captured here or never.
        if self.args.reuse.needs_snapshots() {
            self.save_anchor(seq);
        }
        Ok(logits)
    }

    /// Records the sequence's current state as an anchor (a failure only costs reuse).
    fn save_anchor(&mut self, seq: u64) {
        let Some(s) = self.seqs.get_mut(&seq) else { return };
        if s.broken || !self.args.reuse.enabled() {
            return;
        }
        let len = s.state.len();
        match s.history.get(..len) {
            Some(tokens) => {
                if let Err(e) = self.args.reuse.record(tokens, &s.state) {
                    tracing::warn!("prefix reuse: anchor at {len} tokens not saved: {e}");
                }
                s.last_anchor = len;
            }
            None => tracing::warn!("prefix reuse: state of {len} tokens is longer than its history"),
        }
    }

    /// Changes the cache capacity between steps: bounded by the budget, new slots allocated
    /// before the slot table may hand them out, everything as it was if any part fails, and
    /// the miss policy resolved again (slots make fetching possible, none make it impossible).
    fn resize(&mut self, slots: u64) -> Result<u64, ResizeError> {
        let pool = self.args.links.pool.clone();
        let old = pool.len() as u64;
        if slots > 0 && !self.args.device_experts {
            return Err(ResizeError::NoDeviceExperts);
        }
        if slots > self.args.max_cache_slots && slots > old {
            let need_gib = (slots * pool.shape().bytes()) as f64 / (1u64 << 30) as f64;
            return Err(ResizeError::OverBudget { requested: slots, need_gib, max: self.args.max_cache_slots.max(old) });
        }
        let table = |slots| -> Result<(), ResizeError> {
            let (tx, rx) = tokio::sync::oneshot::channel();
            self.args.cache.cast(CacheMsg::Resize { slots, reply: tx.into() }).map_err(|_| PipelineFault::Stopped("cache manager"))?;
            blocking_reply(rx, "cache manager")??;
            Ok(())
        };
        if slots >= old {
            pool.resize(slots as usize).map_err(|source| ResizeError::Alloc { requested: slots, source })?;
            if let Err(e) = table(slots) {
                let _ = pool.resize(old as usize);
                return Err(e);
            }
        } else {
            table(slots)?;
            pool.resize(slots as usize).map_err(|source| ResizeError::Alloc { requested: slots, source })?;
        }
        let (mode, why) = self.args.moe.resolve_explained(self.args.bandwidths.0, self.args.bandwidths.1, slots as usize);
        if mode != self.args.mode {
            tracing::info!("expert cache resized to {slots} slots: MoE mode {:?} → {mode:?} ({why})", self.args.mode);
            self.args.links.router.cast(RouterMsg::SetMode(mode)).map_err(|_| PipelineFault::Stopped("router"))?;
            self.args.mode = mode;
        }
        self.mode_why = why;
        Ok(slots)
    }

    fn stats(&mut self) -> EngineStats {
        let mut d = self.dev.clone();
        d.reuse = self.args.reuse.stats();
        let mut layers: Vec<(usize, LayerStats)> = self.run.layers.iter().map(|(l, s)| (*l, s.clone())).collect();
        layers.sort_by_key(|(l, _)| *l);
        d.total = LayerStats::default();
        for (_, s) in &layers {
            d.total.add(s);
        }
        d.layers = layers;
        let (tx, rx) = tokio::sync::oneshot::channel();
        if self.args.cache.cast(CacheMsg::Stats { reply: tx.into() }).is_ok() {
            if let Ok(c) = blocking_reply(rx, "cache manager") {
                d.cache = c.stats;
                d.cache_slots = c.capacity;
                d.cache_used = c.used;
                d.cache_leased = c.leased;
            }
        }
        d.moe_mode = format!("{} → {:?} ({})", self.args.moe, self.args.mode, self.mode_why);
        d.sequences = self.seqs.len();
        d
    }

    fn run(mut self, jobs: mpsc::Receiver<DeviceMsg>) {
        while let Ok(msg) = jobs.recv() {
            match msg {
                DeviceMsg::Step { seq, spec, tokens, reply } => {
                    let _ = reply.send(self.step(seq, spec, tokens));
                }
                DeviceMsg::FullLogits { prompt, reply } => {
                    let r = (|| {
                        const SCRATCH: u64 = u64::MAX;
                        let state = SequenceState::new(&self.args.model, prompt.len())?;
                        let sampler = Sampler::new(SamplingParams::greedy()).map_err(|e| ModelError::Invalid(e.to_string()))?;
                        let s = Seq { state, sampler, history: vec![], return_logits: false, logprobs: None, constraint: None, last_anchor: 0, broken: false };
                        self.seqs.insert(SCRATCH, s);
                        let r = self.forward(SCRATCH, &prompt, Logits::All);
                        self.seqs.remove(&SCRATCH);
                        r
                    })();
                    let _ = reply.send(r);
                }
                DeviceMsg::DropSeq { seq } => {
                    // The finished conversation is what the agent's next request continues.
                    self.save_anchor(seq);
                    self.seqs.remove(&seq);
                }
                DeviceMsg::Resize { slots, reply } => {
                    let _ = reply.send(self.resize(slots));
                }
                DeviceMsg::Stats { reply } => {
                    let _ = reply.send(self.stats());
                }
                DeviceMsg::ResetStats => {
                    self.run = RunStats::default();
                    self.dev = EngineStats::default();
                    let _ = self.args.cache.cast(CacheMsg::ResetStats);
                }
            }
        }
    }
}

impl Actor for DeviceStream {
    type Msg = DeviceMsg;
    type State = DeviceState;
    type Arguments = DeviceArgs;

    async fn pre_start(&self, _me: ActorRef<DeviceMsg>, args: DeviceArgs) -> Result<DeviceState, ActorProcessingErr> {
        let moe_layers = (0..args.model.config().num_layers).filter(|l| args.model.config().moe_layers[*l]).collect();
        let (_, mode_why) = args.moe.resolve_explained(args.bandwidths.0, args.bandwidths.1, args.links.pool.len());
        let worker = Worker { args, seqs: HashMap::new(), run: RunStats::default(), dev: EngineStats::default(), moe_layers, mode_why };
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new().name("ft-device-stream".into()).spawn(move || worker.run(rx))?;
        Ok(DeviceState { jobs: tx })
    }

    async fn handle(&self, _me: ActorRef<DeviceMsg>, msg: DeviceMsg, st: &mut DeviceState) -> Result<(), ActorProcessingErr> {
        st.jobs.send(msg).map_err(|_| "device stream worker stopped")?;
        Ok(())
    }
}
