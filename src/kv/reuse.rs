//! Agent-aware prefix reuse: the saved states behind the anchor index, and the rules for
//! when to save one and how far a new prompt may resume.
//!
//! - **Attention-only models** can cut KV at any token, so every position is a restore point:
//!   the store keeps one snapshot per conversation branch (taken when the prompt is prefilled
//!   and again when the sequence ends, which supersedes the first) and resumes a new prompt
//!   at the exact longest common prefix with anything stored.
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
                let _ = self.index.remove(id);
                0
            }
        }
    }

    /// Where a prefill of `prompt[from..]` pauses so an anchor can be recorded (positions
    /// strictly inside the range; the prompt's end is recorded anyway). Only recurrent models
    /// pause: attention state can be cut afterwards at any position.
    pub fn prefill_stops(&self, prompt: &[u32], from: usize) -> Vec<usize> {
        if !self.enabled() || !self.recurrent {
            return vec![];
        }
        let interval = self.interval();
        let mut candidates = Vec::new();
        let mut last = from;
        for p in from + 1..prompt.len() {
            if self.is_boundary(prompt[p - 1]) || p - last >= interval {
                candidates.push(p);
                last = p;
            }
        }
        // Keep the deepest: walking back from the end, a stop must leave a gap to the next.
        let mut kept = Vec::new();
        let mut next = prompt.len();
        for &p in candidates.iter().rev() {
            if kept.len() == MAX_PREFILL_STOPS {
                break;
            }
            if next - p >= MIN_STOP_GAP {
                kept.push(p);
                next = p;
            }
        }
        kept.reverse();
        kept
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
        let snapshot = if self.make_device_room(bytes)? { state.snapshot()? } else { state.snapshot_to_host()? };
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
        // Attention state for a longer prefix serves every shorter one on its path.
        if !self.recurrent {
            for id in self.index.ancestors(tokens) {
                if let Some(gone) = self.index.remove(id) {
                    self.forget(&gone);
                }
            }
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
