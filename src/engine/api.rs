//! The types an application exchanges with the engine (requests, events, stats, errors).

use crate::policy::{CacheStats, MoeMode, VramBudget};
use crate::sampling::SamplingParams;
use crate::device::BackendChoice;
pub use ft_backend_cpu::QuantDot;
use std::path::PathBuf;
use std::time::Duration;

/// How to start an engine. Every field has a default; `model` defaults to the demo model.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Checkpoint folder (`None`: the built-in demo model).
    pub model: Option<PathBuf>,
    /// Backend to run on.
    pub backend: BackendChoice,
    /// Threads of the CPU backend and of the CPU expert executors.
    pub cpu_threads: Option<usize>,
    /// How CPU decode products meet block-quantized weights: `Int8` (activations quantized
    /// to int8, as llama.cpp does; about twice as fast for 4-bit types) or `Exact` (f32).
    pub quant_dot: QuantDot,
    /// Device memory the engine may use (`auto`: what is free, minus a margin).
    pub vram_budget: VramBudget,
    /// Number of expert cache slots, overriding the budget-derived number.
    pub expert_cache_slots: Option<u64>,
    /// Where expert cache misses are computed.
    pub moe_mode: MoeMode,
    /// How prompts are prefilled.
    pub prefill: PrefillMode,
    /// Context length per sequence (default: the model's maximum).
    pub ctx_size: Option<usize>,
    /// Sequences in flight at once (advanced together in batched steps); more wait in the queue.
    pub max_active: usize,
    /// Most tokens one batched step runs: a decoded token per running sequence, the rest
    /// for prompt chunks, so a long prompt arrives in chunks between decode steps.
    pub step_tokens: usize,
    /// Bytes of the KV pool every running sequence's per-token caches share (`None`: auto, a
    /// share of the device memory left after the weights; see `policy::kv_pool`). When the
    /// next step would overflow it, the youngest sequence is preempted and resumed later.
    pub kv_budget: Option<u64>,
    /// Rows per page of the KV pool (see `kv::pages`): less is wasted at each sequence's end
    /// with small pages, and the attention reads fewer, longer runs with large ones.
    pub kv_page_rows: usize,
    /// What the KV and latent caches hold: f16 (half the memory of f32, 11 significant bits,
    /// saturating at ±65504; the default), bf16 (the same memory, f32's range, 8 bits) or f32
    /// (exact). A backend that cannot store the narrow type keeps f32.
    pub kv_dtype: ft_backend::DType,
    /// Requests waiting beyond the active ones before new ones are refused.
    pub max_queue: usize,
    /// Host→device bandwidth (bytes/s), overriding measurement and profile.
    pub b_p: Option<f64>,
    /// CPU expert streaming rate (bytes/s), overriding measurement and profile.
    pub b_h: Option<f64>,
    /// Where bandwidth profiles are kept (`None`: the user cache folder; profiles off if none).
    pub cache_dir: Option<PathBuf>,
    /// Bytes of saved conversation state kept for prefix reuse (0: reuse off).
    pub prefix_cache_budget: u64,
    /// Of those, bytes kept in device memory (`None`: all of it on the CPU backend; on a GPU
    /// 5% of device memory, at most 1 GiB, taken from the expert cache).
    pub prefix_cache_device_budget: Option<u64>,
    /// Recurrent models: anchor every this many tokens of a stretch without a boundary.
    pub anchor_interval: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            model: None,
            backend: BackendChoice::Auto,
            cpu_threads: None,
            quant_dot: QuantDot::Int8,
            vram_budget: VramBudget::Auto,
            expert_cache_slots: None,
            moe_mode: MoeMode::Auto,
            prefill: PrefillMode::Auto,
            ctx_size: None,
            max_active: 4,
            step_tokens: 512,
            kv_budget: None,
            kv_page_rows: crate::kv::PAGE_ROWS,
            kv_dtype: ft_backend::DType::F16,
            max_queue: 64,
            b_p: None,
            b_h: None,
            cache_dir: None,
            prefix_cache_budget: 4 << 30,
            prefix_cache_device_budget: None,
            anchor_interval: 512,
        }
    }
}

