//! Hand-written x86-64 kernels (AVX-512 and AVX2), reached only through the safe dispatchers
//! of the parent module after run-time feature detection.
//!
//! Weights are raw little-endian bytes that may sit at any address (zero-copy imports of
//! memory-mapped checkpoints), so every weight load here is an unaligned load.

/// Defines the entry `$entry(j, n, nrows)` of a decode kernel over its row driver
/// `$rows::<R, N>(j, r0)` (R rows × N tokens per pass): one token interleaves `$r1` rows;
/// 2..=4 tokens take one row at a time, their partial sums being the parallelism.
macro_rules! entry {
    ($vis:vis $entry:ident, $rows:ident, $r1:expr) => {
        $vis unsafe fn $entry(j: &Job, n: usize, nrows: usize) {
            let step = if n == 1 { $r1 } else { 1 };
            let mut r = 0;
            while r + step <= nrows {
                match n {
                    1 => $rows::<{ $r1 }, 1>(j, r),
                    2 => $rows::<1, 2>(j, r),
                    3 => $rows::<1, 3>(j, r),
                    _ => $rows::<1, 4>(j, r),
                }
                r += step;
            }
            while r < nrows {
                match n {
                    1 => $rows::<1, 1>(j, r),
                    2 => $rows::<1, 2>(j, r),
                    3 => $rows::<1, 3>(j, r),
                    _ => $rows::<1, 4>(j, r),
                }
                r += 1;
            }
        }
    };
}

/// Software prefetch of a weight line a kernel reads soon, into L2 (`prefetcht1`) rather
/// than L1: on a core whose own read rate is capped by the misses it keeps in flight (8.5 of
/// 17 GB/s here), prefetches into L1 held its fill buffers and slowed the stream. Decode on 2
/// threads of a 12-layer Qwen3-30B-A3B shape, one build with either hint, alternating runs:
/// Q4_K_M 17.1–19.6 → 20.3–21.1 tok/s, Q8_0 13.1–13.5 → 14.4–14.8, bf16 8.2–8.3 → 8.8–8.9
/// (without software prefetch, Q4_K_M ran at 14.5).
#[inline(always)]
pub(crate) unsafe fn prefetch(p: *const u8) {
    std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(p as *const i8);
}

/// Software prefetch of a line that the next few steps of a kernel read, into L1
/// (`prefetcht0`), where [`prefetch`] already brought it to L2: attention's loads of cached
/// keys and values (rows a whole cache row apart) otherwise met every line as an L1 miss.
#[inline(always)]
pub(crate) unsafe fn prefetch_l1(p: *const u8) {
    std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p as *const i8);
}

/// Cache rows ahead of the one being read that attention's kernels ask for into L2, as they
/// read each row: one block of keys ([`flash::KEYS`]), so the next block's rows of the head
/// arrive while this one is summed. The rows lie a whole cache row apart (all KV heads', 1
/// KiB for 4 heads of 128 f16), and the hardware prefetchers left every row a miss: 77 % of
/// the AVX-512 value kernel's samples waited on that load. Asked for a few lines a row, not
/// the whole next block at its start: that burst of 512 prefetches stalled the loads behind
/// it, a tenth of the position split's time. With the kernels' L1 prefetches ([`prefetch_l1`]),
/// decode attention on one thread (kernel bench part 5, both builds at once on the two
/// cores, 10 rounds): over 4,096 cached f16 tokens 1.84 → 1.62 ms a call at the median (8
/// rounds faster). The flash blocks' value kernel (`flash::pv`) does not take them: over 512
/// cached tokens it gained 0.237 → 0.210, but the engine's Q4_K_M 512-token prefill, which
/// runs the same kernel over its f32 copy, ran lower in every alternating set while it did.
const ROWS_AHEAD: usize = flash::KEYS;

/// Prefetches the `slice` bytes of row `j + ROWS_AHEAD` of rows `stride` bytes apart from
/// `base`, into L2. The row may lie past what the caller reads (the next block's rows of a
/// contiguous cache; elsewhere the hint costs a wasted line): a prefetch never faults, and
/// the address is only formed, never dereferenced.
#[inline(always)]
pub(crate) unsafe fn prefetch_row_ahead(base: *const u8, stride: usize, j: usize, slice: usize) {
    let row = base.wrapping_add((j + ROWS_AHEAD) * stride);
    for line in (0..slice).step_by(64) {
        prefetch(row.wrapping_add(line));
    }
}

/// The line at byte `off` of row `j + ROWS_AHEAD` ([`prefetch_row_ahead`]'s row) into L2, for
/// kernels that read a row's lines in separate passes and ask for each as its pass begins.
#[inline(always)]
pub(crate) unsafe fn prefetch_line_ahead(base: *const u8, stride: usize, j: usize, off: usize) {
    prefetch(base.wrapping_add((j + ROWS_AHEAD) * stride + off));
}

