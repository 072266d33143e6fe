//! The expert runners of the actor pipeline, called by the device stream's worker thread
//! inside the model's layer loop ([`ExpertRunner`]).
//!
//! Decode path, per MoE layer: ask the router for a plan (hits / fetches / CPU), send the CPU
//! jobs and the fetches off first, compute the hits on the device while they run, then the
//! fetched experts as their copies land, then add the CPU partial outputs. In the CPU mode
//! there is nothing to plan (every expert is a CPU job): the router is only told which
//! experts were routed, and the layer does not wait for it. Every routed
//! expert is computed exactly once, so the sum is the same as the reference pass.
//! Streaming path (prefill): the whole next MoE layer is copied into the other layer buffer
//! while this one computes.

use super::cache::CacheMsg;
use super::cpu::{CpuBatch, CpuInput, CpuIntake, CpuJob};
use super::router::{LayerPlan, RouterMsg};
use super::slots::SlotPool;
use super::transfer::{Copied, TransferMsg};
use super::blocking_reply;
use crate::engine::LayerStats;
use crate::model::forward::{download_f32, expert_forward_with, ExpertBuffers, ExpertExtras, ExpertRunner};
use crate::model::fault::PipelineFault;
use crate::model::weights::ExpertWeights;
use crate::model::routing::Routing;
use crate::model::{Model, ModelError};
use crate::policy::{ExpertKey, Lease, ResolvedMode, SlotId};
use ft_backend::{Backend, BufferUsage, DType, DeviceBuffer, HostRows};
use ractor::ActorRef;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::oneshot;

/// Handles to the actors a runner talks to.
#[derive(Clone)]
pub struct PipelineLinks {
    /// The router.
    pub router: ActorRef<RouterMsg>,
    /// The transfer engine.
    pub transfer: ActorRef<TransferMsg>,
    /// The CPU executors' intake.
    pub cpu: CpuIntake,
    /// The cache manager (told to forget experts whose copy failed).
    pub cache: ActorRef<CacheMsg>,
    /// Expert device memory.
    pub pool: Arc<SlotPool>,
}

/// Counters the runners accumulate for the device stream.
#[derive(Default)]
pub struct RunStats {
    /// Per MoE layer.
    pub layers: HashMap<usize, LayerStats>,
    /// Seconds spent in actor messaging (plan round trips, job delivery).
    pub messaging_s: f64,
    /// Seconds the device stream spent in MoE expert phases, from asking the router for a
    /// plan to the last expert's output added (messaging included).
    pub expert_phase_s: f64,
}

fn err(e: impl std::fmt::Display) -> ModelError {
    ModelError::Pipeline(PipelineFault::Internal(e.to_string()))
}

type CopyReply = oneshot::Receiver<Result<Copied, PipelineFault>>;

/// The fetches of one layer in flight. Whatever way the layer ends, every copy is waited for
/// before its slot's lease is released (so no copy lands in a slot that was handed on), and
/// the cache forgets every expert whose copy failed (its slot holds garbage).
struct InFlight<'a> {
    cache: &'a ActorRef<CacheMsg>,
    layer: u16,
    pending: std::collections::VecDeque<(u32, Lease, CopyReply)>,
    failed: Vec<ExpertKey>,
}

impl InFlight<'_> {
    /// The next copy to land: its expert, slot and outcome (the lease stays held until drop).
    fn next(&mut self, held: &mut Vec<Lease>) -> Option<(u32, SlotId, Result<Copied, ModelError>)> {
        let (e, lease, rx) = self.pending.pop_front()?;
        let slot = lease.slot();
        held.push(lease);
        let r = match blocking_reply(rx, "transfer engine") {
            Ok(Ok(c)) => Ok(c),
            Ok(Err(f)) | Err(f) => {
                self.failed.push(ExpertKey::new(self.layer, e));
                Err(ModelError::Pipeline(f))
            }
        };
        Some((e, slot, r))
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        for (e, lease, rx) in self.pending.drain(..) {
            if !matches!(blocking_reply(rx, "transfer engine"), Ok(Ok(_))) {
                self.failed.push(ExpertKey::new(self.layer, e));
            }
            drop(lease);
        }
        for key in self.failed.drain(..) {
            tracing::warn!("expert {} of layer {} dropped from the cache after a failed copy", key.expert, key.layer);
            let _ = self.cache.cast(CacheMsg::Remove { key });
        }
    }
}