/// How prompts are prefilled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PrefillMode {
    /// The planner chooses per prompt by estimated cost.
    #[default]
    Auto,
    /// Always the decode path (cache + miss split).
    Decode,
    /// Always whole-layer streaming with double buffering.
    Stream,
}

impl std::str::FromStr for PrefillMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "decode" => Ok(Self::Decode),
            "stream" => Ok(Self::Stream),
            o => Err(format!("unknown prefill mode `{o}` (auto, decode, stream)")),
        }
    }
}

/// One generation request.
#[derive(Clone, Debug)]
pub struct EngineRequest {
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Most new tokens (capped by the context).
    pub max_tokens: usize,
    /// Sampling parameters.
    pub sampling: SamplingParams,
    /// Extra stop strings.
    pub stop: Vec<String>,
    /// Extra ids that end generation (the model's own eos ids always do unless `ignore_eos`).
    pub stop_ids: Vec<u32>,
    /// Do not stop at the model's end-of-sequence ids.
    pub ignore_eos: bool,
    /// Send each step's logits with its token (tests and tools; costs a copy per token).
    pub return_logits: bool,
    /// Send each token's log-probability and the `n` most likely alternatives' (`Some(0)`:
    /// the token's alone).
    pub logprobs: Option<usize>,
    /// What the output must match ([`super::EngineHandle::compile_grammar`]).
    pub constraint: Option<crate::sampling::grammar::Constraint>,
    /// Keep special tokens in the streamed text (gpt-oss's harmony markers are special
    /// tokens that the output parser reads).
    pub keep_special_tokens: bool,
}

impl EngineRequest {
    /// Greedy generation of `max_tokens` after `prompt`.
    pub fn greedy(prompt: Vec<u32>, max_tokens: usize) -> Self {
        Self {
            prompt,
            max_tokens,
            sampling: SamplingParams::greedy(),
            stop: vec![],
            stop_ids: vec![],
            ignore_eos: false,
            return_logits: false,
            logprobs: None,
            constraint: None,
            keep_special_tokens: false,
        }
    }
}

/// Why a generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-sequence id.
    Eos,
    /// A stop string.
    StopString,
    /// `max_tokens` or the context was reached.
    Length,
}

/// What a generation stream yields.
#[derive(Clone, Debug)]
pub enum GenEvent {
    /// A new token and the text it completed (may be empty while a character is incomplete).
    Token {
        /// Token id.
        id: u32,
        /// Newly completed text (stop strings and eos are never included).
        text: String,
        /// The logits the token was sampled from, if requested.
        logits: Option<Vec<f32>>,
        /// Its log-probability and the most likely alternatives', if requested.
        logprobs: Option<crate::sampling::TokenLogprobs>,
    },
    /// The generation ended.
    Done(Completion),
    /// The generation failed; nothing follows.
    Error(EngineError),
}

/// Summary of a finished generation.
#[derive(Clone, Debug)]
pub struct Completion {
    /// Why it ended.
    pub finish: FinishReason,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Prompt tokens whose state was reused instead of prefilled.
    pub cached_tokens: usize,
    /// Tokens generated.
    pub completion_tokens: usize,
    /// Time from submission to the first token.
    pub time_to_first_token: Duration,
    /// Total time.
    pub total_time: Duration,
}

/// Why the engine refused or failed a call.
#[derive(Clone, Debug, thiserror::Error)]
pub enum EngineError {
    /// The request is invalid (empty prompt, bad sampling, too long).
    #[error("{0}")]
    InvalidRequest(String),
    /// The prompt does not fit the context.
    #[error("prompt has {prompt} tokens but the context holds {context}")]
    PromptTooLong { prompt: usize, context: usize },
    /// The queue is full.
    #[error("the request queue is full ({0} waiting)")]
    QueueFull(usize),
    /// A resize of the expert cache is in progress.
    #[error("the expert cache is being resized; retry shortly")]
    Resizing,
    /// The engine failed to start.
    #[error("engine start failed: {0}")]
    Start(String),
    /// The engine has stopped.
    #[error("the engine is not running")]
    Stopped,
    /// The device ran out of memory for this request; others hold it, so a retry can work.
    #[error("out of device memory: {0}")]
    OutOfMemory(String),
    /// The request conflicts with the engine's state or limits (e.g. a resize past the
    /// memory budget); the message says what would work.
    #[error("{0}")]
    Conflict(String),
    /// An internal fault.
    #[error("engine fault: {0}")]
    Internal(String),
}

