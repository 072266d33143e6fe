//! The CPU executors: a thread pool that computes experts straight from the host pool (the
//! memory-mapped checkpoint), so cache misses need no transfer at all.
//!
//! A layer's jobs reach the pool through the executors' intake ([`CpuIntake`]), which the
//! device stream gets from the actor once: the jobs go into the pool's own queue, where its
//! workers (polling through a step, see [`super::install_awake`]) take them within a few
//! microseconds. Sent to the actor on the async runtime they woke a parked runtime thread per
//! layer, and it took the core of the step that sent them: 60 µs from sending to the first
//! expert starting, against 3.5 with the intake (12-layer Q4_K_M decode, 2 threads).

use super::faults::{FaultInjector, FaultKind};
use super::HostExperts;
use crate::model::fault::PipelineFault;
use crate::model::weights::{ExpertWeights, HostMatrix};
use crate::policy::ExpertKey;
use ft_backend::{BackendError, BinaryOp};
use ft_backend_cpu::kernels::{self, QuantDot, SimdLevel};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use rayon::ThreadPool;
use std::sync::Arc;
use std::time::Instant;

/// A finished expert job.
#[derive(Debug, Default)]
pub struct CpuDone {
    /// `[n, hidden]` expert output.
    pub y: Vec<f32>,
    /// Seconds of compute.
    pub secs: f64,
    /// Weight bytes streamed.
    pub bytes: u64,
}

/// A layer's finished jobs, in job order.
#[derive(Debug)]
pub struct CpuBatch {
    /// One per job.
    pub done: Vec<CpuDone>,
    /// Seconds from sending the jobs to the first one starting (messaging).
    pub queued_s: f64,
    /// When the reply was sent (the receiver times its own wait from here).
    pub sent_back: Instant,
}

/// One expert over `n` token rows `xs` (`[n, hidden]`).
pub struct CpuJob {
    /// Which expert.
    pub key: ExpertKey,
    /// Token rows.
    pub xs: Vec<f32>,
    /// Number of rows.
    pub n: usize,
}

/// The reply to a layer's jobs.
pub type CpuReply = RpcReplyPort<Result<CpuBatch, PipelineFault>>;

/// Messages of the CPU executors.
pub enum CpuMsg {
    /// The intake to send jobs through (asked once, by the device stream at start).
    Intake(RpcReplyPort<CpuIntake>),
}

/// The executors' intake: what a layer's jobs need on the pool, shared by every sender.
#[derive(Clone)]
pub struct CpuIntake {
    pool: Arc<ThreadPool>,
    level: SimdLevel,
    dot: QuantDot,
    act: BinaryOp,
    host: HostExperts,
    faults: Arc<FaultInjector>,
}

/// The CPU executor pool actor.
pub struct CpuExecutors;

/// One product, split over `pool`, or on the calling thread without one.
fn mat(pool: Option<&ThreadPool>, level: SimdLevel, dot: QuantDot, x: &[f32], n: usize, m: &HostMatrix) -> Result<Vec<f32>, BackendError> {
    let mut out = vec![0f32; n * m.rows];
    crate::model::reads::add(m.bytes.len());
    kernels::matmul(pool, level, dot, x, n, m.cols, m.bytes.as_slice(), m.dtype, m.rows, &mut out)?;
    Ok(out)
}

/// Adds a `[cols]` f32 bias (host bytes) to every row of `y`.
fn add_bias(y: &mut [f32], bias: &ft_backend::HostBytes, cols: usize) -> Result<(), BackendError> {
    let b = ft_backend::dtype::to_f32_vec(bias.as_slice(), ft_backend::DType::F32)?;
    if b.len() != cols {
        return Err(BackendError::Shape(format!("expert bias has {} values, expected {cols}", b.len())));
    }
    y.chunks_exact_mut(cols).for_each(|row| row.iter_mut().zip(&b).for_each(|(v, b)| *v += b));
    Ok(())
}

