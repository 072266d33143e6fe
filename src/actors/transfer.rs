//! The transfer engine: copies experts from the host pool into cache slots and layer
//! buffers on its own copy stream, off the async runtime.

use super::slots::{upload_expert, SlotPool};
use super::HostExperts;
use crate::policy::{ExpertKey, SlotId};
use ft_backend::{Backend, StreamId};
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
    Fetch { key: ExpertKey, slot: SlotId, sent: Instant, reply: RpcReplyPort<Result<Copied, String>> },
    /// Copy every expert of `layer` into layer buffer `buffer` (0 or 1).
    LoadLayer { layer: usize, buffer: usize, sent: Instant, reply: RpcReplyPort<Result<Copied, String>> },
}

/// What the transfer engine holds.
pub struct TransferState {
    backend: Arc<dyn Backend>,
    pool: Arc<SlotPool>,
    host: HostExperts,
    stream: StreamId,
}

/// The transfer engine actor.
pub struct TransferEngine;

impl Actor for TransferEngine {
    type Msg = TransferMsg;
    type State = TransferState;
    type Arguments = (Arc<dyn Backend>, Arc<SlotPool>, HostExperts);

    async fn pre_start(&self, _me: ActorRef<TransferMsg>, (backend, pool, host): Self::Arguments) -> Result<TransferState, ActorProcessingErr> {
        let stream = backend.create_stream()?;
        Ok(TransferState { backend, pool, host, stream })
    }

    async fn handle(&self, _me: ActorRef<TransferMsg>, msg: TransferMsg, st: &mut TransferState) -> Result<(), ActorProcessingErr> {
        let (be, pool, host, stream) = (st.backend.clone(), st.pool.clone(), st.host.clone(), st.stream);
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
                            .ok_or_else(|| format!("no expert {key:?} in the host pool"))?;
                        let slot = pool.slot(slot).ok_or_else(|| format!("no slot {slot:?}"))?;
                        let mut bufs = slot.lock().map_err(|_| "slot lock poisoned".to_string())?;
                        let bytes = upload_expert(be.as_ref(), stream, w, &mut bufs).map_err(|e| e.to_string())?;
                        be.synchronize(stream).map_err(|e| e.to_string())?;
                        Ok(Copied { bytes, secs: start.elapsed().as_secs_f64(), queued_s: (delivered - sent).as_secs_f64() })
                    })();
                    let _ = reply.send(r);
                });
            }
            TransferMsg::LoadLayer { layer, buffer, sent, reply } => {
                tokio::task::spawn_blocking(move || {
                    let start = Instant::now();
                    let r = (|| {
                        let experts = host.get(layer).ok_or_else(|| format!("no layer {layer}"))?;
                        let mut buf = pool.layers[buffer & 1].lock().map_err(|_| "layer buffer lock poisoned".to_string())?;
                        buf.layer = None;
                        pool.ensure_layer_buffer(&mut buf, experts.len()).map_err(|e| e.to_string())?;
                        let mut bytes = 0;
                        for (w, dst) in experts.iter().zip(buf.experts.iter_mut()) {
                            bytes += upload_expert(be.as_ref(), stream, w, dst).map_err(|e| e.to_string())?;
                        }
                        be.synchronize(stream).map_err(|e| e.to_string())?;
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