impl From<crate::model::ModelError> for EngineError {
    fn from(e: crate::model::ModelError) -> Self {
        if e.is_out_of_memory() {
            EngineError::OutOfMemory(e.to_string())
        } else {
            EngineError::Internal(e.to_string())
        }
    }
}

impl From<crate::actors::device::ResizeError> for EngineError {
    fn from(e: crate::actors::device::ResizeError) -> Self {
        use crate::actors::device::ResizeError;
        match &e {
            ResizeError::OverBudget { .. } | ResizeError::NoDeviceExperts => EngineError::Conflict(e.to_string()),
            ResizeError::Alloc { source, .. } if crate::model::fault::is_out_of_memory(source) => EngineError::OutOfMemory(e.to_string()),
            _ => EngineError::Internal(e.to_string()),
        }
    }
}

/// Counters of one MoE layer (or all layers).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LayerStats {
    /// Routed (token-batch, expert) pairs found in the cache.
    pub hits: u64,
    /// Pairs not in the cache.
    pub misses: u64,
    /// Misses fetched into cache slots.
    pub fetched: u64,
    /// Misses computed by the CPU executors.
    pub cpu_computed: u64,
    /// Experts computed from a streamed layer buffer (prefill).
    pub streamed: u64,
    /// Bytes copied host→device.
    pub bytes_moved: u64,
    /// Seconds in device expert compute.
    pub device_s: f64,
    /// Seconds waiting for fetches.
    pub fetch_wait_s: f64,
    /// Seconds of CPU executor compute.
    pub cpu_s: f64,
}

impl LayerStats {
    /// Adds `o` into `self`.
    pub fn add(&mut self, o: &LayerStats) {
        self.hits += o.hits;
        self.misses += o.misses;
        self.fetched += o.fetched;
        self.cpu_computed += o.cpu_computed;
        self.streamed += o.streamed;
        self.bytes_moved += o.bytes_moved;
        self.device_s += o.device_s;
        self.fetch_wait_s += o.fetch_wait_s;
        self.cpu_s += o.cpu_s;
    }
    /// What was added to `earlier` to make `self` (the counters of the steps in between).
    pub fn since(&self, earlier: &LayerStats) -> LayerStats {
        LayerStats {
            hits: self.hits.saturating_sub(earlier.hits),
            misses: self.misses.saturating_sub(earlier.misses),
            fetched: self.fetched.saturating_sub(earlier.fetched),
            cpu_computed: self.cpu_computed.saturating_sub(earlier.cpu_computed),
            streamed: self.streamed.saturating_sub(earlier.streamed),
            bytes_moved: self.bytes_moved.saturating_sub(earlier.bytes_moved),
            device_s: self.device_s - earlier.device_s,
            fetch_wait_s: self.fetch_wait_s - earlier.fetch_wait_s,
            cpu_s: self.cpu_s - earlier.cpu_s,
        }
    }
    /// hits / (hits + misses).
    pub fn hit_rate(&self) -> f64 {
        let n = self.hits + self.misses;
        if n == 0 { 0.0 } else { self.hits as f64 / n as f64 }
    }
}

