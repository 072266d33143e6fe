//! The bounded store of finished responses behind `GET /v1/responses/{id}` and
//! `previous_response_id`.

use serde_json::Value;
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

/// A finished response and the conversation it ended, for `previous_response_id`.
#[derive(Clone)]
pub(super) struct Stored {
    /// The response object as returned.
    pub(super) response: Value,
    /// Template messages up to and including this response's output.
    pub(super) conversation: Vec<Value>,
}

/// Bounded store of finished responses (oldest evicted first).
pub struct Store {
    cap: usize,
    inner: Mutex<(HashMap<String, Stored>, VecDeque<String>)>,
}

impl Store {
    /// A store keeping at most `cap` responses.
    pub fn new(cap: usize) -> Self {
        Self { cap, inner: Mutex::new((HashMap::new(), VecDeque::new())) }
    }

    /// Keeps `s` under `id`, dropping the oldest entries beyond the capacity.
    pub(super) fn put(&self, id: String, s: Stored) {
        if self.cap == 0 {
            return;
        }
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let (map, order) = &mut *g;
        if map.insert(id.clone(), s).is_none() {
            order.push_back(id);
        }
        while order.len() > self.cap {
            if let Some(old) = order.pop_front() {
                map.remove(&old);
            }
        }
    }

    /// The stored entry `id`.
    pub(super) fn get(&self, id: &str) -> Option<Stored> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).0.get(id).cloned()
    }

    /// Forgets `id`; false when it was not stored.
    pub(super) fn remove(&self, id: &str) -> bool {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let (map, order) = &mut *g;
        order.retain(|x| x != id);
        map.remove(id).is_some()
    }

    /// A stored response object.
    pub fn response(&self, id: &str) -> Option<Value> {
        self.get(id).map(|s| s.response)
    }

    /// Number of stored responses.
    pub fn len(&self) -> usize {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).0.len()
    }

    /// True when nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
