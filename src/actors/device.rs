//! The device stream: owns the model's device weights and every sequence's state, and runs
//! forward steps on a dedicated worker thread (the actor itself only forwards messages, so
//! its async handler never computes).

mod step;

use super::cache::CacheMsg;
use super::pipeline::{PipelineLinks, RunStats};
use super::router::RouterMsg;
use super::blocking_reply;
use crate::model::fault::PipelineFault;
use crate::model::ModelError;
use crate::policy::{CacheError, MoeMode};
use ft_backend::BackendError;
use crate::engine::{EngineError, EngineStats, LayerStats, PrefillMode};
use crate::kv::reuse::PrefixStore;
use crate::kv::{PagePool, SequenceState, SharedPool};
use crate::model::batch::BatchItem;
use crate::model::{Logits, Model};
use crate::policy::{plan_prefill, PrefillInputs, PrefillPath, Residency, ResolvedMode};
use crate::sampling::{Sampler, SamplingParams};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use std::collections::HashMap;
use std::sync::mpsc;
use std::sync::Arc;

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

/// One sequence of a [`DeviceMsg::StepBatch`].
#[derive(Clone, Debug)]
pub struct StepRequest {
    /// The sequence.
    pub seq: u64,
    /// Its prompt and settings, the first time it is named.
    pub start: Option<(SeqSpec, Vec<u32>)>,
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
    /// Advance every sequence in `seqs` (oldest first) by one batched step: a decoded token
    /// each for those decoding, a chunk of the prompt for those prefilling, as
    /// [`crate::policy::plan_step`] divides the step's token budget. Each gets back its next
    /// token, `None` while its prompt is still being prefilled, or its error.
    StepBatch { seqs: Vec<StepRequest>, reply: RpcReplyPort<Vec<(u64, Result<Option<StepOutput>, EngineError>)>> },
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
    /// Most tokens one batched step runs (decodes plus prompt chunks).
    pub step_tokens: usize,
    /// Bytes the sequences' per-token caches may hold together (the KV pool).
    pub kv_pool: u64,
    /// What the per-token caches hold.
    pub kv_dtype: ft_backend::DType,
    /// Rows per page of the KV pool.
    pub kv_page_rows: usize,
    /// The worker pool a step runs inside when the backend computes on it (the CPU backend):
    /// then the glue between products runs on a worker too, and the pool's threads hand work
    /// to each other instead of waking this thread and being woken by it once per product.
    pub host_pool: Option<Arc<rayon::ThreadPool>>,
}

/// The device stream actor.
pub struct DeviceStream;

/// Pages left beyond the plan's share, for the page a copy on write takes before it gives
/// the shared one back.
const SPARE_PAGES: usize = 64;

/// The KV pool: room for the sequences' share (`kv_pool`) and the prefix store's device
/// share, taken as it is used.
fn kv_pages(args: &DeviceArgs) -> Result<Option<SharedPool>, ModelError> {
    let model = &args.model;
    if !PagePool::needed(model) {
        return Ok(None);
    }
    let rows = args.kv_page_rows.max(1);
    let page_bytes = (SequenceState::bytes_per_token_as(model, args.kv_dtype) * rows).max(1) as u64;
    let share = args.kv_pool.saturating_add(args.reuse.device_budget());
    let max = (share / page_bytes) as usize + SPARE_PAGES;
    Ok(Some(PagePool::new(model, args.kv_dtype, rows, max.min(u32::MAX as usize))?.shared()))
}

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
    /// Tokens of `history` already in `state` while the prompt is being prefilled.
    fed: usize,
    /// Prompt positions where the prefill pauses to record an anchor.
    stops: std::collections::VecDeque<usize>,
    /// Prompt tokens restored from the prefix store, reported with the first token.
    cached: usize,
    /// Whether a token has been sampled yet (the prompt is all in the state).
    sampled: bool,
    /// Whether its last step failed and it was recomputed (a second failure fails it).
    retried: bool,
    /// Waiting for room in the KV pool (never started, or preempted): it holds a one-row
    /// state and is rebuilt from `history` when it runs again.
    waiting: bool,
}

impl Seq {
    /// Prompt tokens not yet in the state.
    fn prompt_left(&self) -> usize {
        if self.sampled {
            0
        } else {
            self.history.len() - self.fed
        }
    }
}

struct Worker {
    args: DeviceArgs,
    /// The pages every sequence's and saved prefix's attention rows live in (`None`: the
    /// model keeps no paged cache).
    pages: Option<SharedPool>,
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

    /// Records the sequence's current state as an anchor (a failure only costs reuse).
    fn save_anchor(&mut self, seq: u64) {
        if let Some(s) = self.seqs.get_mut(&seq) {
            Self::record_anchor(&mut self.args.reuse, s);
        }
    }

    /// Saves `s`'s state in `reuse` under the tokens it holds.
    fn record_anchor(reuse: &mut PrefixStore, s: &mut Seq) {
        if s.broken || s.waiting || !reuse.enabled() {
            return;
        }
        let len = s.state.len();
        match s.history.get(..len) {
            Some(tokens) => {
                if let Err(e) = reuse.record(tokens, &s.state) {
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
        d.kv_pool_bytes = self.args.kv_pool;
        d.kv_used_bytes = self.seqs.values().filter(|s| !s.waiting).map(|s| s.state.held_bytes()).sum();
        d.kv_waiting = self.seqs.values().filter(|s| s.waiting).count() as u64;
        if let Some(pool) = &self.pages {
            let p = crate::kv::pages::lock(pool);
            (d.kv_pages_used, d.kv_pages_allocated) = (p.used_pages() as u64, p.allocated_pages() as u64);
            (d.kv_pages_max, d.kv_page_rows) = (p.max_pages() as u64, p.page_rows() as u64);
        }
        d
    }

    /// Runs `f` on a worker of the host pool when the backend computes there, else here.
    fn on_pool<R: Send>(&mut self, f: impl FnOnce(&mut Self) -> R + Send) -> R {
        match self.args.host_pool.clone() {
            Some(pool) => super::install_awake(&pool, || f(self)),
            None => f(self),
        }
    }

    fn run(mut self, jobs: mpsc::Receiver<DeviceMsg>) {
        while let Ok(msg) = jobs.recv() {
            match msg {
                DeviceMsg::StepBatch { seqs, reply } => {
                    let _ = reply.send(self.on_pool(|w| w.step_batch(seqs)));
                }
                DeviceMsg::FullLogits { prompt, reply } => {
                    let r = self.on_pool(|w| {
                        let mut state = SequenceState::new(&w.args.model, prompt.len())?;
                        let mut items = [BatchItem { state: &mut state, tokens: &prompt, logits: Logits::All }];
                        Ok(w.forward_items(&mut items)?.pop().unwrap_or_default())
                    });
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
        let pages = kv_pages(&args)?;
        let worker = Worker { args, pages, seqs: HashMap::new(), run: RunStats::default(), dev: EngineStats::default(), moe_layers, mode_why };
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new().name("ft-device-stream".into()).spawn(move || worker.run(rx))?;
        Ok(DeviceState { jobs: tx })
    }

    async fn handle(&self, _me: ActorRef<DeviceMsg>, msg: DeviceMsg, st: &mut DeviceState) -> Result<(), ActorProcessingErr> {
        st.jobs.send(msg).map_err(|_| "device stream worker stopped")?;
        Ok(())
    }
}
