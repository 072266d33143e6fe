//! Device memory for experts: the cache slots and the two layer buffers of streaming
//! prefill. Shared by the device stream (reads) and the transfer engine (writes); the slot
//! table in the cache manager decides who may touch which slot when.

use crate::model::forward::ExpertBuffers;
use crate::model::weights::ExpertWeights;
use crate::policy::SlotId;
use ft_backend::{Backend, BackendError, BufferUsage, DType, StreamId};
use std::sync::{Arc, Mutex, RwLock};

/// Dimensions of one expert.
#[derive(Clone, Copy, Debug)]
pub struct ExpertShape {
    /// Intermediate size.
    pub inter: usize,
    /// Hidden size.
    pub hidden: usize,
    /// Weight dtype.
    pub dtype: DType,
}

impl ExpertShape {
    /// Bytes of one expert (rows of quantized types padded to whole blocks).
    pub fn bytes(&self) -> u64 {
        (2 * self.inter * self.dtype.row_bytes(self.hidden) + self.hidden * self.dtype.row_bytes(self.inter)) as u64
    }
}

/// A whole MoE layer's experts resident in one buffer set.
pub struct LayerBuffer {
    /// Which layer it holds (`None` while empty or being overwritten).
    pub layer: Option<usize>,
    /// One entry per expert.
    pub experts: Vec<ExpertBuffers>,
}

/// All expert device memory.
pub struct SlotPool {
    backend: Arc<dyn Backend>,
    shape: ExpertShape,
    slots: RwLock<Vec<Arc<Mutex<ExpertBuffers>>>>,
    /// The double buffers of streaming prefill (allocated on first use).
    pub layers: [Mutex<LayerBuffer>; 2],
}

fn alloc_expert(be: &dyn Backend, s: ExpertShape) -> Result<ExpertBuffers, BackendError> {
    Ok(ExpertBuffers {
        gate: be.alloc(s.dtype, s.inter * s.dtype.padded(s.hidden), BufferUsage::ExpertSlot)?,
        up: be.alloc(s.dtype, s.inter * s.dtype.padded(s.hidden), BufferUsage::ExpertSlot)?,
        down: be.alloc(s.dtype, s.hidden * s.dtype.padded(s.inter), BufferUsage::ExpertSlot)?,
    })
}

/// Copies one expert's host matrices into device buffers on `stream`.
pub fn upload_expert(be: &dyn Backend, stream: StreamId, w: &ExpertWeights, dst: &mut ExpertBuffers) -> Result<u64, BackendError> {
    be.upload(stream, w.gate.bytes.as_slice(), &mut dst.gate, 0)?;
    be.upload(stream, w.up.bytes.as_slice(), &mut dst.up, 0)?;
    be.upload(stream, w.down.bytes.as_slice(), &mut dst.down, 0)?;
    Ok(w.size_bytes() as u64)
}

impl SlotPool {
    /// A pool of `slots` expert slots.
    pub fn new(backend: Arc<dyn Backend>, shape: ExpertShape, slots: usize) -> Result<SlotPool, BackendError> {
        let pool = SlotPool {
            backend,
            shape,
            slots: RwLock::new(vec![]),
            layers: [Mutex::new(LayerBuffer { layer: None, experts: vec![] }), Mutex::new(LayerBuffer { layer: None, experts: vec![] })],
        };
        pool.resize(slots)?;
        Ok(pool)
    }

    /// One expert's buffers outside any pool (e.g. for measuring copy bandwidth).
    pub fn new_detached(be: &dyn Backend, shape: ExpertShape) -> Result<ExpertBuffers, BackendError> {
        alloc_expert(be, shape)
    }

    /// Expert dimensions.
    pub fn shape(&self) -> ExpertShape {
        self.shape
    }

    /// Number of slots.
    pub fn len(&self) -> usize {
        self.slots.read().map(|s| s.len()).unwrap_or(0)
    }

    /// Whether there are no slots.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The buffers of a slot.
    pub fn slot(&self, id: SlotId) -> Option<Arc<Mutex<ExpertBuffers>>> {
        self.slots.read().ok()?.get(id.0 as usize).cloned()
    }

    /// Grows (allocating) or shrinks (freeing the highest slots) to `n` slots. Callers vacate
    /// the dropped slots in the slot table first.
    pub fn resize(&self, n: usize) -> Result<(), BackendError> {
        let mut slots = self.slots.write().map_err(|_| BackendError::Device("slot pool lock poisoned".into()))?;
        if n < slots.len() {
            slots.truncate(n);
        }
        while slots.len() < n {
            slots.push(Arc::new(Mutex::new(alloc_expert(self.backend.as_ref(), self.shape)?)));
        }
        Ok(())
    }

    /// Makes sure layer buffer `idx` holds `experts` buffers.
    pub fn ensure_layer_buffer(&self, buf: &mut LayerBuffer, experts: usize) -> Result<(), BackendError> {
        while buf.experts.len() < experts {
            buf.experts.push(alloc_expert(self.backend.as_ref(), self.shape)?);
        }
        Ok(())
    }
}
