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
///
/// On a worker of a rayon pool (a step of the CPU backend runs on one) the wait runs the pool's
/// pending jobs instead of blocking: the reply is often the work of that very pool (the CPU
/// executors), which would otherwise go without this thread.
pub(crate) fn blocking_reply<T>(mut rx: tokio::sync::oneshot::Receiver<T>, what: &'static str) -> Result<T, crate::model::fault::PipelineFault> {
    use tokio::sync::oneshot::error::TryRecvError;
    let stopped = || crate::model::fault::PipelineFault::Stopped(what);
    if rayon::current_thread_index().is_none() {
        return rx.blocking_recv().map_err(|_| stopped());
    }
    let mut idle = 0u32;
    loop {
        match rx.try_recv() {
            Ok(v) => return Ok(v),
            Err(TryRecvError::Closed) => return Err(stopped()),
            Err(TryRecvError::Empty) => {}
        }
        match rayon::yield_now() {
            Some(rayon::Yield::Executed) => idle = 0,
            // Nothing to help with: spin briefly (replies take microseconds), then yield the
            // core, then sleep in short naps so a long wait (a copy, a slow actor) costs no CPU.
            _ => {
                idle = idle.saturating_add(1);
                if idle < 64 {
                    std::hint::spin_loop();
                } else if idle < 256 {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(std::time::Duration::from_micros(50));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::blocking_reply;

    /// A step runs on a worker of the host pool and waits for work it sent to that same pool:
    /// with one worker the wait must run that work itself, not block on it.
    #[test]
    fn a_wait_on_the_pool_runs_the_pool_work_it_waits_for() {
        let pool = std::sync::Arc::new(rayon::ThreadPoolBuilder::new().num_threads(1).build().expect("pool"));
        let work = |tx: tokio::sync::oneshot::Sender<u64>| move || {
            let _ = tx.send((1..=1000u64).sum());
        };
        // Spawned from the worker itself (its own queue) and from another thread, as the CPU
        // executors' actor does (the pool's injector).
        let own = pool.install(|| {
            let (tx, rx) = tokio::sync::oneshot::channel();
            rayon::spawn(work(tx));
            blocking_reply(rx, "test")
        });
        assert_eq!(own.expect("reply"), 500_500);
        let injected = pool.install(|| {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let p = pool.clone();
            std::thread::spawn(move || p.spawn(work(tx)));
            blocking_reply(rx, "test")
        });
        assert_eq!(injected.expect("reply"), 500_500);
    }

    /// A sender that goes away without replying is an error, on the pool and off it.
    #[test]
    fn a_dropped_sender_is_a_stopped_error() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().expect("pool");
        let on_pool = pool.install(|| {
            let (tx, rx) = tokio::sync::oneshot::channel::<u8>();
            rayon::spawn(move || drop(tx));
            blocking_reply(rx, "test")
        });
        assert!(matches!(on_pool, Err(crate::model::fault::PipelineFault::Stopped("test"))));
        let (tx, rx) = tokio::sync::oneshot::channel::<u8>();
        drop(tx);
        assert!(matches!(blocking_reply(rx, "test"), Err(crate::model::fault::PipelineFault::Stopped("test"))));
    }
}
