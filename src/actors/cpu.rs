//! The CPU executors: a thread pool that computes experts straight from the host pool (the
//! memory-mapped checkpoint), so cache misses need no transfer at all.

use super::HostExperts;
use crate::model::weights::{ExpertWeights, HostMatrix};
use crate::policy::ExpertKey;
use ft_backend::BinaryOp;
use ft_backend_cpu::kernels::{self, SimdLevel};
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
    /// Seconds from sending the message to its handler receiving it (actor messaging).
    pub queued_s: f64,
    /// Weight bytes streamed.
    pub bytes: u64,
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

/// Messages of the CPU executors.
pub enum CpuMsg {
    /// Compute every job of one layer (one message per layer and step, not per expert);
    /// the outputs come back in job order.
    Run { jobs: Vec<CpuJob>, sent: Instant, reply: RpcReplyPort<Result<Vec<CpuDone>, String>> },
}

/// What the executors hold.
pub struct CpuState {
    pool: Arc<ThreadPool>,
    level: SimdLevel,
    host: HostExperts,
}

/// The CPU executor pool actor.
pub struct CpuExecutors;

fn mat(pool: &ThreadPool, level: SimdLevel, x: &[f32], n: usize, m: &HostMatrix) -> Result<Vec<f32>, String> {
    let mut out = vec![0f32; n * m.rows];
    kernels::matmul(pool, level, x, n, m.cols, m.bytes.as_slice(), m.dtype, m.rows, &mut out).map_err(|e| e.to_string())?;
    Ok(out)
}

/// `down(silu(gate·x) ⊙ up·x)` on the CPU kernels, the same math as the device path.
pub fn expert_on_cpu(pool: &ThreadPool, level: SimdLevel, w: &ExpertWeights, xs: &[f32], n: usize) -> Result<Vec<f32>, String> {
    let mut g = mat(pool, level, xs, n, &w.gate)?;
    let u = mat(pool, level, xs, n, &w.up)?;
    kernels::binary(level, BinaryOp::SwiGlu, &mut g, &u).map_err(|e| e.to_string())?;
    mat(pool, level, &g, n, &w.down)
}

impl Actor for CpuExecutors {
    type Msg = CpuMsg;
    type State = CpuState;
    type Arguments = (usize, HostExperts);

    async fn pre_start(&self, _me: ActorRef<CpuMsg>, (threads, host): Self::Arguments) -> Result<CpuState, ActorProcessingErr> {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads.max(1)).thread_name(|i| format!("ft-cpu-exec-{i}")).build()?;
        Ok(CpuState { pool: Arc::new(pool), level: SimdLevel::Auto.effective(), host })
    }

    async fn handle(&self, _me: ActorRef<CpuMsg>, msg: CpuMsg, st: &mut CpuState) -> Result<(), ActorProcessingErr> {
        let CpuMsg::Run { jobs, sent, reply } = msg;
        let delivered = Instant::now();
        let (pool, level, host) = (st.pool.clone(), st.level, st.host.clone());
        st.pool.spawn(move || {
            use rayon::prelude::*;
            // Experts run side by side; each one's matmuls also split rows over the pool.
            let r: Result<Vec<CpuDone>, String> = jobs
                .par_iter()
                .map(|job| {
                    let start = Instant::now();
                    let w = host
                        .get(job.key.layer as usize)
                        .and_then(|l| l.get(job.key.expert as usize))
                        .ok_or_else(|| format!("no expert {:?} in the host pool", job.key))?;
                    let y = expert_on_cpu(&pool, level, w, &job.xs, job.n)?;
                    Ok(CpuDone { y, secs: start.elapsed().as_secs_f64(), queued_s: (delivered - sent).as_secs_f64(), bytes: w.size_bytes() as u64 })
                })
                .collect();
            let _ = reply.send(r);
        });
        Ok(())
    }
}
