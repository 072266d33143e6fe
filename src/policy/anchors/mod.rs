//! The anchor index for agent-aware state reuse: which saved prefix state a new prompt can resume.
//!
//! Agents resend and edit whole transcripts. At semantic boundaries the engine records an
//! *anchor* (a token prefix whose KV and, for recurrent layers, state snapshot it kept); a new
//! request restores the deepest anchor that is still an exact prefix of its prompt and prefills
//! only the rest. This module is only that bookkeeping — payloads are opaque handles `P` that the
//! engine maps to KV/snapshot storage — so it can be tested without a model.
//!
//! Design points:
//! - **Radix tree over token ids.** Anchors sit at node ends; edges are compressed token runs.
//!   A lookup walks the prompt once and compares every token, so a lookup is O(prompt length),
//!   allocates nothing, and an anchor whose boundary was edited away simply is not on the path:
//!   mismatched state can never be returned, and the walk naturally falls back to the deepest
//!   earlier anchor.
//! - **Only anchored paths are stored.** Removing an anchor prunes dead leaves and re-merges
//!   single-child nodes, so tree size stays proportional to the anchored tokens.
//! - **Request epochs as time.** `last_used` is an epoch that advances once per lookup (one per
//!   request), so anchors recorded while serving one request tie on recency; among equals the
//!   shortest prefix is evicted first because it saves the least prefill.
//! - **Evictions are handed back.** The index cannot free KV or snapshots itself, so every
//!   operation that may evict returns the evicted payloads to the caller.

use std::collections::{BTreeSet, HashMap};

use thiserror::Error;

/// Identifies one anchor; never reused within an index, so a stale id is harmless.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AnchorId(u64);

/// Why an anchor was not recorded. The index is unchanged after any error.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum AnchorError {
    /// An empty prefix restores nothing, so it is not worth a payload.
    #[error("an anchor needs at least one token")]
    EmptyPrefix,
    /// The anchor alone exceeds the budget; rejected rather than inserted and evicted at once,
    /// so the caller keeps its state and knows the budget is too small.
    #[error("anchor of {bytes} bytes exceeds the whole budget of {budget} bytes")]
    TooLarge {
        /// Cost of the rejected anchor.
        bytes: u64,
        /// The index's byte budget.
        budget: u64,
    },
}

/// One recorded anchor.
#[derive(Debug, Clone)]
pub struct Anchor<P> {
    /// Number of prompt tokens the anchor's state covers.
    pub len: usize,
    /// [`prefix_hash`] of the covered tokens, to compare prefixes without walking them.
    pub prefix_hash: u64,
    /// The caller's handle to the saved KV/state.
    pub payload: P,
    /// Whether recurrent/linear-attention state was captured here (required to resume there).
    pub has_snapshot: bool,
    /// Memory charged against the budget.
    pub bytes: u64,
    /// Request epoch of the last insert, hit or touch.
    pub last_used: u64,
    node: usize,
}

/// The result of [`AnchorIndex::longest_match`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Match<'a, P> {
    /// The restored anchor.
    pub id: AnchorId,
    /// Prompt tokens covered; prefill starts at this position.
    pub len: usize,
    /// The caller's handle to the saved state.
    pub payload: &'a P,
}

/// The result of a successful [`AnchorIndex::insert`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inserted<P> {
    /// The anchor now at the inserted prefix.
    pub id: AnchorId,
    /// Payloads the caller must free: evicted anchors and any payload this insert replaced.
    pub evicted: Vec<P>,
}

/// Counters for `/v1/cache/status` and `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AnchorStats {
    /// Anchors currently stored.
    pub anchors: usize,
    /// Bytes charged by stored anchors.
    pub bytes: u64,
    /// The byte budget.
    pub budget: u64,
    /// Lookups that found an anchor.
    pub hits: u64,
    /// Lookups that found none.
    pub misses: u64,
    /// Anchors evicted under the budget (explicit removals and replacements excluded).
    pub evictions: u64,
}

