//! The CPU matmul kernels alone, per weight dtype and shape (`cargo bench`, no harness):
//!
//! ```text
//! FT_BENCH_THREADS=2 cargo bench -p ft-backend-cpu --bench kernels
//! ```
//!
//! 1. One-token matmuls through the backend in both `QuantDot` modes: GB/s of weight bytes
//!    (counted from the packed sizes) as a fraction of a read-bandwidth probe run in the
//!    same process.
//! 2. One long matrix per dtype (k=2048, ≥ 256 MiB, one product of 2 threads' row ranges, three
//!    copies in turn so each is cold): the rate of a long sequential stream per thread, as the
//!    output head of a model reads, free of the per-product start-up of small experts; then
//!    ≥ 256 MiB of cold experts, each whole on one worker: the rate of many short streams.
//! 3. One thread, a cache-warm matrix, 1, 2, 4, 5, 16, 32 and 64 tokens: GFLOP/s (2·n·k·m per timed call)
//!    and GB/s, the kernels' compute rate free of pool and memory effects.
//! 4. Prefill attention alone: the last 512 tokens of a 4,096-token prompt (the default step
//!    budget's chunk) against the f16 cache, 32 query heads over 4 KV heads of 128, on one
//!    thread and on all: GFLOP/s counting `2·(head_dim + v_head_dim)` per (query head, key
//!    seen), median of 5 calls; the path taken (AMX tiles, else the AVX2 flash blocks;
//!    `FT_NO_AMX=1` leaves the tiles out).
//! 5. Decode attention alone: one new token over the same cache and over a 512-token one
//!    (both split by positions, as decode steps over 256 cached tokens or more are; shorter
//!    ones take the flash blocks), median of 101 calls taking turns over copies of the
//!    cache that add up to 64 MiB (so each comes from memory, as a layer's cache does in a
//!    decode step), also as GB/s of the cache's bytes.
//!
//! `FT_BENCH_THREADS` sets the worker count (default: the backend's); `FT_BENCH_DTYPES`
//! (comma-separated names such as `q8_0,q4_k`) limits the rows; `FT_BENCH_PARTS` (comma-separated
//! part numbers, e.g. `4`) the parts; `FT_BENCH_SIMD=avx2` runs part 3 on the AVX2 kernels (with
//! AVX-VNNI where the CPU has it), as a CPU without AVX-512 would. Shapes are those of a
//! Qwen3-30B-A3B expert (hidden 2048, expert width 768): gate/up `k=2048 × 768 rows`, down
//! `k=768 × 2048 rows`, each timed alone (cache-warm), then 8 experts' gate/up/down in turn
//! and a cold set of as many experts as make ≥ 192 MiB (far beyond L3), so weights stream
//! from memory.

use ft_backend::{AttentionDesc, Backend, BufferUsage, DType, DeviceBuffer, MatmulDesc, StreamId};
use ft_backend_cpu::kernels::Loads;
use ft_backend_cpu::{CpuBackend, CpuOptions, QuantDot};
use std::time::Instant;

/// Read bandwidth (bytes/s) summing a 1 GiB buffer with `threads` threads, with the widest
/// loads the CPU has (`kernels::stream_sum`): the median of 7 passes in each load pattern,
/// alternating, and the highest of them (as `ft-actor bench` probes).
fn read_bandwidth(threads: usize) -> f64 {
    let words = (1usize << 30) / 8;
    let buf: Vec<u64> = (0..words as u64).collect();
    let chunk = words.div_ceil(threads);
    let mut runs = Loads::ALL.map(|_| vec![]);
    for _ in 0..7 {
        for (i, loads) in Loads::ALL.into_iter().enumerate() {
            let t = Instant::now();
            let total: u64 = std::thread::scope(|s| {
                let hs: Vec<_> = buf
                    .chunks(chunk)
                    .map(|c| s.spawn(move || ft_backend_cpu::kernels::stream_sum(ft_backend_cpu::SimdLevel::Auto, loads, c)))
                    .collect();
                hs.into_iter().map(|h| h.join().expect("join")).fold(0u64, |a, b| a.wrapping_add(b))
            });
            std::hint::black_box(total);
            runs[i].push((words * 8) as f64 / t.elapsed().as_secs_f64());
        }
    }
    runs.iter_mut()
        .map(|r| {
            r.sort_by(|a, b| a.total_cmp(b));
            r[r.len() / 2]
        })
        .fold(0.0, f64::max)
}