pub(crate) mod avx2;
pub(crate) mod amx;
pub(crate) mod amx_attention;
pub(crate) mod avx512;
pub(crate) mod dpbf16;
pub(crate) mod flash;
pub(crate) mod fp8_bf16;
pub(crate) mod fp8_tiles;
pub(crate) mod panel;
pub(crate) mod quant;
pub(crate) mod qdot;
pub(crate) mod qdot_i8;

use ft_backend::DType;

/// Weight element codes used as const generic parameters, so that each (dtype, tile shape)
/// pair compiles to its own straight-line loop with no per-element branch.
pub(crate) const F32: u8 = 0;
/// IEEE half precision.
pub(crate) const F16: u8 = 1;
/// bfloat16.
pub(crate) const BF16: u8 = 2;

/// The const-generic code of a plain `dtype`.
pub(crate) fn code(dtype: DType) -> u8 {
    match dtype {
        DType::F32 => F32,
        DType::F16 => F16,
        DType::BF16 => BF16,
        // Callers route the block-quantized types to `kernels::quant` before asking (they
        // have no per-element code); F32 here would only be reached by a routing bug.
        _ => F32,
    }
}

/// Bytes per element of a weight code.
pub(crate) const fn esize(d: u8) -> usize {
    if d == F32 {
        4
    } else {
        2
    }
}

/// One tile of dot products: `out[t*os + r] (+)= Σ_p x[t*xs + p] · w[r*wsb/esize + p]`
/// for `t < nt`, `r < nr`, `p < k`. Activations are f32, or bf16 bits (`u16`) for the
/// `vdpbf16ps` tiles.
#[derive(Clone, Copy)]
pub(crate) struct Tile<X = f32> {
    /// First activation row.
    pub x: *const X,
    /// Elements between activation rows.
    pub xs: usize,
    /// First weight row (any alignment).
    pub w: *const u8,
    /// Bytes between weight rows.
    pub wsb: usize,
    /// Dot product length.
    pub k: usize,
    /// Where the `nt × nr` results go.
    pub out: *mut f32,
    /// Elements between output rows.
    pub os: usize,
    /// Add to `out` instead of overwriting it (k-blocked passes).
    pub accumulate: bool,
    /// Software-prefetch the weight rows ahead (rows streamed from memory, not from scratch).
    pub prefetch: bool,
}

/// Attention's value pass: `out[g*os + c] = Σ_j p[g*ps + j] · v_row(j)[c]` for `g` heads,
/// `c < vhd`, `j < len`.
#[derive(Clone, Copy)]
pub(crate) struct Pv {
    /// Softmax weights, one row of `len` per head.
    pub p: *const f32,
    /// Elements between heads in `p`.
    pub ps: usize,
    /// First value row (any alignment).
    pub v: *const u8,
    /// Bytes between value rows.
    pub vsb: usize,
    /// Number of value rows.
    pub len: usize,
    /// Values per row.
    pub vhd: usize,
    /// Output, one row of `vhd` per head (overwritten, or added to with `accumulate`).
    pub out: *mut f32,
    /// Elements between heads in `out`.
    pub os: usize,
    /// Start each sum from what `out` holds (a pass continuing an earlier one) instead of 0.
    pub accumulate: bool,
}

/// Element `i` of a weight row as f32, read unaligned (tails of the AVX2 loops).
///
/// # Safety
/// `p` must be valid for reading element `i` of code `D`.
#[inline(always)]
pub(crate) unsafe fn scalar_at<const D: u8>(p: *const u8, i: usize) -> f32 {
    match D {
        F32 => (p.add(i * 4) as *const f32).read_unaligned(),
        F16 => half::f16::from_bits((p.add(i * 2) as *const u16).read_unaligned()).to_f32(),
        _ => f32::from_bits(((p.add(i * 2) as *const u16).read_unaligned() as u32) << 16),
    }
}

/// Stores one tile result.
///
/// # Safety
/// `o` must be valid for reads and writes.
#[inline(always)]
pub(crate) unsafe fn store(o: *mut f32, v: f32, accumulate: bool) {
    *o = if accumulate { *o + v } else { v };
}

/// Cephes-style `expf` constants shared by both vector widths: inputs are clamped to
/// `±EXP_HI` (beyond which f32 over/underflows), reduced by `n = round(x·log2 e)` and a
/// degree-5 polynomial on the remainder; relative error is about 2 ulp.
pub(crate) mod expc {
    pub const HI: f32 = 88.376_26;
    pub const LO: f32 = -88.376_26;
    pub const LOG2E: f32 = std::f32::consts::LOG2_E;
    pub const C1: f32 = 0.693_359_4;
    pub const C2: f32 = -2.121_944_4e-4;
    pub const P: [f32; 6] = [
        1.987_569_1e-4,
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        1.666_666_5e-1,
        0.5,
    ];
}
