//! The cache manager actor: the one owner of the expert slot table.

use crate::policy::{CacheError, CacheStats, ExpertCache, ExpertKey, Lease};

/// What [`CacheMsg::Stats`] answers.
#[derive(Clone, Debug, Default)]
pub struct CacheOccupancy {
    /// Counters.
    pub stats: CacheStats,
    /// Slots.
    pub capacity: u64,
    /// Slots holding an expert.
    pub used: u64,
    /// Slots pinned by a lease.
    pub leased: u64,
}
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

/// Messages of the cache manager.
pub enum CacheMsg {
    /// Looks up (and leases) each expert of a layer; `None` for a miss.
    Acquire { layer: u16, experts: Vec<u32>, reply: RpcReplyPort<Vec<Option<Lease>>> },
    /// Inserts (evicting LRU, never a leased slot) and leases; `None` where no slot was free.
    Insert { keys: Vec<ExpertKey>, reply: RpcReplyPort<Vec<Option<Lease>>> },
    /// Forgets a key whose transfer failed.
    Remove { key: ExpertKey },
    /// Changes the capacity; returns the keys vacated.
    Resize { slots: u64, reply: RpcReplyPort<Result<Vec<ExpertKey>, CacheError>> },
    /// Counters and occupancy.
    Stats { reply: RpcReplyPort<CacheOccupancy> },
    /// Resets the counters.
    ResetStats,
}

/// The cache manager actor.
pub struct CacheManager;

impl Actor for CacheManager {
    type Msg = CacheMsg;
    type State = ExpertCache;
    type Arguments = u64;

    async fn pre_start(&self, _me: ActorRef<CacheMsg>, slots: u64) -> Result<ExpertCache, ActorProcessingErr> {
        Ok(ExpertCache::new(slots as usize)?)
    }

    async fn handle(&self, _me: ActorRef<CacheMsg>, msg: CacheMsg, cache: &mut ExpertCache) -> Result<(), ActorProcessingErr> {
        match msg {
            CacheMsg::Acquire { layer, experts, reply } => {
                let out = experts.iter().map(|&e| cache.lookup_and_lease(ExpertKey::new(layer, e))).collect();
                let _ = reply.send(out);
            }
            CacheMsg::Insert { keys, reply } => {
                let out = keys.iter().map(|k| cache.insert_and_lease(*k).ok().map(|(_, lease)| lease)).collect();
                let _ = reply.send(out);
            }
            CacheMsg::Remove { key } => {
                if let Err(e) = cache.remove(key) {
                    tracing::error!("expert {key:?} could not be dropped from the cache: {e}");
                }
            }
            CacheMsg::Resize { slots, reply } => {
                let _ = reply.send(cache.resize(slots as usize));
            }
            CacheMsg::Stats { reply } => {
                let _ = reply.send(CacheOccupancy {
                    stats: cache.stats(),
                    capacity: cache.capacity() as u64,
                    used: cache.len() as u64,
                    leased: cache.leased() as u64,
                });
            }
            CacheMsg::ResetStats => cache.reset_stats(),
        }
        Ok(())
    }
}
