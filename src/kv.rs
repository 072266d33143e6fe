//! Per-sequence model state: the KV cache of attention layers (and, as architectures with
//! recurrent layers arrive, their state), sized for one sequence's context.

use crate::model::{Model, ModelError};
use ft_backend::{BufferUsage, DType, DeviceBuffer};

/// The cached state of one layer for one sequence.
pub enum LayerState {
    /// Keys and values, `[capacity, kv_heads, head_dim]` each.
    Attention {
        /// Keys.
        k: DeviceBuffer,
        /// Values.
        v: DeviceBuffer,
    },
}

/// Everything a sequence carries between forward passes.
pub struct SequenceState {
    /// One entry per decoder layer.
    pub layers: Vec<LayerState>,
    len: usize,
    capacity: usize,
}

impl SequenceState {
    /// Allocates state for up to `capacity` tokens on the model's backend.
    pub fn new(model: &Model, capacity: usize) -> Result<SequenceState, ModelError> {
        let cfg = model.config();
        let per_token = cfg.num_kv_heads * cfg.head_dim;
        let be = model.backend();
        let layers = (0..cfg.num_layers)
            .map(|_| {
                Ok(LayerState::Attention {
                    k: be.alloc(DType::F32, capacity * per_token, BufferUsage::Kv)?,
                    v: be.alloc(DType::F32, capacity * per_token, BufferUsage::Kv)?,
                })
            })
            .collect::<Result<_, ModelError>>()?;
        Ok(SequenceState { layers, len: 0, capacity })
    }

    /// Tokens processed so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no token has been processed.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Tokens this state can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Forgets everything after the first `len` tokens (attention caches roll back freely).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Records that `n` more tokens were written.
    pub(crate) fn advance(&mut self, n: usize) {
        self.len += n;
    }

    /// Bytes of KV cache per token for `model`.
    pub fn bytes_per_token(model: &Model) -> usize {
        let c = model.config();
        2 * c.num_layers * c.num_kv_heads * c.head_dim * DType::F32.size()
    }
}
