//! Streaming safetensors writer: random tensor data is generated in parallel, fixed-size
//! chunks and written in order, so memory stays bounded whatever the shard size.

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::mpsc::{channel, sync_channel};

use half::{bf16, f16};
use rayon::prelude::*;
use serde_json::{json, Map, Value};

use super::shapes::{Init, TensorPlan};
use super::{SynthDtype, SynthError};
use crate::sampling::{splitmix64, Rng};

/// Bytes of tensor data generated per work item: large enough to amortise scheduling,
/// small enough that a window of them per thread stays within a few hundred MiB.
const CHUNK_BYTES: usize = 2 << 20;

/// Entries in a value table; random 16-bit indices pick from it.
const TABLE_LEN: usize = 1 << 16;

/// Pre-encoded samples of one value distribution in one dtype.
///
/// Drawing an element is then a 16-bit index into the table (four per 64-bit random
/// draw) instead of computing a normal deviate and converting it, which is what makes
/// generation outrun the disk. 65536 distinct values per distribution is plenty for
/// synthetic weights.
struct Table {
    init: Init,
    dtype: SynthDtype,
    /// `TABLE_LEN` little-endian encoded elements.
    bytes: Vec<u8>,
}

impl Table {
    fn new(init: Init, dtype: SynthDtype, seed: u64) -> Self {
        let mut rng = Rng::new(seed ^ 0x7AB1_E5EE_D000_0000);
        let mut z = Vec::with_capacity(TABLE_LEN);
        while z.len() < TABLE_LEN {
            // Box-Muller: two independent standard normal deviates per pair of uniforms.
            let u1 = 1.0 - rng.next_f64(); // (0, 1]: ln stays finite
            let u2 = rng.next_f64();
            let r = (-2.0 * u1.ln()).sqrt();
            let a = std::f64::consts::TAU * u2;
            z.push(r * a.cos());
            z.push(r * a.sin());
        }
        // Standardise the sample so every tensor gets exactly the requested mean and std.
        let n = z.len() as f64;
        let m = z.iter().sum::<f64>() / n;
        let sd = (z.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / n)
            .sqrt()
            .max(1e-12);
        let mut bytes = Vec::with_capacity(TABLE_LEN * dtype.size());
        if dtype == SynthDtype::I64 {
            // Integers uniform in `[mean, mean + std)`: expert ids of a hash table.
            for _ in 0..TABLE_LEN {
                let v = init.mean as i64 + (rng.next_f64() * init.std as f64) as i64;
                bytes.extend_from_slice(&v.to_le_bytes());
            }
            return Self { init, dtype, bytes };
        }
        for x in z {
            let v = (init.mean as f64 + init.std as f64 * (x - m) / sd) as f32;
            match dtype {
                SynthDtype::F32 => bytes.extend_from_slice(&v.to_le_bytes()),
                SynthDtype::Bf16 => bytes.extend_from_slice(&bf16::from_f32(v).to_le_bytes()),
                SynthDtype::F16 => bytes.extend_from_slice(&f16::from_f32(v).to_le_bytes()),
                SynthDtype::I64 => unreachable!("integer tables are filled above"),
            }
        }
        Self { init, dtype, bytes }
    }
}

/// Safetensors' dtype tag.
fn dtype_tag(d: SynthDtype) -> &'static str {
    match d {
        SynthDtype::F32 => "F32",
        SynthDtype::Bf16 => "BF16",
        SynthDtype::F16 => "F16",
        SynthDtype::I64 => "I64",
    }
}

/// Stable 64-bit hash of a tensor name (FNV-1a), so a tensor's values depend only on the
/// seed and its name: a 2-layer and a 12-layer synth share their layer-0 weights.
fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// One unit of parallel work: a contiguous element range of one tensor.
struct Job<'a> {
    tensor: &'a TensorPlan,
    table: &'a Table,
    chunk: u64,
    elems: usize,
}

