//! Per-sequence model state: the KV cache of attention layers, the latent cache of MLA
//! layers and the convolution + recurrent state of linear-attention layers, sized for one
//! sequence's context; plus snapshots of it, which anchors keep to resume a conversation.

use crate::model::config::LayerKind;
use crate::model::{Model, ModelError};
use ft_backend::{Backend, BufferUsage, CopyDesc, DType, DeviceBuffer, StreamId};
use std::sync::Arc;

/// The cached state of one layer for one sequence.
pub enum LayerState {
    /// Keys and values, `[capacity, kv_heads, head_dim]` each.
    Attention {
        /// Keys.
        k: DeviceBuffer,
        /// Values.
        v: DeviceBuffer,
    },
    /// Multi-head latent attention: per token the normalised latent followed by the rotated
    /// shared key part, `[capacity, kv_lora_rank + qk_rope_head_dim]`. Never per-head keys.
    Latent {
        /// The latent rows.
        kv: DeviceBuffer,
    },
    /// Gated DeltaNet: fixed-size state that summarises every token so far.
    Recurrent {
        /// The last `kernel - 1` inputs of the short convolution, `[kernel - 1, conv_dim]`.
        conv: DeviceBuffer,
        /// The delta-rule state, `[v_heads, k_head_dim, v_head_dim]`.
        state: DeviceBuffer,
    },
}

impl LayerState {
    /// Elements this layer caches per token (0 for fixed-size recurrent state).
    fn per_token(&self, capacity: usize) -> [usize; 2] {
        match self {
            LayerState::Attention { k, v } => [k.len() / capacity.max(1), v.len() / capacity.max(1)],
            LayerState::Latent { kv } => [kv.len() / capacity.max(1), 0],
            LayerState::Recurrent { .. } => [0, 0],
        }
    }
}

/// Everything a sequence carries between forward passes.
pub struct SequenceState {
    /// One entry per decoder layer.
    pub layers: Vec<LayerState>,
    len: usize,
    capacity: usize,
    backend: Arc<dyn Backend>,
}

/// A copy of a [`SequenceState`] after some number of tokens, in device memory.
///
/// Attention and latent caches are copied only up to the snapshot's length; recurrent
/// state is copied whole. Restoring it into any state of the same model with enough
/// capacity continues exactly as the original sequence would have.
pub struct StateSnapshot {
    len: usize,
    layers: Vec<LayerState>,
}

impl StateSnapshot {
    /// Tokens the snapshot covers.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the snapshot was taken before any token.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Device bytes the snapshot holds.
    pub fn size_bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| match l {
                LayerState::Attention { k, v } => k.size_bytes() + v.size_bytes(),
                LayerState::Latent { kv } => kv.size_bytes(),
                LayerState::Recurrent { conv, state } => conv.size_bytes() + state.size_bytes(),
            })
            .sum()
    }
}

fn copy_prefix(be: &dyn Backend, src: &DeviceBuffer, dst: &mut DeviceBuffer, len: usize) -> Result<(), ModelError> {
    be.copy(StreamId::COMPUTE, src, dst, &CopyDesc { src_offset: 0, dst_offset: 0, len })?;
    Ok(())
}

