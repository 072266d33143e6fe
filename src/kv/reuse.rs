//! Agent-aware prefix reuse: the saved states behind the anchor index, and the rules for
//! when to save one and how far a new prompt may resume.
//!
//! - **Attention-only models** can cut KV at any token, so every position is a restore point:
//!   the store keeps one snapshot per conversation branch (taken when the sequence ends; it
//!   supersedes the shorter ones on its path) and resumes a new prompt at the exact longest
//!   common prefix with anything stored.
//! - **Models with recurrent layers** summarise all tokens in a fixed-size state that cannot
//!   be rolled back, so they resume only where a snapshot was taken: after boundary tokens
//!   (end of a message, tool-call and tool-response markers, end of thinking) seen in prefill
//!   or decode, every `interval` tokens of a stretch without one, at the end of each prompt
//!   and at the end of each sequence. Prefill pauses at those positions to take them.
//! - **Memory**: snapshots stay in device memory up to `device_budget` (the least recently
//!   used move to host memory first), and everything under `budget`, evicting the least
//!   recently used and, among equals, the shortest prefixes.

use super::{SequenceState, StateSnapshot};
use crate::model::ModelError;
use crate::policy::anchors::{AnchorIndex, AnchorStats};
use ft_backend::Backend;
use std::collections::HashSet;
use std::sync::Arc;

/// At most this many pauses in one prefill: each one costs a forward pass of its own (experts
/// are read again), so a long cold prompt keeps only its last few boundaries.
pub const MAX_PREFILL_STOPS: usize = 8;
/// Pauses closer than this to the next one are merged into it (the deeper one is kept).
pub const MIN_STOP_GAP: usize = 16;

/// How the store is sized and where it anchors.
#[derive(Clone, Debug)]
pub struct ReuseSettings {
    /// Bytes of saved state in all (0 turns reuse off).
    pub budget: u64,
    /// Of those, bytes that may stay in device memory.
    pub device_budget: u64,
    /// Anchor every this many tokens of a stretch without a boundary (recurrent models).
    pub interval: usize,
    /// Token ids after which an anchor is recorded.
    pub boundary_ids: Vec<u32>,
}

/// Counters of the store, for `/v1/cache/status` and `/metrics`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReuseStats {
    /// Index counters: anchors, bytes, budget, hits, misses, evictions.
    pub index: AnchorStats,
    /// Bytes of saved state in device memory.
    pub device_bytes: u64,
    /// The device part of the budget.
    pub device_budget: u64,
    /// Prompt tokens restored instead of prefilled.
    pub reused_tokens: u64,
    /// Snapshots taken.
    pub recorded: u64,
    /// Snapshots moved from device to host memory.
    pub demoted: u64,
    /// Restores that failed (the prompt was prefilled in full instead).
    pub failed_restores: u64,
}

/// Saved states of earlier sequences, indexed by their tokens.
pub struct PrefixStore {
    index: AnchorIndex<StateSnapshot>,
    settings: ReuseSettings,
    boundaries: HashSet<u32>,
    recurrent: bool,
    backend: Arc<dyn Backend>,
    stats: ReuseStats,
}

impl PrefixStore {
    /// A store for a model whose state does (`recurrent`) or does not have recurrent layers.
    pub fn new(settings: ReuseSettings, recurrent: bool, backend: Arc<dyn Backend>) -> Self {
        let boundaries = settings.boundary_ids.iter().copied().collect();
        let stats = ReuseStats { device_budget: settings.device_budget, ..Default::default() };
        Self { index: AnchorIndex::new(settings.budget), settings, boundaries, recurrent, backend, stats }
    }

    /// Bytes of saved state that may stay in device memory.
    pub fn device_budget(&self) -> u64 {
        self.settings.device_budget
    }

    /// Whether reuse is on.
    pub fn enabled(&self) -> bool {
        self.settings.budget > 0
    }

    /// Whether anchors need state captured exactly at their position (recurrent layers).
    pub fn needs_snapshots(&self) -> bool {
        self.recurrent
    }

    /// Whether `token` ends a semantic unit.
    pub fn is_boundary(&self, token: u32) -> bool {
        self.boundaries.contains(&token)
    }

    /// The anchor interval in tokens.
    pub fn interval(&self) -> usize {
        self.settings.interval.max(1)
    }

    /// Current counters.
    pub fn stats(&self) -> ReuseStats {
        ReuseStats { index: self.index.stats(), ..self.stats.clone() }
    }

