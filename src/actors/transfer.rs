//! The transfer engine: copies experts from the host pool into cache slots and layer
//! buffers on its own copy stream, off the async runtime.

use super::faults::{FaultInjector, FaultKind};
use super::slots::{upload_expert, SlotPool};
use super::HostExperts;
use crate::model::fault::PipelineFault;
use crate::model::weights::ExpertWeights;
use crate::policy::{ExpertKey, SlotId};
use crate::model::forward::ExpertBuffers;
use ft_backend::{Backend, BackendError, StreamId};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use std::sync::Arc;
use std::time::Instant;

/// A finished copy.
#[derive(Clone, Copy, Debug, Default)]
pub struct Copied {
    /// Bytes moved host→device.
    pub bytes: u64,
    /// Seconds the copy took.
    pub secs: f64,
    /// Seconds from sending the request to the handler receiving it (actor messaging).
    pub queued_s: f64,
}

/// Messages of the transfer engine.
pub enum TransferMsg {
    /// Copy one expert into a cache slot.
    Fetch { key: ExpertKey, slot: SlotId, sent: Instant, reply: RpcReplyPort<Result<Copied, PipelineFault>> },
    /// Copy every expert of `layer` into layer buffer `buffer` (0 or 1).
    LoadLayer { layer: usize, buffer: usize, sent: Instant, reply: RpcReplyPort<Result<Copied, PipelineFault>> },
}

/// What the transfer engine holds.
pub struct TransferState {
    backend: Arc<dyn Backend>,
    pool: Arc<SlotPool>,
    host: HostExperts,
    stream: StreamId,
    faults: Arc<FaultInjector>,
}

/// One expert's copy, or the fault armed for it: a failing copy stops after the gate matrix
/// (so the slot holds part of the new expert, as a real failure would leave it).
fn copy_expert(be: &dyn Backend, stream: StreamId, w: &ExpertWeights, dst: &mut ExpertBuffers, faults: &FaultInjector) -> Result<u64, BackendError> {
    if faults.take(FaultKind::CopyOom) {
        return Err(BackendError::OutOfMemory { requested: w.size_bytes() as u64, free: 0 });
    }
    if faults.take(FaultKind::Copy) {
        dst.gate.retype(w.gate.dtype, w.gate.rows * w.gate.dtype.padded(w.gate.cols))?;
        be.upload(stream, w.gate.bytes.as_slice(), &mut dst.gate, 0)?;
        return Err(BackendError::Device("injected copy fault".into()));
    }
    upload_expert(be, stream, w, dst)
}

/// The transfer engine actor.
pub struct TransferEngine;

impl Actor for TransferEngine {
    type Msg = TransferMsg;
    type State = TransferState;
    type Arguments = (Arc<dyn Backend>, Arc<SlotPool>, HostExperts, Arc<FaultInjector>);

    async fn pre_start(&self, _me: ActorRef<TransferMsg>, (backend, pool, host, faults): Self::Arguments) -> Result<TransferState, ActorProcessingErr> {
        let stream = backend.create_stream()?;
        Ok(TransferState { backend, pool, host, stream, faults })
    }

    async fn handle(&self, _me: ActorRef<TransferMsg>, msg: TransferMsg, st: &mut TransferState) -> Result<(), ActorProcessingErr> {
        let (be, pool, host, stream, faults) = (st.backend.clone(), st.pool.clone(), st.host.clone(), st.stream, st.faults.clone());
        let delivered = Instant::now();
        // Copies block (they wait for the copy stream), so they run on the blocking pool.
        match msg {
            TransferMsg::Fetch { key, slot, sent, reply } => {
                tokio::task::spawn_blocking(move || {
                    let start = Instant::now();
                    let r = (|| {
                        let w = host
                            .get(key.layer as usize)
                            .and_then(|l| l.get(key.expert as usize))
                            .ok_or_else(|| PipelineFault::Internal(format!("no expert {key:?} in the host pool")))?;
                        let slot = pool.slot(slot).ok_or_else(|| PipelineFault::Internal(format!("no slot {slot:?}")))?;
                        let mut bufs = slot.lock().map_err(|_| PipelineFault::Internal("slot lock poisoned".into()))?;
                        let copy_err = |source| PipelineFault::Copy { layer: key.layer as usize, expert: Some(key.expert), source };
                        let bytes = copy_expert(be.as_ref(), stream, w, &mut bufs, &faults).map_err(copy_err)?;
                        be.synchronize(stream).map_err(copy_err)?;
                        Ok(Copied { bytes, secs: start.elapsed().as_secs_f64(), queued_s: (delivered - sent).as_secs_f64() })
                    })();
                    let _ = reply.send(r);
                });
            }
            TransferMsg::LoadLayer { layer, buffer, sent, reply } => {
                tokio::task::spawn_blocking(move || {
                    let start = Instant::now();
                    let r = (|| {
                        let experts = host.get(layer).ok_or_else(|| PipelineFault::Internal(format!("no layer {layer}")))?;
                        let mut buf = pool.layers[buffer & 1].lock().map_err(|_| PipelineFault::Internal("layer buffer lock poisoned".into()))?;
                        // Marked empty until the whole layer has landed: a failed copy leaves
                        // nothing that a later prompt would take for this layer.
                        buf.layer = None;
                        let copy_err = |source| PipelineFault::Copy { layer, expert: None, source };
                        pool.ensure_layer_buffer(&mut buf, experts.len()).map_err(copy_err)?;
                        let mut bytes = 0;
                        for (w, dst) in experts.iter().zip(buf.experts.iter_mut()) {
                            bytes += copy_expert(be.as_ref(), stream, w, dst, &faults).map_err(copy_err)?;
                        }
                        be.synchronize(stream).map_err(copy_err)?;
                        buf.layer = Some(layer);
                        Ok(Copied { bytes, secs: start.elapsed().as_secs_f64(), queued_s: (delivered - sent).as_secs_f64() })
                    })();
                    let _ = reply.send(r);
                });
            }
        }
        Ok(())
    }
}