impl SequenceState {
    /// Allocates state for up to `capacity` tokens on the model's backend.
    pub fn new(model: &Model, capacity: usize) -> Result<SequenceState, ModelError> {
        let cfg = model.config();
        let be = model.backend();
        let alloc = |len: usize| be.alloc(DType::F32, len, BufferUsage::Kv);
        let layers = (0..cfg.num_layers)
            .map(|i| {
                Ok(match (cfg.layer_kinds[i], &cfg.mla, &cfg.linear_attn) {
                    (LayerKind::LinearAttention, _, Some(l)) => LayerState::Recurrent {
                        conv: alloc((l.conv_kernel - 1) * l.conv_dim())?,
                        state: alloc(l.state_len())?,
                    },
                    (LayerKind::LinearAttention, _, None) => {
                        return Err(ModelError::Invalid("linear-attention layer without its settings".into()))
                    }
                    (_, Some(m), _) => LayerState::Latent { kv: alloc(capacity * m.cache_width())? },
                    // Sliding-window layers get the full context too (the attention op masks by
                    // position); a ring buffer of `window` rows would save memory there.
                    _ => {
                        let per_token = cfg.num_kv_heads * cfg.head_dim;
                        LayerState::Attention { k: alloc(capacity * per_token)?, v: alloc(capacity * per_token)? }
                    }
                })
            })
            .collect::<Result<_, ModelError>>()?;
        Ok(SequenceState { layers, len: 0, capacity, backend: model.backend_arc() })
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

    /// Whether some layer keeps recurrent state, which summarises all tokens and so cannot
    /// be rolled back (restore a [`StateSnapshot`] instead).
    pub fn has_recurrent_layers(&self) -> bool {
        self.layers.iter().any(|l| matches!(l, LayerState::Recurrent { .. }))
    }

    /// Forgets everything after the first `len` tokens. Attention and latent caches roll
    /// back freely; a model with recurrent layers can only "truncate" to its current length.
    pub fn truncate(&mut self, len: usize) -> Result<(), ModelError> {
        if len < self.len && self.has_recurrent_layers() {
            return Err(ModelError::Invalid(format!(
                "cannot roll a recurrent state back from {} to {len} tokens; restore a snapshot taken at {len} instead",
                self.len
            )));
        }
        self.len = self.len.min(len);
        Ok(())
    }

    /// Records that `n` more tokens were written.
    pub(crate) fn advance(&mut self, n: usize) {
        self.len += n;
    }

    /// Copies the state as it is now.
    pub fn snapshot(&self) -> Result<StateSnapshot, ModelError> {
        let be = self.backend.as_ref();
        let alloc = |len: usize| be.alloc(DType::F32, len, BufferUsage::Kv);
        let layers = self
            .layers
            .iter()
            .map(|l| {
                let [pk, pv] = l.per_token(self.capacity);
                Ok(match l {
                    LayerState::Attention { k, v } => {
                        let (mut k2, mut v2) = (alloc(self.len * pk)?, alloc(self.len * pv)?);
                        copy_prefix(be, k, &mut k2, self.len * pk)?;
                        copy_prefix(be, v, &mut v2, self.len * pv)?;
                        LayerState::Attention { k: k2, v: v2 }
                    }
                    LayerState::Latent { kv } => {
                        let mut kv2 = alloc(self.len * pk)?;
                        copy_prefix(be, kv, &mut kv2, self.len * pk)?;
                        LayerState::Latent { kv: kv2 }
                    }
                    LayerState::Recurrent { conv, state } => {
                        let (mut c2, mut s2) = (alloc(conv.len())?, alloc(state.len())?);
                        copy_prefix(be, conv, &mut c2, conv.len())?;
                        copy_prefix(be, state, &mut s2, state.len())?;
                        LayerState::Recurrent { conv: c2, state: s2 }
                    }
                })
            })
            .collect::<Result<_, ModelError>>()?;
        Ok(StateSnapshot { len: self.len, layers })
    }

    /// Makes this state what it was when `snapshot` was taken (of a state of the same model).
    pub fn restore(&mut self, snapshot: &StateSnapshot) -> Result<(), ModelError> {
        if snapshot.len > self.capacity {
            return Err(ModelError::ContextOverflow { needed: snapshot.len, capacity: self.capacity });
        }
        if snapshot.layers.len() != self.layers.len() {
            return Err(ModelError::Invalid("snapshot is of a model with another number of layers".into()));
        }
        // Check every layer before copying any, so a mismatch leaves this state untouched.
        let capacity = self.capacity;
        let fits = |dst: &LayerState, src: &LayerState| {
            let [pk, pv] = dst.per_token(capacity);
            match (dst, src) {
                (LayerState::Attention { .. }, LayerState::Attention { k, v }) => {
                    k.len() == snapshot.len * pk && v.len() == snapshot.len * pv
                }
                (LayerState::Latent { .. }, LayerState::Latent { kv }) => kv.len() == snapshot.len * pk,
                (LayerState::Recurrent { conv, state }, LayerState::Recurrent { conv: c, state: s }) => {
                    c.len() == conv.len() && s.len() == state.len()
                }
                _ => false,
            }
        };
        if !self.layers.iter().zip(&snapshot.layers).all(|(d, s)| fits(d, s)) {
            return Err(ModelError::Invalid("snapshot layers do not match this model's state".into()));
        }
        let be = self.backend.as_ref();
        for (dst, src) in self.layers.iter_mut().zip(&snapshot.layers) {
            match (dst, src) {
                (LayerState::Attention { k, v }, LayerState::Attention { k: ks, v: vs }) => {
                    copy_prefix(be, ks, k, ks.len())?;
                    copy_prefix(be, vs, v, vs.len())?;
                }
                (LayerState::Latent { kv }, LayerState::Latent { kv: s }) => copy_prefix(be, s, kv, s.len())?,
                (LayerState::Recurrent { conv, state }, LayerState::Recurrent { conv: cs, state: ss }) => {
                    copy_prefix(be, cs, conv, cs.len())?;
                    copy_prefix(be, ss, state, ss.len())?;
                }
                _ => return Err(ModelError::Invalid("snapshot layers do not match this model's state".into())),
            }
        }
        self.len = snapshot.len;
        Ok(())
    }

    /// Bytes of cache that grow with each token of context, for `model`.
    pub fn bytes_per_token(model: &Model) -> usize {
        let c = model.config();
        let per_layer = |kind: LayerKind| match (kind, &c.mla) {
            (LayerKind::LinearAttention, _) => 0,
            (_, Some(m)) => m.cache_width(),
            _ => 2 * c.num_kv_heads * c.head_dim,
        };
        c.layer_kinds.iter().map(|k| per_layer(*k)).sum::<usize>() * DType::F32.size()
    }

    /// Bytes of fixed-size (recurrent) state per sequence, for `model`.
    pub fn fixed_bytes(model: &Model) -> usize {
        let c = model.config();
        let per_layer = c.linear_attn.map_or(0, |l| (l.conv_kernel - 1) * l.conv_dim() + l.state_len());
        c.num_layers_of(LayerKind::LinearAttention) * per_layer * DType::F32.size()
    }
}
