//! DeepSeek-V4 (transformers' `deepseek_v4`): weights as the published checkpoints name them,
//! and the forward pass. What differs from the other families: every token carries `hc_mult`
//! residual streams mixed by hyper-connections ([`hyper`]); attention is shared-KV multi-query
//! over a sliding window plus compressed entries ([`compress`]), chosen per query by a lightning
//! indexer in CSA layers ([`attention`]); MoE layers route by score (`sqrtsoftplus`) or by a
//! token-id table (hash layers), and every SwiGLU clamps its inputs.
//!
//! The projections, the attention and the routed experts run on the backend (the experts
//! through the same [`crate::model::forward::ExpertRunner`] as every family, so the expert
//! cache, the miss split and the pipeline apply unchanged); the hyper-connections, the
//! compressors and the indexer's scoring run on the host in f32.

mod attention;
mod compress;
mod forward;
pub mod hyper;
mod load;
mod rope;

pub use compress::{carry_len, Compressor};
pub use hyper::{HyperConnection, HyperHead};
pub use load::load_top;

use crate::model::config::V4Attention;
use crate::model::weights::Linear;

/// The lightning indexer of a CSA layer.
pub struct Indexer {
    /// Its own compressor over `index_head_dim`.
    pub compressor: Compressor,
    /// `[index_heads · index_head_dim, q_lora_rank]` query projection.
    pub q_b: Linear,
    /// `[index_heads, hidden]` per-head weights of a query's score.
    pub weights: Linear,
}

/// A DeepSeek-V4 layer's attention, hyper-connections and hash table (its MoE block is the
/// layer's ordinary [`crate::model::weights::FeedForward::Moe`]).
pub struct V4Layer {
    /// Attention kind.
    pub kind: V4Attention,
    /// `wq_a [q_lora, hidden]`.
    pub q_a: Linear,
    /// `q_norm [q_lora]`.
    pub q_a_norm: Vec<f32>,
    /// `wq_b [heads · head_dim, q_lora]`.
    pub q_b: Linear,
    /// `wkv [head_dim, hidden]`: the single shared key/value head.
    pub kv: Linear,
    /// `kv_norm [head_dim]`.
    pub kv_norm: Vec<f32>,
    /// `wo_a [o_groups · o_lora, heads · head_dim / o_groups]`, one block per group.
    pub o_a: Linear,
    /// `wo_b [hidden, o_groups · o_lora]`.
    pub o_b: Linear,
    /// Per-head softmax sinks.
    pub sinks: Vec<f32>,
    /// The compressor of CSA and HCA layers.
    pub compressor: Option<Compressor>,
    /// The indexer of CSA layers.
    pub indexer: Option<Indexer>,
    /// Hyper-connection around attention.
    pub attn_hc: HyperConnection,
    /// Hyper-connection around the MoE block.
    pub ffn_hc: HyperConnection,
    /// `attn_norm`, on the host.
    pub attn_norm: Vec<f32>,
    /// `ffn_norm`, on the host.
    pub ffn_norm: Vec<f32>,
    /// `[vocab, top_k]` expert ids of a hash-routed layer.
    pub tid2eid: Option<Vec<u32>>,
}
