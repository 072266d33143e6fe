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

/// One expert over its tokens: rows of the layer's [`CpuInput`].
pub struct CpuJob {
    /// Which expert.
    pub key: ExpertKey,
    /// The tokens' rows in the layer's input, in order.
    pub rows: Vec<u32>,
}

/// A layer's input to its jobs, `[tokens, hidden]`: each job gathers its tokens' rows on the
/// pool. Gathered on the device thread before sending, a 512-token bf16 prefill's 32 MB a
/// layer took 8–9 ms there, with both workers idle.
pub struct CpuInput {
    /// The rows.
    pub h: Vec<f32>,
    /// Values per row.
    pub hidden: usize,
}

impl CpuInput {
    /// `rows`' values, one after another.
    fn gather(&self, rows: &[u32]) -> Result<Vec<f32>, PipelineFault> {
        let mut xs = Vec::with_capacity(rows.len() * self.hidden);
        for &r in rows {
            let row = self.h.get(r as usize * self.hidden..).and_then(|v| v.get(..self.hidden));
            xs.extend_from_slice(row.ok_or_else(|| PipelineFault::Internal(format!("token row {r} is past the layer's input")))?);
        }
        Ok(xs)
    }
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

/// `out = x · mᵀ` as one product of [`kernels::matmul_same_x`].
fn same_x<'a>(m: &'a HostMatrix, out: &'a mut [f32]) -> kernels::SameX<'a> {
    kernels::SameX { w: m.bytes.as_slice(), dtype: m.dtype, m: m.rows, out }
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
    if w.up.cols != w.gate.cols {
        return Err(BackendError::Shape(format!("expert up takes {} inputs, gate {}", w.up.cols, w.gate.cols)));
    }
    let (mut g, mut u) = (vec![0f32; n * w.gate.rows], vec![0f32; n * w.up.rows]);
    crate::model::reads::add(w.gate.bytes.len() + w.up.bytes.len());
    // One preparation of the activations for both products.
    kernels::matmul_same_x(pool, level, dot, xs, n, w.gate.cols, &mut [same_x(&w.gate, &mut g), same_x(&w.up, &mut u)])?;
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

/// The weights of `job`'s expert, and the error its kernels' failures become (an armed
/// fault fails it here).
fn job_expert<'h>(
    host: &'h HostExperts,
    faults: &FaultInjector,
    job: &CpuJob,
) -> Result<(&'h ExpertWeights, impl Fn(BackendError) -> PipelineFault), PipelineFault> {
    let (layer, expert) = (job.key.layer as usize, job.key.expert);
    let w = host
        .get(layer)
        .and_then(|l| l.get(expert as usize))
        .ok_or_else(|| PipelineFault::Internal(format!("no expert {:?} in the host pool", job.key)))?;
    let kernel_err = move |source| PipelineFault::Cpu { layer, expert, source };
    if faults.take(FaultKind::Cpu) {
        return Err(kernel_err(BackendError::Device("injected kernel fault".into())));
    }
    Ok((w, kernel_err))
}

/// A layer's experts in two flat phases over the pool ([`kernels::matmul_many`]): every gate
/// and up product, then every down product, each phase's row chunks in contiguous runs, one
/// per worker, whose tails the first to finish take over. Whole experts a worker each left
/// one worker idle at the layer's end for 60 µs in the median and 280 µs on average (a
/// worker descheduled mid-expert held the layer up for milliseconds; 12-layer Q4_K_M decode,
/// 2 threads); here each phase ends within a chunk. Same kernels, so the same bits.
/// `secs` of a job is its share, by bytes, of the phases' worker time.
#[allow(clippy::too_many_arguments)]
fn experts_flat(
    pool: &ThreadPool,
    level: SimdLevel,
    dot: QuantDot,
    act: BinaryOp,
    host: &HostExperts,
    faults: &FaultInjector,
    input: &CpuInput,
    jobs: &[CpuJob],
) -> Result<Vec<CpuDone>, PipelineFault> {
    use kernels::ManyItem;
    let start = Instant::now();
    let experts = jobs.iter().map(|job| job_expert(host, faults, job)).collect::<Result<Vec<_>, _>>()?;
    // The experts' inputs gathered, and their outputs allocated, over the pool where there
    // are many tokens: on one thread, a 512-token prefill's copies (a layer's tokens eight
    // times over) left the other workers idle. A decode step's few rows stay on this thread.
    let prepare = |(j, (w, _)): (&CpuJob, &(&ExpertWeights, _))| -> Result<_, PipelineFault> {
        Ok((input.gather(&j.rows)?, (vec![0f32; j.rows.len() * w.gate.rows], vec![0f32; j.rows.len() * w.up.rows])))
    };
    let prepared: Vec<_> = if jobs.iter().map(|j| j.rows.len()).sum::<usize>() < 64 {
        jobs.iter().zip(&experts).map(prepare).collect::<Result<_, _>>()?
    } else {
        use rayon::prelude::*;
        pool.install(|| jobs.par_iter().zip(&experts).map(prepare).collect::<Result<_, _>>())?
    };
    let (xs, mut gu): (Vec<Vec<f32>>, Vec<(Vec<f32>, Vec<f32>)>) = prepared.into_iter().unzip();
    // Which expert a failed phase blames: the kernels' errors are shape errors of the first.
    let fail = |e: BackendError| experts.first().map_or(PipelineFault::Internal(e.to_string()), |(_, err)| err(e));
    let mut items: Vec<ManyItem<'_>> = Vec::with_capacity(2 * jobs.len());
    for (((job, (w, _)), (g, u)), x) in jobs.iter().zip(&experts).zip(&mut gu).zip(&xs) {
        crate::model::reads::add(w.gate.bytes.len() + w.up.bytes.len());
        items.push(item(x, job.rows.len(), &w.gate, &mut g[..]));
        items.push(item(x, job.rows.len(), &w.up, &mut u[..]));
    }
    kernels::matmul_many(pool, level, dot, &mut items).map_err(fail)?;
    drop(items);
    for ((w, err), (g, u)) in experts.iter().zip(&mut gu) {
        if let Some(b) = &w.biases {
            add_bias(g, &b.gate, w.gate.rows).map_err(err)?;
            add_bias(u, &b.up, w.up.rows).map_err(err)?;
        }
        kernels::binary(level, act, g, u).map_err(err)?;
    }
    let mut ys: Vec<Vec<f32>> = jobs.iter().zip(&experts).map(|(j, (w, _))| vec![0f32; j.rows.len() * w.down.rows]).collect();
    let mut items: Vec<ManyItem<'_>> = Vec::with_capacity(jobs.len());
    for ((job, (w, _)), ((g, _), y)) in jobs.iter().zip(&experts).zip(gu.iter().zip(&mut ys)) {
        crate::model::reads::add(w.down.bytes.len());
        items.push(item(&g[..], job.rows.len(), &w.down, &mut y[..]));
    }
    kernels::matmul_many(pool, level, dot, &mut items).map_err(fail)?;
    drop(items);
    let worker_s = start.elapsed().as_secs_f64() * pool.current_num_threads() as f64;
    let total: usize = experts.iter().map(|(w, _)| w.size_bytes()).sum();
    experts
        .iter()
        .zip(ys)
        .map(|((w, err), mut y)| {
            if let Some(b) = &w.biases {
                add_bias(&mut y, &b.down, w.down.rows).map_err(err)?;
            }
            let bytes = w.size_bytes();
            Ok(CpuDone { y, secs: worker_s * bytes as f64 / total.max(1) as f64, bytes: bytes as u64 })
        })
        .collect()
}

/// `out = x · mᵀ` as one product of [`kernels::matmul_many`].
fn item<'a>(x: &'a [f32], n: usize, m: &'a HostMatrix, out: &'a mut [f32]) -> kernels::ManyItem<'a> {
    kernels::ManyItem { x, n, k: m.cols, w: m.bytes.as_slice(), dtype: m.dtype, m: m.rows, out }
}