fn upload(b: &CpuBackend, dtype: DType, elems: usize, bytes: &[u8]) -> DeviceBuffer {
    let mut w = b.alloc(dtype, elems, BufferUsage::Weights).expect("alloc");
    b.upload(StreamId::COMPUTE, bytes, &mut w, 0)
        .expect("upload");
    w
}

/// Median seconds of `f` over `reps` runs after `warm` warm-up runs.
fn time(warm: usize, reps: usize, mut f: impl FnMut()) -> f64 {
    for _ in 0..warm {
        f();
    }
    let mut v: Vec<f64> = (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .collect();
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let parts = std::env::var("FT_BENCH_PARTS").ok();
    let part = |n: &str| parts.as_deref().is_none_or(|v| v.split(',').any(|p| p.trim() == n));
    if part("1") {
        quant_gemv_throughput();
    }
    if part("2") {
        long_stream();
    }
    if part("3") {
        quant_kernel_rate_single_thread();
    }
    if part("4") {
        attention(512, 4096, 5);
    }
    if part("5") {
        attention(1, 4096, 101);
        attention(1, 512, 101);
    }
}

/// Parts 4 and 5 of the module docs: `tokens` new tokens over `kv_len` cached ones, the
/// median of `reps` calls.
fn attention(tokens: usize, kv_len: usize, reps: usize) {
    let (heads, kv_heads, hd) = (32, 4, 128);
    let desc = AttentionDesc { n_tokens: tokens, n_heads: heads, n_kv_heads: kv_heads, head_dim: hd, v_head_dim: hd, kv_len, scale: 1.0 / (hd as f32).sqrt(), window: None };
    let mut rng = ft_backend::conformance::Rng::new(4);
    let f16s = |x: Vec<f32>| -> Vec<u8> { x.iter().flat_map(|&v| half::f16::from_f32(v).to_le_bytes()).collect() };
    let kb = f16s(rng.vec(kv_len * kv_heads * hd, 1.0));
    let vb = f16s(rng.vec(kv_len * kv_heads * hd, 1.0));
    let qb: Vec<u8> = rng.vec(tokens * heads * hd, 2.0).iter().flat_map(|v| v.to_le_bytes()).collect();
    let seen: usize = (0..tokens).map(|t| kv_len - tokens + t + 1).sum();
    let flops = (2 * (hd + hd) * heads * seen) as f64;
    let all = std::env::var("FT_BENCH_THREADS").ok().and_then(|v| v.parse().ok()).unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let path = ft_backend_cpu::kernels::attention::path(ft_backend_cpu::SimdLevel::Auto, DType::F16, DType::F16, &desc);
    let what = if tokens == 1 { "decode" } else { "prefill" };
    // A decode step meets each layer's cache once, after every other layer's cache and
    // weights went through: the calls take turns over copies of at least twice the L3 so each
    // comes from memory (one copy, read again from L3 by every call, ran up to ~1.4x faster).
    let copies = if tokens == 1 { (64usize << 20).div_ceil(kb.len() + vb.len()) } else { 1 };
    println!("{what} attention, {tokens} new token(s) over a {kv_len}-token f16 cache ({copies} in turn), {heads} heads / {kv_heads} KV heads × {hd}: {path}");
    for threads in [1, all] {
        let b = CpuBackend::new(CpuOptions { threads: Some(threads), ..Default::default() }).expect("backend");
        let caches: Vec<_> = (0..copies).map(|_| (upload(&b, DType::F16, kv_len * kv_heads * hd, &kb), upload(&b, DType::F16, kv_len * kv_heads * hd, &vb))).collect();
        let q = upload(&b, DType::F32, tokens * heads * hd, &qb);
        let mut out = b.alloc(DType::F32, tokens * heads * hd, BufferUsage::Scratch).expect("alloc");
        let mut call = 0;
        let s = time(reps.min(5), reps, || {
            let (k, v) = &caches[call % copies];
            call += 1;
            b.attention(&q, k, v, None, &mut out, &desc).expect("attention")
        });
        // A decode step reads the cache's bytes (keys and values) once.
        let gbs = if tokens == 1 { format!(", {:.1} GB/s of cache", (kb.len() + vb.len()) as f64 / s / 1e9) } else { String::new() };
        println!("  {threads} thread(s): {:.3} ms a call, {:.1} GFLOP/s{gbs}", s * 1e3, flops / s / 1e9);
    }
}

/// The plain dtypes and every block-quantized one, as far as `FT_BENCH_DTYPES`
/// (comma-separated names; unset = all) asks for them.
fn dtypes() -> impl Iterator<Item = DType> {
    let wanted = std::env::var("FT_BENCH_DTYPES").ok();
    [DType::F32, DType::F16, DType::BF16]
        .into_iter()
        .chain(DType::QUANTIZED)
        .filter(move |d| wanted.as_deref().is_none_or(|v| v.split(',').any(|n| n.trim() == d.name())))
}

/// Part 1 of the module docs.
fn quant_gemv_throughput() {
    let threads = std::env::var("FT_BENCH_THREADS")
        .ok()
        .and_then(|v| v.parse().ok());
    for quant_dot in [QuantDot::Exact, QuantDot::Int8] {
        let b = CpuBackend::new(CpuOptions {
            threads,
            quant_dot,
            ..Default::default()
        })
        .expect("backend");
        throughput(&b, threads, quant_dot);
    }
}

/// The table of [`quant_gemv_throughput`] for one backend.
fn throughput(b: &CpuBackend, threads: Option<usize>, quant_dot: QuantDot) {
    let nthreads =
        threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let bw = read_bandwidth(nthreads);
    println!(
        "quant_dot {quant_dot}: memory read bandwidth ({nthreads} threads, 1 GiB sum, median of 7, fastest load pattern): {:.1} GB/s; simd {:?}",
        bw / 1e9,
        b.simd_level()
    );
    let (hidden, width) = (2048, 768);
    let mut rng = ft_backend::conformance::Rng::new(1);
    let vals = rng.vec(hidden * width, 1.0);
    let xs: Vec<DeviceBuffer> = [hidden, width]
        .iter()
        .map(|&k| {
            let x = rng.vec(k, 1.0);
            let xb: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
            upload(&b, DType::F32, k, &xb)
        })
        .collect();
    let mut out = b
        .alloc(DType::F32, hidden, BufferUsage::Scratch)
        .expect("alloc");
    println!(
        "{:>6} | {:>22} | {:>22} | {:>22} | {:>22}",
        "dtype", "k=2048 × 768 (warm)", "k=768 × 2048 (warm)", "8 experts", "cold (≥192 MiB)"
    );
    println!(
        "{:>6} | {:>22} | {:>22} | {:>22} | {:>22}",
        "", "µs  GB/s  %bw", "µs  GB/s  %bw", "µs/exp GB/s %bw", "µs/exp GB/s %bw"
    );
    for dtype in dtypes() {
        if quant_dot == QuantDot::Int8 && !dtype.is_quantized() && dtype != DType::BF16 {
            continue; // no reduced-precision kernel (bf16 has vdpbf16ps): the exact table's row
        }
        // gate/up: [768, 2048]; down: [2048, 768] (the same values, reshaped).
        let shapes = [(hidden, width), (hidden, width), (width, hidden)];
        let bytes: Vec<Vec<u8>> = shapes
            .iter()
            .map(|&(k, m)| ft_backend::quant::quantize_matrix(dtype, &vals, m, k))
            .collect();
        let expert_bytes: usize = bytes.iter().map(Vec::len).sum();
        let cold_experts = ((192usize << 20).div_ceil(expert_bytes)).max(8);
        let experts: Vec<Vec<DeviceBuffer>> = (0..cold_experts)
            .map(|_| {
                shapes
                    .iter()
                    .zip(&bytes)
                    .map(|(&(k, m), by)| upload(&b, dtype, m * dtype.padded(k), by))
                    .collect()
            })
            .collect();
        let mm = |w: &DeviceBuffer, k: usize, m: usize, out: &mut DeviceBuffer| {
            let x = &xs[usize::from(k != hidden)];
            b.matmul(x, w, None, out, &MatmulDesc::new(1, k, m))
                .expect("matmul");
        };
        let mut cells = Vec::new();
        for (i, &(k, m)) in [(hidden, width), (width, hidden)].iter().enumerate() {
            let w = &experts[0][2 * i];
            let per = time(20, 301, || {
                mm(w, k, m, &mut out);
                b.synchronize(StreamId::COMPUTE).expect("sync");
            });
            let gbs = bytes[2 * i].len() as f64 / per;
            cells.push(format!(
                "{:7.1} {:6.2} {:4.0}%",
                per * 1e6,
                gbs / 1e9,
                100.0 * gbs / bw
            ));
        }
        for count in [8, cold_experts] {
            let set = &experts[..count];
            let per = time(2, 15, || {
                for e in set {
                    for (w, &(k, m)) in e.iter().zip(&shapes) {
                        mm(w, k, m, &mut out);
                    }
                }
                b.synchronize(StreamId::COMPUTE).expect("sync");
            }) / count as f64;
            let gbs = expert_bytes as f64 / per;
            cells.push(format!(
                "{:7.1} {:6.2} {:4.0}%",
                per * 1e6,
                gbs / 1e9,
                100.0 * gbs / bw
            ));
        }
        println!(
            "{:>6} | {} | {} | {} | {}   ({} B/expert, cold = {cold_experts} experts)",
            dtype.name(),
            cells[0],
            cells[1],
            cells[2],
            cells[3],
            expert_bytes
        );
    }
}

/// Part 2 of the module docs: one token against a long matrix in `QuantDot::Int8` mode.
fn long_stream() {
    let threads = std::env::var("FT_BENCH_THREADS").ok().and_then(|v| v.parse().ok());
    let b = CpuBackend::new(CpuOptions { threads, quant_dot: QuantDot::Int8, ..Default::default() }).expect("backend");
    let nthreads = threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let bw = read_bandwidth(nthreads);
    println!("long matrix, 1 token, int8 mode: memory read bandwidth ({nthreads} threads, fastest load pattern) {:.1} GB/s", bw / 1e9);
    let k = 2048;
    let mut rng = ft_backend::conformance::Rng::new(3);
    let x = rng.vec(k, 1.0);
    let xb: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    let xd = upload(&b, DType::F32, k, &xb);
    for dtype in dtypes() {
        // 2048 distinct rows, repeated up to the length (quantizing the whole would take long).
        let tile = ft_backend::quant::quantize_matrix(dtype, &rng.vec(2048 * k, 1.0), 2048, k);
        let m = 2048 * (256usize << 20).div_ceil(tile.len());
        let bytes = tile.repeat(m / 2048);
        let copies: Vec<DeviceBuffer> = (0..3).map(|_| upload(&b, dtype, m * dtype.padded(k), &bytes)).collect();
        let mut out = b.alloc(DType::F32, m, BufferUsage::Scratch).expect("alloc");
        let mut i = 0;
        let per = time(3, 9, || {
            b.matmul(&xd, &copies[i % copies.len()], None, &mut out, &MatmulDesc::new(1, k, m)).expect("matmul");
            b.synchronize(StreamId::COMPUTE).expect("sync");
            i += 1;
        });
        let gbs = bytes.len() as f64 / per;
        println!(
            "{:>6} | {m} rows, {:.0} MiB: {:7.2} ms {:6.2} GB/s {:4.0}%",
            dtype.name(),
            bytes.len() as f64 / (1 << 20) as f64,
            per * 1e3,
            gbs / 1e9,
            100.0 * gbs / bw
        );
        side_by_side(dtype, nthreads, bw);
    }
}

/// Cold experts (gate/up `k=2048 × 768 rows`, down `k=768 × 2048`, ≥ 256 MiB in all), each
/// whole on one of `threads` workers as the engine's decode expert phase runs them: the rate
/// of many short streams started one after another, beside [`long_stream`]'s one long one.
fn side_by_side(dtype: DType, threads: usize, bw: f64) {
    use ft_backend_cpu::{kernels, SimdLevel};
    use rayon::prelude::*;
    let (hidden, width) = (2048, 768);
    let mut rng = ft_backend::conformance::Rng::new(4);
    let shapes = [(hidden, width), (hidden, width), (width, hidden)];
    let mats: Vec<Vec<u8>> =
        shapes.iter().map(|&(k, m)| ft_backend::quant::quantize_matrix(dtype, &rng.vec(m * k, 1.0), m, k)).collect();
    let expert_bytes: usize = mats.iter().map(Vec::len).sum();
    let count = (256usize << 20).div_ceil(expert_bytes);
    let experts: Vec<Vec<Vec<u8>>> = (0..count).map(|_| mats.clone()).collect();
    let x = rng.vec(hidden, 1.0);
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("pool");
    let per = time(2, 7, || {
        pool.install(|| {
            experts.par_iter().with_max_len(1).for_each(|e| {
                let mut g = vec![0f32; width];
                let mut y = vec![0f32; hidden];
                for (w, &(k, m)) in e.iter().zip(&shapes) {
                    let (xin, o) = if k == hidden { (&x[..], &mut g[..]) } else { (&x[..width], &mut y[..]) };
                    kernels::matmul(None, SimdLevel::Auto, QuantDot::Int8, xin, 1, k, w, dtype, m, o).expect("matmul");
                }
            })
        })
    });
    let gbs = (count * expert_bytes) as f64 / per;
    println!(
        "{:>6} | {count} experts side by side, {:.0} MiB: {:7.2} ms {:6.2} GB/s {:4.0}%",
        dtype.name(),
        (count * expert_bytes) as f64 / (1 << 20) as f64,
        per * 1e3,
        gbs / 1e9,
        100.0 * gbs / bw
    );
}

/// One thread, one cache-warm `k=2048 × 768` matrix, straight through
/// `kernels::matmul` on a one-thread pool, in both [`QuantDot`] modes: the kernels' compute
/// rate for 1, 2, 4, 5, 8, 12, 16, 32, 64, 128 and 512 tokens (decode sizes, an expert's
/// share of a prefill, and a whole prompt chunk), free of pool and memory effects. In the int8
/// mode, from 16 tokens (32 for the types with int8 kernels of their own for many tokens) the
/// bf16 path takes the AMX tiles where the CPU has them (`ft_backend_cpu::kernels::amx_tiles`,
/// printed above the table).
/// Part 3 of the module docs.
fn quant_kernel_rate_single_thread() {
    use ft_backend_cpu::{kernels, SimdLevel};
    let (k, m) = (2048, 768);
    let mut rng = ft_backend::conformance::Rng::new(2);
    let vals = rng.vec(m * k, 1.0);
    let x = rng.vec(512 * k, 1.0);
    let mut out = vec![0f32; 512 * m];
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().expect("pool");
    // `FT_BENCH_SIMD=avx2` runs the AVX2 kernels (AVX-VNNI where the CPU has it), as a CPU
    // without AVX-512 would.
    let level = match std::env::var("FT_BENCH_SIMD").as_deref() {
        Ok("avx2") => SimdLevel::Avx2,
        _ => SimdLevel::Auto,
    };
    println!(
        "1 thread, k={k} × {m} rows, warm, {level:?} kernels: GFLOP/s (GB/s of weights) per token count; AMX tiles: {}",
        if kernels::amx_tiles() { "yes" } else { "no" }
    );
    for dtype in dtypes() {
        let w = ft_backend::quant::quantize_matrix(dtype, &vals, m, k);
        let mut line = format!("{:>6}:", dtype.name());
        for dot in [QuantDot::Exact, QuantDot::Int8] {
            line += &format!("  {dot}");
            for n in [1, 2, 4, 5, 8, 12, 16, 32, 64, 128, 512] {
                let per = time(5, 51, || {
                    kernels::matmul(Some(&pool), level, dot, &x, n, k, &w, dtype, m, &mut out).expect("matmul");
                });
                line += &format!(
                    " n={n}: {:5.1} ({:5.2} GB/s)",
                    (2 * n * m * k) as f64 / per / 1e9,
                    w.len() as f64 / per / 1e9
                );
            }
        }
        println!("{line}");
    }
}
