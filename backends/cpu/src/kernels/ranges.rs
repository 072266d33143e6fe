//! Work split into contiguous runs of chunks, one run per pool worker, whose tails go to
//! whichever workers finish first.
//!
//! A one-token product streams its weights, and each thread streams fastest front to back
//! through one contiguous run. Rayon's halving join tree keeps runs contiguous too, but a
//! thread that finds its half of a join taken has to wait on it, and waiting it steals back:
//! with products nested in experts that also run side by side the workers kept stealing each
//! other's rows all the way through and halved the rate of bf16 experts. Here no worker ever
//! waits on another's chunk: each owns a run, takes chunks from its front, and when it is
//! empty takes chunks one at a time from the back of the run with the most chunks left, so the
//! owner keeps streaming forward while the helpers eat its tail. The claims of a run are one
//! atomic word (front and back), so a chunk costs a compare-and-swap, and no worker waits for
//! anything but the last chunk in flight.

use ft_backend::{BackendError, Result};
use rayon::ThreadPool;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

/// The unclaimed chunks `[front, back)` of one run, in one word (front low, back high), on a
/// cache line of its own: the owner claims from it every chunk, and must not share the line
/// with another run's owner.
#[repr(align(128))]
struct Run(AtomicU64);

impl Run {
    fn new(front: usize, back: usize) -> Self {
        Run(AtomicU64::new(front as u64 | (back as u64) << 32))
    }

    /// Claims the first unclaimed chunk (`front`) or the last (`!front`).
    fn claim(&self, front: bool) -> Option<usize> {
        let mut taken = 0;
        self.0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                let (f, b) = (w & 0xffff_ffff, w >> 32);
                if f >= b {
                    return None;
                }
                taken = if front { f } else { b - 1 };
                Some(if front { (f + 1) | b << 32 } else { f | (b - 1) << 32 })
            })
            .ok()
            .map(|_| taken as usize)
    }

    /// Chunks left unclaimed.
    fn left(&self) -> usize {
        let w = self.0.load(Ordering::Acquire);
        ((w >> 32).saturating_sub(w & 0xffff_ffff)) as usize
    }
}

/// Splits chunks of cost `cost[c]` each into `parts` contiguous runs of about equal cost
/// (every run non-empty while there are chunks enough): the run starts, with the end last.
fn run_bounds(cost: &[usize], parts: usize) -> Vec<usize> {
    let total: usize = cost.iter().sum();
    let mut bounds = vec![0];
    let mut acc = 0;
    for (c, &b) in cost.iter().enumerate() {
        let p = bounds.len();
        // Close run `p - 1` before chunk `c` once it holds its share, leaving a chunk for each
        // run still to come (and as soon as only that many are left).
        let (left, to_open) = (cost.len() - c, parts.saturating_sub(p));
        if p < parts && c > bounds[p - 1] && ((acc * parts >= total * p && left >= to_open) || left <= to_open) {
            bounds.push(c);
        }
        acc += b;
    }
    bounds.push(cost.len());
    bounds
}

