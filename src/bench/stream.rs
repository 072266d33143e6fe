//! The rate the CPU kernels stream a weight format at, measured the way decoding reads
//! experts: `top_k` experts of the model's shape at once (gate, up, down), over far more
//! distinct weights than any cache holds. `ft-actor plan` predicts from these.
//!
//! Memory bandwidth on a shared machine moves by tens of percent from one second to the next,
//! so a probe runs passes for a set time and reports their median, not one lucky pass.

use ft_backend::{BackendError, DType};
use ft_backend_cpu::kernels::{self, ManyItem, QuantDot, SimdLevel};
use rayon::ThreadPool;
use std::time::{Duration, Instant};

/// One measured streaming rate.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct StreamRate {
    /// The weight format.
    #[serde(serialize_with = "dtype_name")]
    pub dtype: DType,
    /// Bytes per second, median pass.
    pub bytes_per_s: f64,
    /// Slowest and fastest pass, bytes per second.
    pub min_bytes_per_s: f64,
    /// Fastest pass.
    pub max_bytes_per_s: f64,
    /// Bytes one pass reads.
    pub bytes: u64,
    /// Timed passes.
    pub passes: usize,
}

fn dtype_name<S: serde::Serializer>(d: &DType, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(d.name())
}

/// The expert a probe imitates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpertShape {
    /// `hidden_size`: the gate's and up's inputs, the down's outputs.
    pub hidden: usize,
    /// `moe_intermediate_size`.
    pub intermediate: usize,
    /// Experts computed at once (`top_k`).
    pub parallel: usize,
}

/// Bytes each pass streams: far past any last-level cache, so every pass reads memory.
pub const PROBE_BYTES: u64 = 512 << 20;

fn matrix(dtype: DType, rows: usize, cols: usize) -> Vec<u8> {
    let values: Vec<f32> = (0..rows * cols).map(|i| ((i.wrapping_mul(2654435761) % 2001) as f32 - 1000.0) * 2e-5).collect();
    match dtype {
        DType::F32 => bytemuck::cast_slice(&values).to_vec(),
        DType::F16 => values.iter().flat_map(|v| half::f16::from_f32(*v).to_le_bytes()).collect(),
        DType::BF16 => values.iter().flat_map(|v| half::bf16::from_f32(*v).to_le_bytes()).collect(),
        d => ft_backend::quant::quantize_matrix(d, &values, rows, cols),
    }
}

/// `copies` back-to-back copies of `expert`, mapped read-only: in a temporary file (unlinked
/// at once; the mapping keeps its pages) as the engine's experts are page-cache pages. Where
/// the temporary folder cannot hold them (a full disk, a small tmpfs), in anonymous memory
/// instead, which streams at the same speed, so that a plan still comes out.
fn mapped_copies(expert: &[Vec<u8>; 3], copies: usize) -> std::io::Result<memmap2::Mmap> {
    file_copies(expert, copies).or_else(|e| {
        tracing::warn!("rate probe: cannot write its file in {} ({e}); probing anonymous memory instead", std::env::temp_dir().display());
        anon_copies(expert, copies)
    })
}

fn file_copies(expert: &[Vec<u8>; 3], copies: usize) -> std::io::Result<memmap2::Mmap> {
    use std::io::Write;
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("ft-actor-rate-probe-{}-{n}.bin", std::process::id()));
    let result = (|| {
        // Read as well as write: a mapping needs a readable descriptor.
        let file = std::fs::OpenOptions::new().read(true).write(true).create_new(true).open(&path)?;
        let mut f = std::io::BufWriter::with_capacity(8 << 20, file);
        for _ in 0..copies {
            for m in expert {
                f.write_all(m)?;
            }
        }
        let f = f.into_inner().map_err(|e| e.into_error())?;
        // SAFETY: the file is this process's own, unlinked below and never written again.
        unsafe { memmap2::Mmap::map(&f) }
    })();
    let _ = std::fs::remove_file(&path);
    result
}

fn anon_copies(expert: &[Vec<u8>; 3], copies: usize) -> std::io::Result<memmap2::Mmap> {
    let one: usize = expert.iter().map(Vec::len).sum();
    let mut map = memmap2::MmapMut::map_anon((one * copies).max(1))?;
    for copy in map.chunks_exact_mut(one.max(1)).take(copies) {
        let mut at = 0;
        for m in expert {
            copy[at..at + m.len()].copy_from_slice(m);
            at += m.len();
        }
    }
    map.make_read_only()
}

