//! How long the pooled decode-sized weight products ([`super::matmul_many`] of at most
//! [`super::gemv::DECODE_TOKENS`] tokens) have run, and the weight bytes they read: the share
//! of a decode step spent streaming weights on the CPU, and the rate inside it, which
//! `ft-actor bench` reports beside the rate over the whole step.
//!
//! Time counts while at least one such product runs (the union over the threads that call
//! them: the device thread's dense products and the executors' experts may overlap), from
//! timestamps at entry and exit.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// What the decode-sized products have done since the process started.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ProductTime {
    /// Wall time during which at least one ran.
    pub busy: Duration,
    /// Weight bytes they read (each product's whole weight slices).
    pub bytes: u64,
}

impl ProductTime {
    /// Both together.
    pub fn plus(&self, other: &ProductTime) -> ProductTime {
        ProductTime { busy: self.busy + other.busy, bytes: self.bytes + other.bytes }
    }

    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &ProductTime) -> ProductTime {
        ProductTime { busy: self.busy.saturating_sub(earlier.busy), bytes: self.bytes.saturating_sub(earlier.bytes) }
    }
}

/// The union of product intervals, from explicit timestamps.
struct Clock {
    running: usize,
    since: Option<Instant>,
    done: ProductTime,
}

impl Clock {
    const fn new() -> Clock {
        Clock { running: 0, since: None, done: ProductTime { busy: Duration::ZERO, bytes: 0 } }
    }

    fn enter(&mut self, now: Instant, bytes: usize) {
        if self.running == 0 {
            self.since = Some(now);
        }
        self.running += 1;
        self.done.bytes += bytes as u64;
    }

    fn exit(&mut self, now: Instant) {
        self.running = self.running.saturating_sub(1);
        if self.running == 0 {
            if let Some(t) = self.since.take() {
                self.done.busy += now.saturating_duration_since(t);
            }
        }
    }

    fn total(&self, now: Instant) -> ProductTime {
        let open = self.since.map_or(Duration::ZERO, |t| now.saturating_duration_since(t));
        ProductTime { busy: self.done.busy + open, bytes: self.done.bytes }
    }
}

static CLOCK: Mutex<Clock> = Mutex::new(Clock::new());

fn clock() -> std::sync::MutexGuard<'static, Clock> {
    // The counters stay consistent whatever a panicking holder was doing: each update is
    // one field write after another of plain numbers.
    CLOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// The totals so far, including products still running.
pub fn decode_products() -> ProductTime {
    clock().total(Instant::now())
}

/// Counts one product of `bytes` weight bytes from now until the guard drops.
pub(crate) fn enter(bytes: usize) -> Running {
    clock().enter(Instant::now(), bytes);
    Running(())
}

/// A product being timed ([`enter`]).
pub(crate) struct Running(());

impl Drop for Running {
    fn drop(&mut self) {
        clock().exit(Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Overlapping products count their union once, gaps not at all, and the bytes of each;
    /// a product still running counts up to now.
    #[test]
    fn overlapping_products_count_once() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut c = Clock::new();
        c.enter(at(0), 100);
        c.enter(at(20), 50);
        c.exit(at(40));
        c.exit(at(60));
        c.enter(at(100), 7);
        assert_eq!(c.total(at(110)), ProductTime { busy: Duration::from_millis(70), bytes: 157 });
        c.exit(at(130));
        let later = c.total(at(500));
        assert_eq!(later, ProductTime { busy: Duration::from_millis(90), bytes: 157 });
        assert_eq!(later.since(&ProductTime { busy: Duration::from_millis(60), bytes: 150 }), ProductTime { busy: Duration::from_millis(30), bytes: 7 });
        assert_eq!(later.plus(&ProductTime { busy: Duration::from_millis(10), bytes: 3 }), ProductTime { busy: Duration::from_millis(100), bytes: 160 });
    }
}
