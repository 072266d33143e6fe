//! The engine's memory plan from its configuration, the model's sizes and the device: the
//! inputs `policy::plan_memory` divides, gathered in one place so that `ft-actor info`, the
//! engine and the tests of the shipped configurations plan the same way.

use super::api::{EngineConfig, PrefillMode};
use crate::policy::{plan_memory, KvReserve, MemoryInputs, MemoryPlan};
use ft_backend::MemoryInfo;

/// The model's sizes the plan needs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PlanFacts {
    /// Embeddings, attention, norms, routers, shared experts and the head, in bytes.
    pub non_expert_bytes: u64,
    /// Per-token cache bytes of all layers together.
    pub kv_bytes_per_token: u64,
    /// Fixed-size (recurrent) state bytes per sequence.
    pub state_bytes_per_sequence: u64,
    /// Bytes of one routed expert (one cache slot).
    pub expert_bytes: u64,
    /// Routed experts per MoE layer.
    pub experts_per_layer: u64,
    /// MoE layers.
    pub moe_layers: u64,
}

/// Where the device is and what it can compute.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanDevice {
    /// Free and total memory at start-up.
    pub memory: MemoryInfo,
    /// The backend is the CPU itself: weights stay in the mapped files and no expert cache is
    /// kept unless asked for.
    pub cpu: bool,
    /// The device has a matmul kernel for the experts' format.
    pub experts: bool,
}

/// Bytes of saved prefix state kept in device memory: as configured; on the CPU all of it;
/// on a GPU 5 % of its memory, at most 1 GiB.
pub fn reuse_device_bytes(config: &EngineConfig, device: &PlanDevice) -> u64 {
    match (config.prefix_cache_device_budget, device.cpu) {
        (Some(b), _) => b.min(config.prefix_cache_budget),
        (None, true) => config.prefix_cache_budget,
        (None, false) => (device.memory.total / 20).min(1 << 30).min(config.prefix_cache_budget),
    }
}

/// The memory plan for `config` with a context of `context` tokens.
pub fn plan_engine_memory(config: &EngineConfig, facts: &PlanFacts, context: usize, device: &PlanDevice) -> MemoryPlan {
    let slots_override = match (config.expert_cache_slots, device.cpu, config.vram_budget) {
        _ if !device.experts => Some(0),
        (Some(n), _, _) => Some(n),
        (None, true, crate::policy::VramBudget::Auto) => Some(0),
        _ => None,
    };
    plan_memory(&MemoryInputs {
        device_free: device.memory.free,
        device_total: device.memory.total,
        budget: config.vram_budget,
        non_expert_bytes: if device.cpu { 0 } else { facts.non_expert_bytes },
        kv: KvReserve {
            bytes_per_token: facts.kv_bytes_per_token,
            context: context as u64,
            sequences: config.max_active as u64,
            pool: config.kv_budget,
        },
        // Recurrent layers keep a fixed-size state per sequence beside the per-token caches.
        // Saved prefix states kept on a GPU are reserved like scratch.
        scratch_bytes: (64 << 20)
            + facts.state_bytes_per_sequence * config.max_active as u64
            + if device.cpu { 0 } else { reuse_device_bytes(config, device) },
        expert_bytes: facts.expert_bytes,
        experts_per_layer: facts.experts_per_layer,
        moe_layers: facts.moe_layers,
        streaming_prefill: config.prefill != PrefillMode::Decode && device.experts,
        cache_slots_override: slots_override,
    })
}