fn scratch(be: &dyn Backend, len: usize) -> Result<DeviceBuffer, ModelError> {
    Ok(be.alloc(DType::F32, len, BufferUsage::Scratch)?)
}

/// Gathers the rows of `h` for one expert on the device and adds its weighted output.
/// `host` supplies the small extras (activation, biases) next to the device matrices `w`.
fn device_expert(
    model: &Model,
    w: &ExpertBuffers,
    host: &ExpertWeights,
    h: &DeviceBuffer,
    rows: &[u32],
    weights: &[f32],
    out: &mut DeviceBuffer,
) -> Result<(), ModelError> {
    let be = model.backend();
    let (hidden, inter) = (model.config().hidden_size, model.config().moe_intermediate_size);
    let extras = ExpertExtras::import(be, host, model.config().expert_activation)?;
    let mut xs = scratch(be, rows.len() * hidden)?;
    be.gather_rows(h, rows, hidden, &mut xs)?;
    let y = expert_forward_with(be, w, &extras, &xs, rows.len(), inter, hidden)?;
    be.scatter_add_rows(out, &y, rows, weights, hidden)?;
    Ok(())
}

/// The decode-path runner: cache hits on the device, misses fetched or sent to the CPU.
pub struct PipelineExperts<'a> {
    /// Actor handles.
    pub links: &'a PipelineLinks,
    /// Counters.
    pub stats: &'a mut RunStats,
    /// The first MoE layer (marks a new step for the router's usage counts).
    pub first_moe_layer: usize,
    /// The miss policy in effect (the device stream sets it, and tells the router).
    pub mode: ResolvedMode,
    /// This step's experts per layer, counted by the router once the step is done
    /// ([`ResolvedMode::Cpu`]).
    recorded: Vec<(u16, Vec<u32>)>,
}

impl ExpertRunner for PipelineExperts<'_> {
    fn run_experts(&mut self, model: &Model, layer: usize, h: &DeviceBuffer, routing: &Routing, out: &mut DeviceBuffer) -> Result<(), ModelError> {
        let start = Instant::now();
        let r = self.experts_inner(model, layer, h, routing, out);
        self.stats.expert_phase_s += start.elapsed().as_secs_f64();
        r
    }
}

impl<'a> PipelineExperts<'a> {
    /// A runner for one forward step.
    pub fn new(links: &'a PipelineLinks, stats: &'a mut RunStats, first_moe_layer: usize, mode: ResolvedMode) -> Self {
        Self { links, stats, first_moe_layer, mode, recorded: vec![] }
    }

    /// Ends the step: tells the router the experts it recorded (one message for the step).
    pub fn finish(self) -> Result<(), ModelError> {
        if self.recorded.is_empty() {
            return Ok(());
        }
        let t = Instant::now();
        self.links.router.cast(RouterMsg::RecordStep(self.recorded)).map_err(err)?;
        self.stats.messaging_s += t.elapsed().as_secs_f64();
        Ok(())
    }