/// Fills `buf` with the job's `elems` encoded values.
fn generate(job: &Job, seed: u64, buf: &mut Vec<u8>) {
    let mut state = seed ^ name_hash(&job.tensor.name);
    let base = splitmix64(&mut state);
    let mut rng = Rng::new(base ^ job.chunk.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let size = job.table.dtype.size();
    let len = job.elems * size;
    if buf.len() != len {
        buf.resize(len, 0);
    }
    match size {
        8 => fill::<8>(buf, &job.table.bytes, &mut rng),
        4 => fill::<4>(buf, &job.table.bytes, &mut rng),
        _ => fill::<2>(buf, &job.table.bytes, &mut rng),
    }
}

/// Copies table entries of `N` bytes picked by random 16-bit indices, four per 64-bit
/// draw; `N` is a constant so each copy compiles to a single load/store.
fn fill<const N: usize>(buf: &mut [u8], table: &[u8], rng: &mut Rng) {
    let mut groups = buf.chunks_exact_mut(4 * N);
    for group in &mut groups {
        let r = rng.next_u64();
        for (k, dst) in group.chunks_exact_mut(N).enumerate() {
            let at = ((r >> (16 * k)) & 0xFFFF) as usize * N;
            dst.copy_from_slice(&table[at..at + N]);
        }
    }
    let mut r = rng.next_u64();
    for dst in groups.into_remainder().chunks_exact_mut(N) {
        let at = (r & 0xFFFF) as usize * N;
        dst.copy_from_slice(&table[at..at + N]);
        r >>= 16;
    }
}

/// Serialises the safetensors header for `tensors` in the given order, padded with
/// spaces so the data section starts 8-byte aligned (as the format recommends, and so
/// memory-mapped f32 data can be viewed in place).
fn header(tensors: &[&TensorPlan]) -> Result<Vec<u8>, SynthError> {
    let mut map = Map::new();
    // transformers refuses safetensors files without a known `format`.
    map.insert("__metadata__".into(), json!({ "format": "pt" }));
    let mut offset = 0u64;
    for t in tensors {
        let end = offset + t.nbytes();
        map.insert(
            t.name.clone(),
            json!({ "dtype": dtype_tag(t.dtype), "shape": t.shape, "data_offsets": [offset, end] }),
        );
        offset = end;
    }
    let mut text = serde_json::to_vec(&Value::Object(map))
        .map_err(|e| SynthError::Internal(format!("cannot serialise header: {e}")))?;
    while (8 + text.len()) % 8 != 0 {
        text.push(b' ');
    }
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&text);
    Ok(out)
}

/// Writes one shard at `path`; `progress` receives the bytes of tensor data written.
///
/// Tensors are laid out with 4-byte dtypes first so every tensor starts aligned to its
/// element size even when f32 and 2-byte tensors share a file.
pub(super) fn write_shard(
    path: &Path,
    tensors: &[&TensorPlan],
    seed: u64,
    progress: &mut dyn FnMut(u64),
) -> Result<(), SynthError> {
    let mut ordered: Vec<&TensorPlan> = tensors.to_vec();
    ordered.sort_by_key(|t| std::cmp::Reverse(t.dtype.size()));
    let io_err = |source| SynthError::Io {
        path: path.to_path_buf(),
        source,
    };

    let mut tables: Vec<Table> = Vec::new();
    let mut table_of = Vec::with_capacity(ordered.len());
    for t in &ordered {
        let found = tables
            .iter()
            .position(|x| x.init == t.init && x.dtype == t.dtype);
        table_of.push(found.unwrap_or_else(|| {
            tables.push(Table::new(t.init, t.dtype, seed));
            tables.len() - 1
        }));
    }
    let mut jobs = Vec::new();
    for (t, &table) in ordered.iter().zip(&table_of) {
        let table = &tables[table];
        let per_chunk = (CHUNK_BYTES / t.dtype.size()) as u64;
        let n = t.numel();
        let mut start = 0u64;
        let mut chunk = 0u64;
        while start < n {
            let elems = per_chunk.min(n - start) as usize;
            jobs.push(Job {
                tensor: t,
                table,
                chunk,
                elems,
            });
            start += elems as u64;
            chunk += 1;
        }
    }

    let mut file = File::create(path).map_err(io_err)?;
    file.write_all(&header(&ordered)?).map_err(io_err)?;

    let window = (rayon::current_num_threads() * 2).max(4);
    let result = std::thread::scope(|scope| -> Result<(), SynthError> {
        let (full_tx, full_rx) = sync_channel::<Vec<u8>>(window);
        let (free_tx, free_rx) = channel::<Vec<u8>>();
        let jobs = &jobs;
        let producer = scope.spawn(move || {
            for batch in jobs.chunks(window) {
                // Recycled buffers avoid re-faulting fresh pages for every chunk.
                let mut bufs: Vec<Vec<u8>> = batch
                    .iter()
                    .map(|_| free_rx.try_recv().unwrap_or_default())
                    .collect();
                bufs.par_iter_mut()
                    .zip(batch.par_iter())
                    .for_each(|(buf, job)| generate(job, seed, buf));
                for buf in bufs {
                    if full_tx.send(buf).is_err() {
                        // The writer stopped on an error; it reports it.
                        return;
                    }
                }
            }
        });
        for buf in full_rx.iter() {
            file.write_all(&buf).map_err(io_err)?;
            progress(buf.len() as u64);
            let _ = free_tx.send(buf);
        }
        producer
            .join()
            .map_err(|_| SynthError::Internal("tensor generator thread panicked".into()))
    });
    if let Err(e) = result {
        drop(file);
        // A truncated shard would look like a corrupt download later; remove it.
        let _ = std::fs::remove_file(path);
        return Err(e);
    }
    file.flush().map_err(io_err)?;
    Ok(())
}