/// One step of the prefix hash chain; lets the engine keep a running hash while decoding.
pub fn hash_step(prev: u64, token: u32) -> u64 {
    // splitmix64 finaliser: cheap, and order-sensitive because `prev` is mixed in first.
    let mut z = (prev ^ u64::from(token)).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The hash chain value of a whole prefix (`hash_step` folded from 0).
pub fn prefix_hash(tokens: &[u32]) -> u64 {
    tokens.iter().fold(0, |h, &t| hash_step(h, t))
}

#[derive(Debug, Default)]
struct Node {
    /// Tokens from the parent to this node; empty only for the root.
    edge: Vec<u32>,
    parent: usize,
    /// Keyed by the first token of the child's edge; radix edges never share a first token.
    children: HashMap<u32, usize>,
    anchor: Option<AnchorId>,
}

const ROOT: usize = 0;

/// Anchors across requests and conversations, under a byte budget.
#[derive(Debug)]
pub struct AnchorIndex<P> {
    nodes: Vec<Node>,
    free: Vec<usize>,
    anchors: HashMap<AnchorId, Anchor<P>>,
    /// Eviction order: (last_used, len, id) — oldest, then shortest, first.
    order: BTreeSet<(u64, usize, AnchorId)>,
    next_id: u64,
    epoch: u64,
    bytes: u64,
    budget: u64,
    hits: u64,
    misses: u64,
    evictions: u64,
}

impl<P> AnchorIndex<P> {
    /// An empty index that keeps at most `budget_bytes` of anchors.
    pub fn new(budget_bytes: u64) -> Self {
        Self {
            nodes: vec![Node::default()],
            free: Vec::new(),
            anchors: HashMap::new(),
            order: BTreeSet::new(),
            next_id: 0,
            epoch: 0,
            bytes: 0,
            budget: budget_bytes,
            hits: 0,
            misses: 0,
            evictions: 0,
        }
    }

    /// Starts a new request epoch. [`longest_match`](Self::longest_match) does this itself;
    /// call it directly when recording anchors for a request that did no lookup.
    pub fn tick(&mut self) {
        self.epoch += 1;
    }

    /// Records an anchor at the end of `tokens`, then evicts down to the budget.
    ///
    /// Re-inserting an existing prefix keeps its id and replaces payload, cost and snapshot
    /// flag; the old payload is returned in `evicted` so it is freed like any other.
    pub fn insert(
        &mut self,
        tokens: &[u32],
        payload: P,
        bytes: u64,
        has_snapshot: bool,
    ) -> Result<Inserted<P>, AnchorError> {
        if tokens.is_empty() {
            return Err(AnchorError::EmptyPrefix);
        }
        if bytes > self.budget {
            return Err(AnchorError::TooLarge {
                bytes,
                budget: self.budget,
            });
        }
        let node = self.insert_path(tokens);
        let mut evicted = Vec::new();
        let id = match self.nodes[node].anchor {
            Some(id) => {
                let epoch = self.epoch;
                // Invariant: a node's anchor id is always present in `anchors`.
                if let Some(a) = self.anchors.get_mut(&id) {
                    self.order.remove(&(a.last_used, a.len, id));
                    self.bytes = self.bytes - a.bytes + bytes;
                    a.bytes = bytes;
                    a.has_snapshot = has_snapshot;
                    a.last_used = epoch;
                    evicted.push(std::mem::replace(&mut a.payload, payload));
                    self.order.insert((epoch, a.len, id));
                }
                id
            }
            None => {
                let id = AnchorId(self.next_id);
                self.next_id += 1;
                let anchor = Anchor {
                    len: tokens.len(),
                    prefix_hash: prefix_hash(tokens),
                    payload,
                    has_snapshot,
                    bytes,
                    last_used: self.epoch,
                    node,
                };
                self.order.insert((self.epoch, tokens.len(), id));
                self.anchors.insert(id, anchor);
                self.nodes[node].anchor = Some(id);
                self.bytes += bytes;
                id
            }
        };
        // Within one epoch the new anchor may tie with (and be shorter than) older ones; it is
        // protected, and since it fits on its own, evicting the others always suffices.
        evicted.extend(self.evict_to(self.budget, Some(id)));
        Ok(Inserted { id, evicted })
    }

    /// The deepest anchor whose tokens are an exact prefix of `prompt`, counted as a hit and
    /// touched. With `require_snapshot` only anchors carrying recurrent state qualify, since a
    /// recurrent model cannot resume anywhere else. Starts a new request epoch.
    pub fn longest_match(
        &mut self,
        prompt: &[u32],
        require_snapshot: bool,
    ) -> Option<Match<'_, P>> {
        self.tick();
        let mut best = None;
        let mut node = ROOT;
        let mut pos = 0;
        loop {
            if let Some(id) = self.nodes[node].anchor {
                if !require_snapshot || self.anchors.get(&id).is_some_and(|a| a.has_snapshot) {
                    best = Some(id);
                }
            }
            let Some(&child) = prompt
                .get(pos)
                .and_then(|t| self.nodes[node].children.get(t))
            else {
                break;
            };
            let edge = &self.nodes[child].edge;
            if !prompt[pos..].starts_with(edge) {
                break;
            }
            pos += edge.len();
            node = child;
        }
        let Some(id) = best else {
            self.misses += 1;
            return None;
        };
        self.hits += 1;
        self.touch(id);
        self.anchors.get(&id).map(|a| Match {
            id,
            len: a.len,
            payload: &a.payload,
        })
    }

    /// The exact longest common prefix of `prompt` with any anchored sequence. Pure-attention
    /// KV can be truncated at any position, so attention-only models may reuse this much even
    /// past the last anchor. Does not count as a hit or touch anything.
    pub fn longest_common_prefix(&self, prompt: &[u32]) -> usize {
        self.walk_common(prompt).1
    }

    /// Walks `prompt` down the tree as far as it matches: the last node entered (whose edge
    /// may match only in part) and the number of tokens matched.
    fn walk_common(&self, prompt: &[u32]) -> (usize, usize) {
        let mut node = ROOT;
        let mut pos = 0;
        while let Some(&child) = prompt
            .get(pos)
            .and_then(|t| self.nodes[node].children.get(t))
        {
            let edge = &self.nodes[child].edge;
            let common = edge
                .iter()
                .zip(&prompt[pos..])
                .take_while(|(a, b)| a == b)
                .count();
            pos += common;
            node = child;
            if common < self.nodes[child].edge.len() {
                break;
            }
        }
        (node, pos)
    }

    /// The anchor whose tokens share the longest common prefix with `prompt`, and that
    /// prefix's length: any anchor below the point where `prompt` leaves the tree holds state
    /// for those tokens. For attention-only state, which can be truncated anywhere, this is the
    /// deepest reuse possible. Counts a hit (touching the anchor) or a miss; starts an epoch.
    pub fn shared_prefix(&mut self, prompt: &[u32]) -> Option<(AnchorId, usize)> {
        self.tick();
        // Even a partly matched edge leads to state that covers `pos` tokens.
        let (node, pos) = self.walk_common(prompt);
        // Only anchored paths are stored, so descending from any non-root node reaches an
        // anchor; prefer the nearest one (the smallest state that covers the prefix).
        let found = (pos > 0).then(|| self.nearest_anchor_below(node)).flatten();
        let Some(id) = found else {
            self.misses += 1;
            return None;
        };
        self.hits += 1;
        self.touch(id);
        Some((id, pos))
    }

    fn nearest_anchor_below(&self, start: usize) -> Option<AnchorId> {
        let mut frontier = vec![start];
        while !frontier.is_empty() {
            let mut next = Vec::new();
            for n in frontier {
                if let Some(id) = self.nodes[n].anchor {
                    return Some(id);
                }
                next.extend(self.nodes[n].children.values().copied());
            }
            frontier = next;
        }
        None
    }

    /// The anchor at exactly `tokens`, if one is stored. Touches nothing.
    pub fn find_exact(&self, tokens: &[u32]) -> Option<AnchorId> {
        let mut node = ROOT;
        let mut pos = 0;
        while pos < tokens.len() {
            let &child = self.nodes[node].children.get(&tokens[pos])?;
            let edge = &self.nodes[child].edge;
            if !tokens[pos..].starts_with(edge) {
                return None;
            }
            pos += edge.len();
            node = child;
        }
        if node == ROOT {
            None
        } else {
            self.nodes[node].anchor
        }
    }

    /// Anchors at strict prefixes of `tokens` (shallowest first).
    pub fn ancestors(&self, tokens: &[u32]) -> Vec<AnchorId> {
        let mut out = Vec::new();
        let mut node = ROOT;
        let mut pos = 0;
        while let Some(&child) = tokens
            .get(pos)
            .and_then(|t| self.nodes[node].children.get(t))
        {
            let edge = &self.nodes[child].edge;
            if !tokens[pos..].starts_with(edge) {
                break;
            }
            pos += edge.len();
            node = child;
            if pos < tokens.len() {
                out.extend(self.nodes[node].anchor);
            }
        }
        out
    }

    /// Anchor ids from least to most valuable (the eviction order).
    pub fn eviction_order(&self) -> impl Iterator<Item = AnchorId> + '_ {
        self.order.iter().map(|k| k.2)
    }

    /// The payload of an anchor, for the caller to move its storage (e.g. device to host).
    pub fn payload_mut(&mut self, id: AnchorId) -> Option<&mut P> {
        self.anchors.get_mut(&id).map(|a| &mut a.payload)
    }

    /// Marks an anchor as used in the current epoch. Returns false for an unknown id.
    pub fn touch(&mut self, id: AnchorId) -> bool {
        let Some(a) = self.anchors.get_mut(&id) else {
            return false;
        };
        self.order.remove(&(a.last_used, a.len, id));
        a.last_used = self.epoch;
        self.order.insert((a.last_used, a.len, id));
        true
    }

    /// Removes an anchor and returns its payload for the caller to free.
    pub fn remove(&mut self, id: AnchorId) -> Option<P> {
        let a = self.anchors.remove(&id)?;
        self.order.remove(&(a.last_used, a.len, id));
        self.bytes -= a.bytes;
        self.nodes[a.node].anchor = None;
        self.prune(a.node);
        Some(a.payload)
    }

    /// Changes the budget, returning the payloads evicted to meet it.
    pub fn set_budget(&mut self, budget_bytes: u64) -> Vec<P> {
        self.budget = budget_bytes;
        self.evict_to(budget_bytes, None)
    }

    /// The anchor with this id, if still stored.
    pub fn get(&self, id: AnchorId) -> Option<&Anchor<P>> {
        self.anchors.get(&id)
    }

    /// Current counters.
    pub fn stats(&self) -> AnchorStats {
        AnchorStats {
            anchors: self.anchors.len(),
            bytes: self.bytes,
            budget: self.budget,
            hits: self.hits,
            misses: self.misses,
            evictions: self.evictions,
        }
    }

    fn evict_to(&mut self, budget: u64, protect: Option<AnchorId>) -> Vec<P> {
        let mut out = Vec::new();
        while self.bytes > budget {
            let Some(&(_, _, id)) = self.order.iter().find(|k| Some(k.2) != protect) else {
                break;
            };
            match self.remove(id) {
                Some(p) => {
                    self.evictions += 1;
                    out.push(p);
                }
                // Unreachable by invariant; dropping the stale key avoids looping forever.
                None => {
                    self.order.retain(|k| k.2 != id);
                }
            }
        }
        out
    }

    /// Walks/extends the tree so that a node ends exactly at `tokens.len()`; returns that node.
    fn insert_path(&mut self, tokens: &[u32]) -> usize {
        let mut node = ROOT;
        let mut pos = 0;
        while pos < tokens.len() {
            let first = tokens[pos];
            let Some(&child) = self.nodes[node].children.get(&first) else {
                let leaf = self.alloc(Node {
                    edge: tokens[pos..].to_vec(),
                    parent: node,
                    ..Node::default()
                });
                self.nodes[node].children.insert(first, leaf);
                return leaf;
            };
            let edge = &self.nodes[child].edge;
            let common = edge
                .iter()
                .zip(&tokens[pos..])
                .take_while(|(a, b)| a == b)
                .count();
            if common < edge.len() {
                // Split so that the prefix ends on a node; the old child keeps its subtree.
                let tail = self.nodes[child].edge.split_off(common);
                let head = std::mem::replace(&mut self.nodes[child].edge, tail);
                let rest_first = self.nodes[child].edge[0];
                let mid = self.alloc(Node {
                    edge: head,
                    parent: node,
                    ..Node::default()
                });
                self.nodes[mid].children.insert(rest_first, child);
                self.nodes[child].parent = mid;
                self.nodes[node].children.insert(first, mid);
                node = mid;
            } else {
                node = child;
            }
            pos += common;
        }
        node
    }

    /// Drops anchorless leaves upwards and merges anchorless single-child nodes into their
    /// child, so only anchored paths remain and edges stay compressed.
    fn prune(&mut self, mut node: usize) {
        while node != ROOT && self.nodes[node].anchor.is_none() {
            let parent = self.nodes[node].parent;
            let first = self.nodes[node].edge[0];
            match self.nodes[node].children.len() {
                0 => {
                    self.nodes[parent].children.remove(&first);
                    self.release(node);
                    node = parent;
                }
                1 => {
                    let Some(&child) = self.nodes[node].children.values().next() else {
                        return;
                    };
                    let mut edge = std::mem::take(&mut self.nodes[node].edge);
                    edge.extend_from_slice(&self.nodes[child].edge);
                    self.nodes[child].edge = edge;
                    self.nodes[child].parent = parent;
                    self.nodes[parent].children.insert(first, child);
                    self.release(node);
                    return;
                }
                _ => return,
            }
        }
    }

    fn alloc(&mut self, node: Node) -> usize {
        match self.free.pop() {
            Some(i) => {
                self.nodes[i] = node;
                i
            }
            None => {
                self.nodes.push(node);
                self.nodes.len() - 1
            }
        }
    }

    fn release(&mut self, node: usize) {
        self.nodes[node] = Node::default();
        self.free.push(node);
    }

    #[cfg(test)]
    fn live_nodes(&self) -> usize {
        self.nodes.len() - self.free.len()
    }
}

#[cfg(test)]
mod tests;
