//! The router actor: for each MoE layer of a step, splits the routed experts into cache
//! hits, misses to fetch and misses to compute on the CPU (the `q*` split).

use super::cache::CacheMsg;
use crate::policy::{select_fetches, BranchCosts, ExpertKey, Lease, ResolvedMode, SplitCosts, UsageTracker};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

/// Where each routed expert of a layer runs.
#[derive(Default)]
pub struct LayerPlan {
    /// Cached experts, leased for the duration of the layer.
    pub hits: Vec<(u32, Lease)>,
    /// Misses fetched into freshly leased slots.
    pub fetch: Vec<(u32, Lease)>,
    /// Misses computed by the CPU executors.
    pub cpu: Vec<u32>,
}

/// Messages of the router.
pub enum RouterMsg {
    /// Plan `experts` (expert id, tokens routed to it) of `layer`; `new_step` marks the
    /// first MoE layer of a forward step.
    Plan { layer: u16, experts: Vec<(u32, usize)>, new_step: bool, reply: RpcReplyPort<LayerPlan> },
    /// Count one forward step's experts, `(layer, experts)` per MoE layer, as routed, with no
    /// plan asked for: in [`ResolvedMode::Cpu`] every expert runs on the CPU executors, so the
    /// device stream plans each layer itself and only keeps the popularity signal current (for
    /// when a resize brings the cache in). Once a step, not per layer: each message wakes the
    /// async runtime, and a wake-up per layer took ~44 µs of the step's core.
    RecordStep(Vec<(u16, Vec<u32>)>),
    /// Switch the miss policy (after a resize changed what is possible).
    SetMode(ResolvedMode),
}

/// Router settings.
pub struct RouterArgs {
    /// The cache manager.
    pub cache: ActorRef<CacheMsg>,
    /// Miss policy.
    pub mode: ResolvedMode,
    /// Bandwidths and expert size, for the split.
    pub costs: SplitCosts,
}

/// The router's state.
pub struct RouterState {
    args: RouterArgs,
    usage: UsageTracker,
}

/// The router actor.
pub struct Router;

impl Actor for Router {
    type Msg = RouterMsg;
    type State = RouterState;
    type Arguments = RouterArgs;

    async fn pre_start(&self, _me: ActorRef<RouterMsg>, args: RouterArgs) -> Result<RouterState, ActorProcessingErr> {
        Ok(RouterState { args, usage: UsageTracker::new(64) })
    }

    async fn handle(&self, _me: ActorRef<RouterMsg>, msg: RouterMsg, st: &mut RouterState) -> Result<(), ActorProcessingErr> {
        let (layer, experts, new_step, reply) = match msg {
            RouterMsg::SetMode(m) => {
                st.args.mode = m;
                return Ok(());
            }
            RouterMsg::RecordStep(layers) => {
                st.usage.end_step();
                for (layer, experts) in layers {
                    st.usage.record(experts.iter().map(|&e| ExpertKey::new(layer, e)));
                }
                return Ok(());
            }
            RouterMsg::Plan { layer, experts, new_step, reply } => (layer, experts, new_step, reply),
        };
        if new_step {
            st.usage.end_step();
        }
        let ids: Vec<u32> = experts.iter().map(|(e, _)| *e).collect();
        let mut plan = LayerPlan::default();
        let leases = if st.args.mode == ResolvedMode::Cpu {
            vec![None; ids.len()]
        } else {
            st.args.cache.call(|r| CacheMsg::Acquire { layer, experts: ids.clone(), reply: r }, None).await?.unwrap_or_else(Vec::new)
        };
        let mut misses = vec![];
        for (&e, lease) in ids.iter().zip(leases) {
            match lease {
                Some(l) => plan.hits.push((e, l)),
                None => misses.push(ExpertKey::new(layer, e)),
            }
        }
        st.usage.record(ids.iter().map(|&e| ExpertKey::new(layer, e)));
        let q = st.args.mode.choose_q(misses.len(), misses.len(), &BranchCosts::from(&st.args.costs));
        let split = select_fetches(&misses, q, |k| st.usage.count(k));
        plan.cpu.extend(split.cpu.iter().map(|k| k.expert));
        if !split.fetch.is_empty() {
            let keys = split.fetch.clone();
            let got = st.args.cache.call(|r| CacheMsg::Insert { keys, reply: r }, None).await?.unwrap_or_else(Vec::new);
            for (k, lease) in split.fetch.iter().zip(got.into_iter().chain(std::iter::repeat_with(|| None))) {
                match lease {
                    Some(l) => plan.fetch.push((k.expert, l)),
                    // Every slot is leased by this very step: compute it on the CPU instead.
                    None => plan.cpu.push(k.expert),
                }
            }
        }
        let _ = reply.send(plan);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actors::cache::CacheManager;
    use ractor::Actor;

    async fn plan(router: &ActorRef<RouterMsg>, layer: u16, experts: &[u32], new_step: bool) -> LayerPlan {
        let experts = experts.iter().map(|&e| (e, 1)).collect();
        router.call(|reply| RouterMsg::Plan { layer, experts, new_step, reply }, None).await.unwrap().unwrap()
    }

    /// Experts recorded while every expert ran on the CPU count as routed: once the cache
    /// comes in, the one slot goes to the expert the CPU-mode steps used most.
    #[test]
    fn recorded_experts_rank_first_when_the_cache_comes_in() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let (cache, _) = Actor::spawn(None, CacheManager, 1).await.unwrap();
            let costs = SplitCosts::new(1 << 20, 10e9, 20e9);
            let (router, _) = Actor::spawn(None, Router, RouterArgs { cache, mode: ResolvedMode::Cpu, costs }).await.unwrap();
            for _ in 0..3 {
                router.cast(RouterMsg::RecordStep(vec![(0, vec![5, 9])])).unwrap();
            }
            router.cast(RouterMsg::SetMode(ResolvedMode::Offload)).unwrap();
            let p = plan(&router, 0, &[2, 5], true).await;
            let fetched: Vec<u32> = p.fetch.iter().map(|(e, _)| *e).collect();
            assert_eq!((fetched, p.cpu.clone(), p.hits.len()), (vec![5], vec![2], 0));
        });
    }
}
