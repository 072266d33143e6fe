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
//! | [`cpu::CpuExecutors`] | a thread pool computing experts from host memory; layer jobs arrive through its intake, the pool's own queue |

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
        wait_turn(&mut idle, true);
    }
}

/// Runs `f` on a worker of `pool` while the pool's other workers stay awake until it returns.
///
/// A step alternates parallel products with short serial parts (norms, attention of one
/// token, routing, the actor hops); in those gaps rayon's idle workers went to sleep on a
/// futex and every next product had to wake them: ~90 sleeps per decoded token of a 12-layer
/// Q4_K_M model on 2 threads, each costing the product a wake-up on a virtual machine's core.
/// Awake here means polling the pool for work and yielding the core (`sched_yield`) between
/// polls, so another process that wants the core gets it; it ends with the step.
pub(crate) fn install_awake<R: Send>(pool: &rayon::ThreadPool, f: impl FnOnce() -> R + Send) -> R {
    use std::sync::atomic::{AtomicBool, Ordering};
    /// Sets the flag however `f` ends (a panic must not leave the pollers spinning, and the
    /// scope waiting for them).
    struct Done<'a>(&'a AtomicBool);
    impl Drop for Done<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Release);
        }
    }
    let done = AtomicBool::new(false);
    pool.install(|| {
        let step = rayon::current_thread_index();
        rayon::scope(|s| {
            for _ in 1..rayon::current_num_threads() {
                s.spawn(|_| stay_awake(&done, step));
            }
            let _done = Done(&done);
            f()
        })
    })
}

/// Polls the pool for work until `done`; a no-op on the thread that runs the step (which
/// may pick this job up while it waits, and must not spin on its own flag).
fn stay_awake(done: &std::sync::atomic::AtomicBool, step: Option<usize>) {
    if rayon::current_thread_index() == step {
        return;
    }
    let mut idle = 0u32;
    while !done.load(std::sync::atomic::Ordering::Acquire) {
        wait_turn(&mut idle, false);
    }
}

/// One turn of a wait on a pool worker: runs a pending pool job if there is one; else spins
/// briefly (replies take microseconds), then yields the core, and with `nap`, past that, sleeps
/// in short naps so that a long wait (a copy, a slow actor) costs no CPU.
fn wait_turn(idle: &mut u32, nap: bool) {
    if let Some(rayon::Yield::Executed) = rayon::yield_now() {
        *idle = 0;
        return;
    }
    *idle = idle.saturating_add(1);
    if *idle < 64 {
        std::hint::spin_loop();
    } else if *idle < 256 || !nap {
        std::thread::yield_now();
    } else {
        std::thread::sleep(std::time::Duration::from_micros(50));
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

    /// The step's value comes back, its parallel work runs on every worker, and a panic in it
    /// reaches the caller instead of leaving the pollers spinning on an unset flag.
    #[test]
    fn an_awake_install_returns_runs_parallel_work_and_ends_on_panic() {
        use rayon::prelude::*;
        use std::collections::HashSet;
        use std::sync::Mutex;
        for threads in [1, 2, 3] {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("pool");
            let seen = Mutex::new(HashSet::new());
            let sum: usize = super::install_awake(&pool, || {
                (0..4096usize)
                    .into_par_iter()
                    .with_max_len(1)
                    .map(|i| {
                        seen.lock().expect("lock").insert(rayon::current_thread_index());
                        std::thread::sleep(std::time::Duration::from_micros(if i % 512 == 0 { 2000 } else { 0 }));
                        i
                    })
                    .sum()
            });
            assert_eq!(sum, 4095 * 4096 / 2);
            assert!(seen.lock().expect("lock").iter().all(|i| i.is_some_and(|i| i < threads)));
            let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| super::install_awake(&pool, || panic!("step failed"))));
            assert!(caught.is_err(), "{threads} threads: the panic must come back");
            // The pool is usable afterwards: no poller was left behind holding a worker.
            assert_eq!(super::install_awake(&pool, || 7), 7);
        }
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