    /// Restores into the fresh `state` the deepest saved state that `prompt` continues;
    /// returns the prompt tokens it covers (prefill starts there). The last prompt token is
    /// never restored, since its forward pass gives the logits of the first new token.
    pub fn restore(&mut self, prompt: &[u32], state: &mut SequenceState) -> usize {
        if !self.enabled() || prompt.len() < 2 {
            return 0;
        }
        let usable = &prompt[..prompt.len() - 1];
        let found = if self.recurrent {
            self.index.longest_match(usable, true).map(|m| (m.id, m.len))
        } else {
            self.index.shared_prefix(usable)
        };
        let Some((id, len)) = found else { return 0 };
        let Some(anchor) = self.index.get(id) else { return 0 };
        match state.restore_prefix(&anchor.payload, len) {
            Ok(()) => {
                self.stats.reused_tokens += len as u64;
                len
            }
            Err(e) => {
                // The state's length is only set by a complete restore, so a failure leaves
                // it empty and the prompt is simply prefilled in full.
                tracing::warn!("prefix reuse: restoring {len} tokens failed ({e}); prefilling the whole prompt");
                self.stats.failed_restores += 1;
                if let Some(gone) = self.index.remove(id) {
                    self.forget(&gone);
                }
                0
            }
        }
    }

    /// Where a prefill of `prompt[from..]` pauses so an anchor can be recorded (positions
    /// strictly inside the range; the prompt's end is recorded anyway). Only recurrent models
    /// pause: attention state can be cut afterwards at any position.
    ///
    /// Two kinds of pause: the last [`MAX_PREFILL_STOPS`] boundaries (where the next request
    /// most likely edits or continues), and one about every `interval` tokens through the
    /// whole range, placed on a boundary where there is one, so that an edit or rewind deep in
    /// a long prompt still finds state within `interval` tokens before it.
    pub fn prefill_stops(&self, prompt: &[u32], from: usize) -> Vec<usize> {
        if !self.enabled() || !self.recurrent {
            return vec![];
        }
        let interval = self.interval();
        let boundaries: Vec<usize> = (from + 1..prompt.len()).filter(|&p| self.is_boundary(prompt[p - 1])).collect();
        let mut stops = Vec::new();
        // Spaced pauses: the last boundary before each interval mark, else the mark itself.
        let mut last = from;
        let mut b = 0;
        while last + interval < prompt.len() {
            let mark = last + interval;
            let mut best = None;
            while b < boundaries.len() && boundaries[b] <= mark {
                if boundaries[b] > last {
                    best = Some(boundaries[b]);
                }
                b += 1;
            }
            last = best.unwrap_or(mark);
            stops.push(last);
        }
        // The last few boundaries; a shallower one closer than MIN_STOP_GAP to a kept one
        // saves little and costs a pause.
        let mut next = prompt.len();
        let mut kept = 0;
        for &p in boundaries.iter().rev() {
            if kept == MAX_PREFILL_STOPS {
                break;
            }
            if next - p >= MIN_STOP_GAP {
                stops.push(p);
                kept += 1;
                next = p;
            }
        }
        stops.sort_unstable();
        stops.dedup();
        stops
    }

    /// Whether a decode step that just ran `token`, leaving `len` tokens of state with the last
    /// anchor at `last_anchor`, should record one.
    pub fn anchor_after_decode(&self, token: u32, len: usize, last_anchor: usize) -> bool {
        self.enabled() && self.recurrent && (self.is_boundary(token) || len - last_anchor.min(len) >= self.interval())
    }

    /// Saves `state` as the anchor for `tokens` (which must be exactly what it holds).
    pub fn record(&mut self, tokens: &[u32], state: &SequenceState) -> Result<(), ModelError> {
        if !self.enabled() || tokens.is_empty() {
            return Ok(());
        }
        if tokens.len() != state.len() {
            return Err(ModelError::Invalid(format!(
                "anchor of {} tokens for a state of {}",
                tokens.len(),
                state.len()
            )));
        }
        if let Some(id) = self.index.find_exact(tokens) {
            self.index.touch(id);
            return Ok(());
        }
        let bytes = state.snapshot_bytes() as u64;
        if bytes > self.settings.budget {
            tracing::debug!(bytes, budget = self.settings.budget, "prefix reuse: state larger than the whole budget; not saved");
            return Ok(());
        }
        // Attention state for a longer prefix serves every shorter one on its path: drop those
        // first, so they make room instead of pushing out other conversations.
        if !self.recurrent {
            for id in self.index.ancestors(tokens) {
                if let Some(gone) = self.index.remove(id) {
                    self.forget(&gone);
                }
            }
        }
        let snapshot = if self.make_device_room(bytes)? { state.snapshot()? } else { state.snapshot_to_host()? };
        // On the device a snapshot holds whole pages; in host memory only its rows.
        let bytes = snapshot.size_bytes() as u64;
        if snapshot.on_device() {
            self.stats.device_bytes += bytes;
        }
        let inserted = match self.index.insert(tokens, snapshot, bytes, self.recurrent) {
            Ok(i) => i,
            Err(e) => {
                tracing::debug!("prefix reuse: {e}");
                return Ok(());
            }
        };
        self.stats.recorded += 1;
        for gone in inserted.evicted {
            self.forget(&gone);
        }
        Ok(())
    }