    /// [`ExpertRunner::run_experts`], timed by the caller.
    fn experts_inner(&mut self, model: &Model, layer: usize, h: &DeviceBuffer, routing: &Routing, out: &mut DeviceBuffer) -> Result<(), ModelError> {
        let be = model.backend();
        let hidden = model.config().hidden_size;
        let host = model.experts(layer);
        let groups = routing.by_expert();
        let by_id: HashMap<u32, usize> = groups.iter().enumerate().map(|(i, g)| (g.0, i)).collect();
        let t0 = Instant::now();
        let new_step = layer == self.first_moe_layer;
        let plan = if self.mode == ResolvedMode::Cpu {
            // Nothing to lease or fetch: every expert goes to the CPU executors, in routing
            // order (so the sum of their outputs does not depend on earlier requests). The
            // router only counts them, once the step is done ([`Self::finish`]).
            let experts: Vec<u32> = groups.iter().map(|(e, _, _)| *e).collect();
            self.recorded.push((layer as u16, experts.clone()));
            LayerPlan { cpu: experts, ..Default::default() }
        } else {
            let (tx, rx) = oneshot::channel();
            let experts = groups.iter().map(|(e, rows, _)| (*e, rows.len())).collect();
            self.links.router.cast(RouterMsg::Plan { layer: layer as u16, experts, new_step, reply: tx.into() }).map_err(err)?;
            blocking_reply(rx, "router")?
        };
        self.stats.messaging_s += t0.elapsed().as_secs_f64();
        let mut st = LayerStats { hits: plan.hits.len() as u64, misses: (plan.fetch.len() + plan.cpu.len()) as u64, ..Default::default() };

        // CPU jobs first, one message for the layer: they run while the device works below.
        let mut cpu_reply = None;
        if !plan.cpu.is_empty() {
            let input = CpuInput { h: download_f32(be, h, routing.n_tokens() * hidden)?, hidden };
            let jobs = plan.cpu.iter().map(|&e| CpuJob { key: ExpertKey::new(layer as u16, e), rows: groups[by_id[&e]].1.clone() }).collect();
            let (tx, rx) = oneshot::channel();
            self.links.cpu.run(input, jobs, tx.into());
            cpu_reply = Some(rx);
        }
        let LayerPlan { hits, fetch, cpu } = plan;
        let mut fetches = InFlight { cache: &self.links.cache, layer: layer as u16, pending: Default::default(), failed: vec![] };
        for (e, lease) in fetch {
            let (tx, rx) = oneshot::channel();
            let key = ExpertKey::new(layer as u16, e);
            self.links
                .transfer
                .cast(TransferMsg::Fetch { key, slot: lease.slot(), sent: Instant::now(), reply: tx.into() })
                .map_err(err)?;
            fetches.pending.push_back((e, lease, rx));
        }
        let t_dev = Instant::now();
        for (e, lease) in &hits {
            let (_, rows, weights) = &groups[by_id[e]];
            let slot = self.links.pool.slot(lease.slot()).ok_or_else(|| err("leased slot missing"))?;
            let bufs = slot.lock().map_err(|_| err("slot lock poisoned"))?;
            device_expert(model, &bufs, &host[*e as usize], h, rows, weights, out)?;
        }
        st.device_s += t_dev.elapsed().as_secs_f64();
        // Leases of landed copies are held (here, then by `fetches`) until the layer is done.
        let mut landed = vec![];
        loop {
            let t_wait = Instant::now();
            let Some((e, slot_id, copied)) = fetches.next(&mut landed) else { break };
            let copied = copied?;
            st.fetch_wait_s += t_wait.elapsed().as_secs_f64();
            self.stats.messaging_s += copied.queued_s;
            st.fetched += 1;
            st.bytes_moved += copied.bytes;
            let t_dev = Instant::now();
            let (_, rows, weights) = &groups[by_id[&e]];
            let slot = self.links.pool.slot(slot_id).ok_or_else(|| err("fetched slot missing"))?;
            let bufs = slot.lock().map_err(|_| err("slot lock poisoned"))?;
            device_expert(model, &bufs, &host[e as usize], h, rows, weights, out)?;
            st.device_s += t_dev.elapsed().as_secs_f64();
        }
        drop(fetches);
        drop(landed);
        if let Some(rx) = cpu_reply {
            let batch: CpuBatch = blocking_reply(rx, "CPU executors")??;
            // Both hops: the jobs' wait for a worker, and the reply's for this thread to see it.
            self.stats.messaging_s += batch.queued_s + batch.sent_back.elapsed().as_secs_f64();
            // One call for the layer's outputs, added where they lie in host memory (the CPU
            // backend splits the tokens over its pool; others upload them into one buffer).
            let mut parts = Vec::with_capacity(cpu.len());
            for (e, d) in cpu.iter().zip(&batch.done) {
                st.cpu_s += d.secs;
                st.cpu_computed += 1;
                let (_, rows, weights) = &groups[by_id[e]];
                parts.push(HostRows { x: &d.y, rows, scales: weights });
            }
            be.scatter_add_rows_host(out, &parts, hidden)?;
        }
        drop(hits);
        self.stats.layers.entry(layer).or_default().add(&st);
        Ok(())
    }
}