/// `down(act(gate·x + b_g, up·x + b_u)) + b_d` on the CPU kernels, the same math as the
/// device path; each product split over `pool`, or all on the calling thread without one.
pub fn expert_on_cpu(
    pool: Option<&ThreadPool>,
    level: SimdLevel,
    dot: QuantDot,
    act: BinaryOp,
    w: &ExpertWeights,
    xs: &[f32],
    n: usize,
) -> Result<Vec<f32>, BackendError> {
    let mut g = mat(pool, level, dot, xs, n, &w.gate)?;
    let mut u = mat(pool, level, dot, xs, n, &w.up)?;
    if let Some(b) = &w.biases {
        add_bias(&mut g, &b.gate, w.gate.rows)?;
        add_bias(&mut u, &b.up, w.up.rows)?;
    }
    kernels::binary(level, act, &mut g, &u)?;
    let mut y = mat(pool, level, dot, &g, n, &w.down)?;
    if let Some(b) = &w.biases {
        add_bias(&mut y, &b.down, w.down.rows)?;
    }
    Ok(y)
}

impl CpuIntake {
    /// Queues one layer's jobs (one message per layer and step, not per expert) on the pool;
    /// the outputs come back through `reply` in job order.
    pub fn run(&self, jobs: Vec<CpuJob>, reply: CpuReply) {
        let sent = Instant::now();
        let CpuIntake { pool, level, dot, act, host, faults } = self.clone();
        self.pool.spawn(move || {
            use rayon::prelude::*;
            let queued_s = sent.elapsed().as_secs_f64();
            // Experts run side by side, each whole on one worker, where they share the workers
            // evenly; otherwise each one's products split their rows over the pool in turn.
            let tokens: Vec<usize> = jobs.iter().map(|j| j.n).collect();
            let alone = crate::policy::executors::side_by_side(&tokens, pool.current_num_threads());
            let split = (!alone).then_some(&*pool);
            let r: Result<Vec<CpuDone>, PipelineFault> = jobs
                .par_iter()
                .with_max_len(if alone { 1 } else { usize::MAX })
                .map(|job| {
                    let start = Instant::now();
                    let (layer, expert) = (job.key.layer as usize, job.key.expert);
                    let w = host
                        .get(layer)
                        .and_then(|l| l.get(expert as usize))
                        .ok_or_else(|| PipelineFault::Internal(format!("no expert {:?} in the host pool", job.key)))?;
                    let kernel_err = |source| PipelineFault::Cpu { layer, expert, source };
                    if faults.take(FaultKind::Cpu) {
                        return Err(kernel_err(BackendError::Device("injected kernel fault".into())));
                    }
                    let y = expert_on_cpu(split, level, dot, act, w, &job.xs, job.n).map_err(kernel_err)?;
                    Ok(CpuDone { y, secs: start.elapsed().as_secs_f64(), bytes: w.size_bytes() as u64 })
                })
                .collect();
            let _ = reply.send(r.map(|done| CpuBatch { done, queued_s, sent_back: Instant::now() }));
        });
    }
}

impl Actor for CpuExecutors {
    type Msg = CpuMsg;
    type State = CpuIntake;
    /// The worker pool (the engine's, shared with a CPU backend), the decode products' mode,
    /// the experts' activation, the host pool and the armed faults.
    type Arguments = (Arc<rayon::ThreadPool>, QuantDot, BinaryOp, HostExperts, Arc<FaultInjector>);

    async fn pre_start(&self, _me: ActorRef<CpuMsg>, (pool, dot, act, host, faults): Self::Arguments) -> Result<CpuIntake, ActorProcessingErr> {
        Ok(CpuIntake { pool, level: SimdLevel::Auto.effective(), dot, act, host, faults })
    }

    async fn handle(&self, _me: ActorRef<CpuMsg>, msg: CpuMsg, st: &mut CpuIntake) -> Result<(), ActorProcessingErr> {
        let CpuMsg::Intake(reply) = msg;
        let _ = reply.send(st.clone());
        Ok(())
    }
}
