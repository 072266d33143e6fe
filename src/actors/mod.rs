//! The actors of the engine. Each is a thin shell that owns state and passes messages; the
//! decisions are in [`crate::policy`] and the compute runs on worker threads, never inside
//! an async handler.
//!
//! | actor | owns |
//! |---|---|
//! | [`device::DeviceStream`] | the model's device weights, sequence states, the compute worker |
//! | [`router::Router`] | the miss split and fetch choice per layer |
//! | [`cache::CacheManager`] | the slot table, LRU order, leases, capacity |
//! | [`transfer::TransferEngine`] | copies of experts into slots and layer buffers |
//! | [`cpu::CpuExecutors`] | a thread pool computing experts from host memory |

pub mod cache;
pub mod cpu;
pub mod device;
pub mod faults;
pub mod pipeline;
pub mod router;
pub mod slots;
pub mod transfer;

use std::sync::Arc;

use crate::model::weights::ExpertWeights;

/// The routed-expert pool in host memory: `experts[layer]` (empty for dense layers).
pub type HostExperts = Arc<Vec<Vec<ExpertWeights>>>;

/// Waits for a reply sent through a `RpcReplyPort` from a worker thread (not the runtime).
pub(crate) fn blocking_reply<T>(rx: tokio::sync::oneshot::Receiver<T>, what: &'static str) -> Result<T, crate::model::fault::PipelineFault> {
    rx.blocking_recv().map_err(|_| crate::model::fault::PipelineFault::Stopped(what))
}