/// The streaming-prefill runner: each MoE layer's experts arrive whole in a layer buffer,
/// the next layer's copy overlapping this layer's compute.
pub struct StreamingExperts<'a> {
    /// Actor handles.
    pub links: &'a PipelineLinks,
    /// Counters.
    pub stats: &'a mut RunStats,
    /// MoE layer indices in order.
    pub moe_layers: Vec<usize>,
    pending: Option<(usize, usize, CopyReply)>,
}

impl<'a> StreamingExperts<'a> {
    /// A runner over the MoE layers `moe_layers`.
    pub fn new(links: &'a PipelineLinks, stats: &'a mut RunStats, moe_layers: Vec<usize>) -> Self {
        Self { links, stats, moe_layers, pending: None }
    }

    fn load(&mut self, layer: usize, buffer: usize) -> Result<(usize, usize, CopyReply), ModelError> {
        let (tx, rx) = oneshot::channel();
        self.links.transfer.cast(TransferMsg::LoadLayer { layer, buffer, sent: Instant::now(), reply: tx.into() }).map_err(err)?;
        Ok((layer, buffer, rx))
    }
}

impl ExpertRunner for StreamingExperts<'_> {
    fn run_experts(&mut self, model: &Model, layer: usize, h: &DeviceBuffer, routing: &Routing, out: &mut DeviceBuffer) -> Result<(), ModelError> {
        let host = model.experts(layer);
        let idx = self.moe_layers.iter().position(|l| *l == layer).ok_or_else(|| err("not a MoE layer"))?;
        let buffer = idx % 2;
        let job = match self.pending.take() {
            Some(p) if p.0 == layer => p,
            _ => self.load(layer, buffer)?,
        };
        let mut st = LayerStats::default();
        let t_wait = Instant::now();
        let copied = blocking_reply(job.2, "transfer engine")??;
        st.fetch_wait_s += t_wait.elapsed().as_secs_f64();
        st.bytes_moved += copied.bytes;
        self.stats.messaging_s += copied.queued_s;
        // Start the next layer's copy into the other buffer before computing this one.
        if let Some(&next) = self.moe_layers.get(idx + 1) {
            self.pending = Some(self.load(next, 1 - buffer)?);
        }
        let t_dev = Instant::now();
        let buf = self.links.pool.layers[buffer].lock().map_err(|_| err("layer buffer lock poisoned"))?;
        if buf.layer != Some(layer) {
            return Err(err(format!("layer buffer {buffer} holds {:?}, expected {layer}", buf.layer)));
        }
        for (e, rows, weights) in routing.by_expert() {
            device_expert(model, &buf.experts[e as usize], &host[e as usize], h, &rows, &weights, out)?;
            st.streamed += 1;
        }
        st.device_s += t_dev.elapsed().as_secs_f64();
        self.stats.layers.entry(layer).or_default().add(&st);
        Ok(())
    }
}

impl Drop for StreamingExperts<'_> {
    fn drop(&mut self) {
        // A copy still in flight must finish before its buffer is reused by the next prompt.
        if let Some((_, _, rx)) = self.pending.take() {
            let _ = blocking_reply(rx, "transfer engine");
        }
    }
}