/// Streams `dtype` experts of `shape` for at least `min_time` (and at least 3 passes after one
/// untimed pass that faults the pages in); the median pass is the rate.
pub fn cpu_stream_rate(pool: &ThreadPool, dot: QuantDot, dtype: DType, shape: ExpertShape, min_time: Duration) -> Result<StreamRate, BackendError> {
    let block = dtype.block_elems().max(1);
    let round = |n: usize| n.div_ceil(block).max(1) * block;
    let (h, i) = (round(shape.hidden.max(1)), round(shape.intermediate.max(1)));
    // gate and up [I, H], down [H, I].
    let one = [matrix(dtype, i, h), matrix(dtype, i, h), matrix(dtype, h, i)];
    let expert_bytes: usize = one.iter().map(Vec::len).sum();
    let copies = (PROBE_BYTES as usize).div_ceil(expert_bytes).max(2 * shape.parallel.max(1));
    // Distinct copies, so no pass finds an expert in cache from the one before, in a mapped
    // file as the engine's experts are (page-cache pages, not heap memory).
    let map = mapped_copies(&one, copies).map_err(|e| BackendError::Device(format!("probe file: {e}")))?;
    let experts: Vec<[&[u8]; 3]> = (0..copies)
        .map(|c| {
            let base = c * expert_bytes;
            let (g, u) = (one[0].len(), one[1].len());
            [&map[base..base + g], &map[base + g..base + g + u], &map[base + g + u..base + expert_bytes]]
        })
        .collect();
    let level = SimdLevel::Auto.effective();
    let (xh, xi) = (vec![0.01f32; h], vec![0.01f32; i]);
    // As the CPU executors run a layer's one-token experts: flat (on one worker that is the
    // same order as theirs, each product whole, one after another).
    fn item<'a>(x: &'a [f32], k: usize, w: &'a [u8], dtype: DType, m: usize, out: &'a mut [f32]) -> ManyItem<'a> {
        ManyItem { x, n: 1, k, w, dtype, m, out }
    }
    let run_group = |group: &[[&[u8]; 3]]| -> Result<(), BackendError> {
        let (mut g, mut u, mut d) = (vec![vec![0f32; i]; group.len()], vec![vec![0f32; i]; group.len()], vec![vec![0f32; h]; group.len()]);
        let mut items = Vec::with_capacity(2 * group.len());
        for ((e, g), u) in group.iter().zip(&mut g).zip(&mut u) {
            items.push(item(&xh, h, e[0], dtype, i, g));
            items.push(item(&xh, h, e[1], dtype, i, u));
        }
        kernels::matmul_many(pool, level, dot, &mut items)?;
        let mut items: Vec<ManyItem<'_>> = group.iter().zip(&mut d).map(|(e, d)| item(&xi, i, e[2], dtype, h, d)).collect();
        kernels::matmul_many(pool, level, dot, &mut items)
    };
    let pass = || -> Result<f64, BackendError> {
        let t = Instant::now();
        pool.install(|| experts.chunks(shape.parallel.max(1)).try_for_each(run_group))?;
        Ok(t.elapsed().as_secs_f64())
    };
    pass()?;
    let started = Instant::now();
    let mut secs = Vec::new();
    while secs.len() < 3 || started.elapsed() < min_time {
        secs.push(pass()?);
    }
    secs.sort_by(f64::total_cmp);
    let bytes = (expert_bytes * copies) as u64;
    let rate = |s: f64| bytes as f64 / s.max(1e-9);
    Ok(StreamRate {
        dtype,
        bytes_per_s: rate(secs[secs.len() / 2]),
        min_bytes_per_s: rate(secs[secs.len() - 1]),
        max_bytes_per_s: rate(secs[0]),
        bytes,
        passes: secs.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anonymous_copies_hold_the_same_bytes_as_the_file() {
        let expert = [vec![1u8, 2, 3], vec![4, 5], vec![6, 7, 8, 9]];
        let (file, anon) = (file_copies(&expert, 3).unwrap(), anon_copies(&expert, 3).unwrap());
        assert_eq!(&file[..], &anon[..]);
        assert_eq!(&anon[..9], &[1, 2, 3, 4, 5, 6, 7, 8, 9]);
        assert_eq!(anon.len(), 27);
    }
}