/// Runs `f(c)` exactly once for every chunk `c < cost.len()` (chunk `c` costing about
/// `cost[c]`: bytes read, times tokens) on the workers of `pool`, the calling thread
/// included when it is one:
/// one contiguous run of chunks per worker, tails shared out at the end (module docs). The
/// first error stops the claiming and is returned once every chunk in flight has ended.
pub(crate) fn run_chunks(pool: &ThreadPool, cost: &[usize], f: impl Fn(usize) -> Result<()> + Sync) -> Result<()> {
    let parts = pool.current_num_threads().min(cost.len());
    if parts <= 1 {
        return (0..cost.len()).try_for_each(f);
    }
    let bounds = run_bounds(cost, parts);
    let runs: Vec<Run> = bounds.windows(2).map(|w| Run::new(w[0], w[1])).collect();
    let failed = AtomicBool::new(false);
    let first_err: Mutex<Option<BackendError>> = Mutex::new(None);
    let work = |own: usize| {
        let go = |c: usize| match f(c) {
            Ok(()) => !failed.load(Ordering::Relaxed),
            Err(e) => {
                failed.store(true, Ordering::Relaxed);
                let mut slot = first_err.lock().unwrap_or_else(|p| p.into_inner());
                slot.get_or_insert(e);
                false
            }
        };
        while let Some(c) = runs[own].claim(true) {
            if !go(c) {
                return;
            }
        }
        // The run with the most chunks left, from its back, until none is left.
        while let Some(victim) = (0..runs.len()).filter(|&r| runs[r].left() > 0).max_by_key(|&r| runs[r].left()) {
            if let Some(c) = runs[victim].claim(false) {
                if !go(c) {
                    return;
                }
            }
        }
    };
    pool.install(|| {
        rayon::scope(|s| {
            // A run whose job no other worker picks up is emptied from its back by the
            // workers that do; the job then finds nothing left and returns at once.
            for own in 1..runs.len() {
                let work = &work;
                s.spawn(move |_| work(own));
            }
            work(0);
        })
    });
    match first_err.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    fn pool(threads: usize) -> ThreadPool {
        rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("pool")
    }

    #[test]
    fn runs_split_bytes_evenly_and_leave_no_run_empty() {
        assert_eq!(run_bounds(&[1; 8], 2), vec![0, 4, 8]);
        assert_eq!(run_bounds(&[1; 7], 3), vec![0, 3, 5, 7]);
        // Uneven chunks: the heavy first one is a run of its own.
        assert_eq!(run_bounds(&[6, 1, 1, 1, 1, 1, 1], 2), vec![0, 1, 7]);
        // As many runs as chunks.
        assert_eq!(run_bounds(&[5, 1, 1], 3), vec![0, 1, 2, 3]);
        assert_eq!(run_bounds(&[1, 1, 9], 3), vec![0, 1, 2, 3]);
    }

    #[test]
    fn claims_meet_in_the_middle_without_overlap() {
        let r = Run::new(3, 7);
        assert_eq!(r.claim(true), Some(3));
        assert_eq!(r.claim(false), Some(6));
        assert_eq!(r.left(), 2);
        assert_eq!(r.claim(false), Some(5));
        assert_eq!(r.claim(true), Some(4));
        assert_eq!((r.claim(true), r.claim(false), r.left()), (None, None, 0));
    }

    #[test]
    fn every_chunk_runs_once_on_any_pool() {
        for threads in [1, 2, 3, 4] {
            let p = pool(threads);
            for n in [0, 1, 2, 5, 64, 333] {
                let bytes: Vec<usize> = (0..n).map(|c| 1 + c % 7).collect();
                let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                run_chunks(&p, &bytes, |c| {
                    hits[c].fetch_add(1, Ordering::Relaxed);
                    Ok(())
                })
                .expect("run");
                assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1), "{threads} threads, {n} chunks");
            }
        }
    }

    /// The other worker is held busy the whole time: the caller must empty its run too.
    #[test]
    fn a_run_no_worker_picks_up_is_taken_from_its_back() {
        let p = pool(2);
        let (hold_tx, hold_rx) = std::sync::mpsc::channel::<()>();
        let (started_tx, started_rx) = std::sync::mpsc::channel::<()>();
        p.spawn(move || {
            let _ = started_tx.send(());
            let _ = hold_rx.recv();
        });
        started_rx.recv().expect("blocker started");
        let hits: Vec<AtomicUsize> = (0..40).map(|_| AtomicUsize::new(0)).collect();
        p.install(|| run_chunks(&p, &[1; 40], |c| {
            hits[c].fetch_add(1, Ordering::Relaxed);
            Ok(())
        }))
        .expect("run");
        assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
        hold_tx.send(()).expect("release");
    }

    #[test]
    fn the_first_error_comes_back_and_stops_the_claims() {
        let p = pool(2);
        let ran = AtomicUsize::new(0);
        let r = run_chunks(&p, &[1; 1000], |c| {
            ran.fetch_add(1, Ordering::Relaxed);
            if c == 10 {
                return Err(BackendError::Shape("chunk 10".into()));
            }
            Ok(())
        });
        assert!(matches!(r, Err(BackendError::Shape(m)) if m == "chunk 10"));
        assert!(ran.load(Ordering::Relaxed) < 1000);
    }
}
