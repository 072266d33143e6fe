//! Device memory for experts: the cache slots and the two layer buffers of streaming
//! prefill. Shared by the device stream (reads) and the transfer engine (writes); the slot
//! table in the cache manager decides who may touch which slot when.

use super::faults::{FaultInjector, FaultKind};
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
    /// Storage types of gate, up and down: for each, the widest any layer uses, so that one
    /// slot holds any layer's expert.
    pub dtypes: [DType; 3],
}

impl ExpertShape {
    /// Bytes of one expert slot (rows of quantized types padded to whole blocks).
    pub fn bytes(&self) -> u64 {
        let [g, u, d] = self.dtypes;
        (self.inter * (g.row_bytes(self.hidden) + u.row_bytes(self.hidden)) + self.hidden * d.row_bytes(self.inter)) as u64
    }

    /// The shape whose slots hold every expert of `experts` (all layers).
    pub fn covering<'a>(inter: usize, hidden: usize, experts: impl Iterator<Item = &'a ExpertWeights>) -> ExpertShape {
        let mut dtypes = [DType::F32; 3];
        let mut widest = [0usize; 3];
        for e in experts {
            for (i, m) in [&e.gate, &e.up, &e.down].into_iter().enumerate() {
                if widest[i] == 0 || m.size_bytes() > widest[i] {
                    widest[i] = m.size_bytes();
                    dtypes[i] = m.dtype;
                }
            }
        }
        ExpertShape { inter, hidden, dtypes }
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
    faults: Arc<FaultInjector>,
    /// The double buffers of streaming prefill (allocated on first use).
    pub layers: [Mutex<LayerBuffer>; 2],
}

fn alloc_expert(be: &dyn Backend, s: ExpertShape) -> Result<ExpertBuffers, BackendError> {
    let [g, u, d] = s.dtypes;
    Ok(ExpertBuffers {
        gate: be.alloc(g, s.inter * g.padded(s.hidden), BufferUsage::ExpertSlot)?,
        up: be.alloc(u, s.inter * u.padded(s.hidden), BufferUsage::ExpertSlot)?,
        down: be.alloc(d, s.hidden * d.padded(s.inter), BufferUsage::ExpertSlot)?,
    })
}

/// Copies one expert's host matrices into device buffers on `stream`.
pub fn upload_expert(be: &dyn Backend, stream: StreamId, w: &ExpertWeights, dst: &mut ExpertBuffers) -> Result<u64, BackendError> {
    for (m, buf) in [(&w.gate, &mut dst.gate), (&w.up, &mut dst.up), (&w.down, &mut dst.down)] {
        // The slot may last have held a layer stored in another block type.
        buf.retype(m.dtype, m.rows * m.dtype.padded(m.cols))?;
        be.upload(stream, m.bytes.as_slice(), buf, 0)?;
    }
    Ok(w.size_bytes() as u64)
}

impl SlotPool {
    /// A pool of `slots` expert slots; `faults` can make growing it fail (tests).
    pub fn new(backend: Arc<dyn Backend>, shape: ExpertShape, slots: usize, faults: Arc<FaultInjector>) -> Result<SlotPool, BackendError> {
        let pool = SlotPool {
            backend,
            shape,
            slots: RwLock::new(vec![]),
            faults,
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
    /// the dropped slots in the slot table first. A growth that fails part-way frees what it
    /// allocated: the pool is then as it was.
    pub fn resize(&self, n: usize) -> Result<(), BackendError> {
        let mut slots = self.slots.write().map_err(|_| BackendError::Device("slot pool lock poisoned".into()))?;
        let old = slots.len();
        if n < old {
            slots.truncate(n);
        }
        while slots.len() < n {
            let buffers = if self.faults.take(FaultKind::Alloc) {
                Err(BackendError::OutOfMemory { requested: self.shape.bytes(), free: 0 })
            } else {
                alloc_expert(self.backend.as_ref(), self.shape)
            };
            match buffers {
                Ok(b) => slots.push(Arc::new(Mutex::new(b))),
                Err(e) => {
                    slots.truncate(old);
                    return Err(e);
                }
            }
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