impl CpuIntake {
    /// Queues one layer's jobs over `input` (one message per layer and step, not per expert)
    /// on the pool; the outputs come back through `reply` in job order.
    pub fn run(&self, input: CpuInput, jobs: Vec<CpuJob>, reply: CpuReply) {
        let sent = Instant::now();
        let CpuIntake { pool, level, dot, act, host, faults } = self.clone();
        self.pool.spawn(move || {
            let queued_s = sent.elapsed().as_secs_f64();
            // Memory-bound experts (few tokens each) run as one list of row chunks a phase
            // (gate and up, then down); compute-bound ones side by side as rayon splits them,
            // each product split over the pool too.
            let tokens: Vec<usize> = jobs.iter().map(|j| j.rows.len()).collect();
            let r = if crate::policy::executors::flat(&tokens, pool.current_num_threads()) {
                experts_flat(&pool, level, dot, act, &host, &faults, &input, &jobs)
            } else {
                use rayon::prelude::*;
                jobs.par_iter()
                    .map(|job| {
                        let start = Instant::now();
                        let (w, kernel_err) = job_expert(&host, &faults, job)?;
                        let xs = input.gather(&job.rows)?;
                        let y = expert_on_cpu(Some(&*pool), level, dot, act, w, &xs, job.rows.len()).map_err(kernel_err)?;
                        Ok(CpuDone { y, secs: start.elapsed().as_secs_f64(), bytes: w.size_bytes() as u64 })
                    })
                    .collect()
            };
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