    fn forget(&mut self, gone: &StateSnapshot) {
        if gone.on_device() {
            self.stats.device_bytes = self.stats.device_bytes.saturating_sub(gone.size_bytes() as u64);
        }
    }

    /// Moves the least recently used snapshots to host memory until `bytes` more fit in the
    /// device part of the budget; false when even an empty device part is too small.
    fn make_device_room(&mut self, bytes: u64) -> Result<bool, ModelError> {
        if bytes > self.settings.device_budget {
            return Ok(false);
        }
        let order: Vec<_> = self.index.eviction_order().collect();
        for id in order {
            if self.stats.device_bytes + bytes <= self.settings.device_budget {
                break;
            }
            let backend = self.backend.clone();
            if let Some(snap) = self.index.payload_mut(id) {
                if snap.on_device() {
                    let size = snap.size_bytes() as u64;
                    snap.move_to_host(backend.as_ref())?;
                    self.stats.device_bytes = self.stats.device_bytes.saturating_sub(size);
                    self.stats.demoted += 1;
                }
            }
        }
        Ok(self.stats.device_bytes + bytes <= self.settings.device_budget)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ft_backend_cpu::{CpuBackend, CpuOptions};

    const B: u32 = 7;

    fn store(recurrent: bool, budget: u64, interval: usize) -> PrefixStore {
        let backend: Arc<dyn Backend> = Arc::new(CpuBackend::new(CpuOptions::default()).expect("cpu backend"));
        let settings = ReuseSettings { budget, device_budget: budget, interval, boundary_ids: vec![B] };
        PrefixStore::new(settings, recurrent, backend)
    }

    /// `n` tokens with a boundary after every `every` of them.
    fn prompt(n: usize, every: usize) -> Vec<u32> {
        (0..n).map(|i| if (i + 1) % every == 0 { B } else { 100 + (i % 50) as u32 }).collect()
    }

    #[test]
    fn attention_models_and_disabled_stores_never_pause() {
        let p = prompt(300, 20);
        assert!(store(false, 1 << 20, 64).prefill_stops(&p, 0).is_empty());
        assert!(store(true, 0, 64).prefill_stops(&p, 0).is_empty());
        assert!(!store(true, 0, 64).anchor_after_decode(B, 10, 0));
        assert!(!store(false, 1 << 20, 64).anchor_after_decode(B, 10, 0));
    }

    #[test]
    fn pauses_after_the_last_boundaries_and_about_every_interval() {
        let s = store(true, 1 << 20, 100);
        let p = prompt(1000, 40);
        let stops = s.prefill_stops(&p, 0);
        // Every stop is after a boundary (boundaries are dense enough here) and inside the range.
        assert!(stops.iter().all(|&x| x > 0 && x < p.len() && p[x - 1] == B), "{stops:?}");
        // The last MAX_PREFILL_STOPS boundaries are all kept (gaps of 40 ≥ MIN_STOP_GAP).
        let last: Vec<usize> = (1..=MAX_PREFILL_STOPS).map(|k| 1000 - 40 * k).collect();
        assert!(last.iter().all(|x| stops.contains(x)), "{stops:?}");
        // No stretch between pauses is longer than the interval.
        let mut prev = 0;
        for &x in stops.iter().chain([&p.len()]) {
            assert!(x - prev <= 100, "gap {prev}..{x} in {stops:?}");
            prev = x;
        }
        // A prefill that starts late pauses only after its start.
        assert!(s.prefill_stops(&p, 900).iter().all(|&x| x > 900));
    }

    #[test]
    fn long_stretches_without_boundaries_pause_at_the_interval() {
        let s = store(true, 1 << 20, 64);
        let p: Vec<u32> = (0..300).map(|i| 100 + i % 50).collect();
        assert_eq!(s.prefill_stops(&p, 10), vec![74, 138, 202, 266]);
        assert!(s.anchor_after_decode(1, 74, 10));
        assert!(!s.anchor_after_decode(1, 73, 10));
        assert!(s.anchor_after_decode(B, 11, 10));
    }

    #[test]
    fn close_boundaries_keep_the_deeper_one() {
        let s = store(true, 1 << 20, 10_000);
        // Boundaries at 50 and 52 (too close): only 52 is kept; 90 is within MIN_STOP_GAP of the end.
        let mut p: Vec<u32> = (0..100).map(|i| 100 + i % 50).collect();
        p[49] = B;
        p[51] = B;
        p[89] = B;
        assert_eq!(s.prefill_stops(&p, 0), vec![52]);
    }
}