/// Everything the engine counts, readable at any time.
#[derive(Clone, Debug, Default)]
pub struct EngineStats {
    /// Per MoE layer index.
    pub layers: Vec<(usize, LayerStats)>,
    /// Sum over layers.
    pub total: LayerStats,
    /// Cache manager counters.
    pub cache: CacheStats,
    /// Expert cache capacity in slots.
    pub cache_slots: u64,
    /// Slots in use.
    pub cache_used: u64,
    /// Slots pinned by a lease when the counters were read (0 between steps).
    pub cache_leased: u64,
    /// The MoE mode in effect and why (a resize can change it).
    pub moe_mode: String,
    /// Sequence states the device stream holds (running ones; 0 when idle).
    pub sequences: usize,
    /// Forward steps run (prefill chunks and decode tokens).
    pub steps: u64,
    /// Decode steps: steps in which every sequence decoded one token (no prompt chunk).
    pub decode_steps: u64,
    /// Tokens those decode steps produced (one per sequence in each).
    pub decode_tokens: u64,
    /// Steps that ran prompt chunks and decodes together.
    pub mixed_steps: u64,
    /// Sum over steps of the sequences each advanced (÷ `steps`: the mean batch).
    pub step_sequences: u64,
    /// Sum over steps of the tokens each ran (÷ `steps`: tokens per step).
    pub step_tokens: u64,
    /// The most sequences one step advanced.
    pub max_batch: u64,
    /// Sequences recomputed from their tokens after a batched step they were in failed.
    pub recomputes: u64,
    /// Running sequences preempted because the next step would have overflowed the KV pool.
    pub preemptions: u64,
    /// Wall time of the longest batched step, seconds (what a running stream waits at most
    /// for its next token while a prompt chunk runs beside it).
    pub max_step_s: f64,
    /// Bytes of the KV pool.
    pub kv_pool_bytes: u64,
    /// Bytes of it the sequences' caches held after the last step.
    pub kv_used_bytes: u64,
    /// Sequences waiting for room in the KV pool after the last step (new or preempted).
    pub kv_waiting: u64,
    /// Pages of the KV pool held (by sequences and saved prefixes; a shared page once).
    pub kv_pages_used: u64,
    /// Pages the KV pool's buffers have room for now (they grow as pages are taken).
    pub kv_pages_allocated: u64,
    /// Most pages the KV pool may grow to.
    pub kv_pages_max: u64,
    /// Rows per page.
    pub kv_page_rows: u64,
    /// Seconds of decode step wall time.
    pub decode_s: f64,
    /// Weight bytes the decode steps read, from [`crate::model::reads`] (process-wide: exact
    /// while one engine runs in the process).
    pub decode_weight_bytes: u64,
    /// Seconds of decode wall time spent in actor messaging (round trips and queueing).
    pub actor_overhead_s: f64,
    /// Seconds of decode wall time in MoE expert phases (plan, expert compute or waiting for
    /// it, adding the outputs; messaging included); the rest of a step is attention, the dense
    /// layers, routing and the output head.
    pub decode_expert_s: f64,
    /// Tokens generated.
    pub tokens_generated: u64,
    /// Prompt tokens of finished prefills (reused ones included).
    pub prompt_tokens: u64,
    /// Prompt tokens actually run through the model (prefill work after reuse).
    pub prefill_tokens: u64,
    /// Agent-aware prefix reuse: saved states, budget, hits, reused tokens.
    pub reuse: crate::kv::reuse::ReuseStats,
    /// Requests completed.
    pub requests: u64,
    /// Sequences running.
    pub active: usize,
    /// Requests waiting.
    pub queued: usize,
}

impl EngineStats {
    /// Actor messaging as a fraction of decode wall time.
    pub fn actor_overhead_fraction(&self) -> f64 {
        if self.decode_s > 0.0 { self.actor_overhead_s / self.decode_s } else { 0.0 }
    }

    /// MoE expert phases as a fraction of decode wall time.
    pub fn expert_phase_fraction(&self) -> f64 {
        if self.decode_s > 0.0 { self.decode_expert_s / self.decode_s } else { 0.0 }
    }
}

/// Facts about a running engine.
#[derive(Clone, Debug)]
pub struct EngineInfo {
    /// Model folder.
    pub model_dir: PathBuf,
    /// Normalised model config.
    pub config: crate::model::ModelConfig,
    /// Size facts.
    pub stats: crate::model::info::ModelStats,
    /// Context per sequence.
    pub context: usize,
    /// Backend kind and device name.
    pub backend: String,
    /// Effective MoE mode.
    pub moe_mode: String,
    /// Measured or configured host→device bandwidth, bytes/s.
    pub b_p: f64,
    /// Measured or configured CPU expert rate, bytes/s.
    pub b_h: f64,
    /// Where the bandwidths came from.
    pub bandwidth_source: String,
    /// The memory plan.
    pub memory: crate::policy::MemoryPlan,
    /// What the KV caches hold (the configured type, or f32 where the backend lacks it).
    pub kv_dtype: ft_backend::DType,
    /// End-of-sequence ids.
    pub eos_ids: Vec<u32>,
}
