//! Scheduling policy: the decisions the engine's actors act on, as plain Rust.
//!
//! Every choice that shapes performance — which expert occupies which device slot, how many
//! cache misses go over PCIe versus to the CPU, how a prompt is prefilled, how device memory
//! is divided, which measured bandwidths apply — lives here with no actors, no async and no
//! I/O (except reading and writing bandwidth profiles). The actors (router, cache manager,
//! transfer engine, CPU executors, device stream) own the state and the messages; this module
//! owns the arithmetic, so it can be unit-tested directly and reasoned about in isolation.
//!
//! - [`batch`]: how many tokens each running sequence advances in one batched step.
//! - [`executors`]: whether a layer's CPU experts run flat (one list of row chunks a phase)
//!   or side by side, each product split over the pool.
//! - [`anchors`]: the radix index of reusable prompt-prefix state for edited conversations.
//! - [`cache`]: the expert slot table — LRU with leases that pin slots and release on drop.
//! - [`split`]: the decode miss split `q` (fetch vs CPU) and which misses to fetch.
//! - [`mode`]: `--moe auto|offload|cpu|hybrid` and how `auto` resolves.
//! - [`planner`]: prefill by the decode path or by double-buffered layer streaming.
//! - [`budget`]: the device memory plan and the `--vram-budget` parser.
//! - [`kv_pool`]: the KV pool's size, and which sequences run or are preempted when it fills.
//! - [`profile`]: stored bandwidth measurements per machine, and config overrides.
//! - [`fit`]: `ft-actor plan`'s decode prediction and the cache hit rate it assumes.
//! - [`host_copy`]: whether a layer's routed experts leave the file mapping for huge pages.

pub mod anchors;
pub mod batch;
pub mod budget;
pub mod cache;
pub mod executors;
pub mod fit;
pub mod host_copy;
pub mod kv_pool;
pub mod mode;
pub mod planner;
pub mod profile;
pub mod split;

pub use anchors::{
    hash_step, prefix_hash, Anchor, AnchorError, AnchorId, AnchorIndex, AnchorStats, Inserted,
    Match as AnchorMatch,
};
pub use batch::{plan_step, StepDemand, MIN_PREFILL_CHUNK};
pub use budget::{
    format_bytes, parse_bytes, plan_memory, KvReserve, MemoryInputs, MemoryPlan, ParseBytesError,
    VramBudget,
};
pub use kv_pool::{plan_kv, rows_after, size_kv_pool, KvDecision, KvPoolPlan, KvUse};
pub use cache::{CacheError, CacheStats, ExpertCache, ExpertKey, Insert, Lease, SlotId};
pub use mode::{MoeMode, ParseMoeModeError, ResolvedMode};
pub use planner::{
    estimate_layer, expected_distinct_experts, plan_prefill, LayerEstimate, PrefillInputs,
    PrefillPath, PrefillPlan, Residency,
};
pub use profile::{
    machine_id, profile_key, resolve as resolve_bandwidths, BandwidthProfile, BandwidthSource,
    ProfileError, ResolvedBandwidths,
};
pub use split::{
    choose_q, choose_q_branches, choose_q_capped, q_star, select_fetches, BranchCosts,
    SplitAssignment, SplitCosts, UsageTracker,
};
