//! The conformance suite: every op of a backend against [`crate::reference`], written once
//! against `&dyn Backend`.
//!
//! A backend crate runs it from a test file with
//! `ft_backend::conformance_suite!(make_backend_expr);`, which expands to one `#[test]` per
//! body below and per weight dtype. `make_backend_expr` evaluates to
//! `Option<Arc<dyn Backend>>` (`None`: no device here) or `Result<Arc<dyn Backend>, E:
//! Display>`; an absent device prints `skipped: <test>: <reason>` and passes, so GPU crates
//! can run the suite on machines without a GPU.
//!
//! Inputs come from a fixed-seed PRNG ([`Rng`]), so every run checks the same values. Sizes
//! include odd lengths (k = 1, 17, 33, 257, ...) that exercise SIMD tails, `n ∈ {1, 3, 9, ...}`
//! for GEMV and prefill paths, and larger ones (k = 4096, m = 64) that cross the
//! parallelisation thresholds. Bodies panic (test failure) on any mismatch.
//!
//! # Tolerances
//!
//! `err = |got − ref|`; narrow weights (bf16/f16) are decoded to f32 exactly before the
//! reference runs, so every dtype has the same bound.
//!
//! | op | bound on `err` |
//! |---|---|
//! | matmul | `1e-5 · max(1, √k) · (Σₚ |xₚ·wₚ| + |bias|)` (relative to the magnitude sum, so cancellation cannot make it fail spuriously) |
//! | rms_norm | `1e-5 · |ref| + 1e-6` |
//! | rope | `1e-5` absolute (values are O(1); angles must be computed accurately even at position 4095, e.g. in f64 or from host tables) |
//! | attention | `1e-5 + 1e-4 · |ref|` (outputs are convex combinations of values in [−1, 1]) |
//! | binary `Add`, `Mul`; scale | `2e-7 · |ref|` (one rounding) |
//! | binary `MulSigmoid`, `SwiGlu`, `ClampedSwiGlu`, `LimitedSwiGlu` | `1e-5 · |ref| + 1e-6` |
//! | softmax | `1e-5 · |ref| + 1e-6` |
//! | scatter_add_rows | `1e-6 · (|acc| + Σ |scale·x|)` (fused or separate multiply-add both pass) |
//! | causal_conv1d | `1e-5 · |ref| + 1e-6`; the carried state exactly |
//! | gated_delta_rule | `1e-4 · |ref| + 1e-5` for outputs and state (a recurrence over up to 33 steps; chunked forms must stay within it) |
//! | top_k, gather_rows, copy, upload, download, import | exact |
//! | matmul_same_x | exact: each part as the backend's own `matmul` computes it |
//! | scatter_add_rows_host | exact: the parts as the backend's own `scatter_add_rows` adds them one after another; a bad part changes nothing |
//!
//! Set `FT_CONFORMANCE_VERBOSE=1` (and run the tests with `--nocapture`) to print, for each
//! check, the worst ratio of error to bound.

mod cases;
mod host_rows;
mod memory;
mod paged;
mod recurrent;
mod same_x;

pub use cases::{
    attention, binary, gather_rows, matmul, matmul_quant, rms_norm, rope, scale, scatter_add_rows,
    softmax, top_k,
};
pub use host_rows::scatter_add_rows_host;
pub use memory::{copy_upload_download, errors, import_host, memory, store, streams_events};
pub use paged::attention_paged;
pub use recurrent::{causal_conv1d, gated_delta_rule};
pub use same_x::matmul_same_x;

use crate::dtype::{from_f32_slice, to_f32_vec};
use crate::{Backend, BufferUsage, DType, DeviceBuffer, Op, StreamId};
use std::fmt::Display;
use std::sync::Arc;

/// Matmul: relative bound per `√k`, applied to the magnitude sum `Σ|x·w| + |bias|`.
pub const MATMUL_RTOL: f32 = 1e-5;
/// RMSNorm relative bound (plus [`SMALL_ATOL`]).
pub const RMS_NORM_RTOL: f32 = 1e-5;
/// RoPE absolute bound.
pub const ROPE_ATOL: f32 = 1e-5;
/// Attention absolute bound (plus [`ATTENTION_RTOL`] relative).
pub const ATTENTION_ATOL: f32 = 1e-5;
/// Attention relative bound.
pub const ATTENTION_RTOL: f32 = 1e-4;
/// One rounding: `Add`, `Mul`, `scale`.
pub const ONE_ROUNDING_RTOL: f32 = 2e-7;
/// Ops built on `exp` (sigmoid ops, softmax): relative bound (plus [`SMALL_ATOL`]).
pub const EXP_RTOL: f32 = 1e-5;
/// Absolute slack for values near zero.
pub const SMALL_ATOL: f32 = 1e-6;
/// scatter_add_rows bound relative to `|acc| + Σ|scale·x|`.
pub const SCATTER_RTOL: f32 = 1e-6;
/// Gated delta rule relative bound (plus [`DELTA_RULE_ATOL`]).
pub const DELTA_RULE_RTOL: f32 = 1e-4;
/// Gated delta rule absolute bound.
pub const DELTA_RULE_ATOL: f32 = 1e-5;

/// What a conformance test gets from its backend constructor.
pub trait IntoTestBackend {
    /// The backend, or why the test cannot run here.
    fn into_test_backend(self) -> Result<Arc<dyn Backend>, String>;
}

impl IntoTestBackend for Option<Arc<dyn Backend>> {
    fn into_test_backend(self) -> Result<Arc<dyn Backend>, String> {
        self.ok_or_else(|| "no device for this backend on this machine".to_string())
    }
}

impl<E: Display> IntoTestBackend for Result<Arc<dyn Backend>, E> {
    fn into_test_backend(self) -> Result<Arc<dyn Backend>, String> {
        self.map_err(|e| e.to_string())
    }
}

/// The backend for test `test`, or `None` after printing `skipped: <test>: <reason>`.
pub fn backend_or_skip(make: impl IntoTestBackend, test: &str) -> Option<Arc<dyn Backend>> {
    match make.into_test_backend() {
        Ok(b) => Some(b),
        Err(reason) => {
            println!("skipped: {test}: {reason}");
            None
        }
    }
}

/// Expands to the whole conformance suite as `#[test]` functions.
///
/// `$make` is evaluated once per test and yields `Option<Arc<dyn Backend>>` (or a `Result`
/// whose error explains why the device is absent); see the [module docs](crate::conformance).
///
/// ```text
/// mod conformance {
///     ft_backend::conformance_suite!(Some(std::sync::Arc::new(MyBackend::new()) as std::sync::Arc<dyn ft_backend::Backend>));
/// }
/// ```
#[macro_export]
macro_rules! conformance_suite {
    ($make:expr) => {
        $crate::__conformance_test!(matmul_f32, $make, matmul, $crate::DType::F32);
        $crate::__conformance_test!(matmul_bf16, $make, matmul, $crate::DType::BF16);
        $crate::__conformance_test!(matmul_f16, $make, matmul, $crate::DType::F16);
        $crate::__conformance_test!(matmul_fp8, $make, matmul_quant, $crate::DType::F8E4M3);
        $crate::__conformance_test!(matmul_nvfp4, $make, matmul_quant, $crate::DType::Nvfp4);
        $crate::__conformance_test!(matmul_mxfp4, $make, matmul_quant, $crate::DType::Mxfp4);
        $crate::__conformance_test!(matmul_q8_0, $make, matmul_quant, $crate::DType::Q8_0);
        $crate::__conformance_test!(matmul_q4_0, $make, matmul_quant, $crate::DType::Q4_0);
        $crate::__conformance_test!(matmul_q4_k, $make, matmul_quant, $crate::DType::Q4K);
        $crate::__conformance_test!(matmul_q5_k, $make, matmul_quant, $crate::DType::Q5K);
        $crate::__conformance_test!(matmul_q6_k, $make, matmul_quant, $crate::DType::Q6K);
        $crate::__conformance_test!(matmul_same_x, $make, matmul_same_x);
        $crate::__conformance_test!(rms_norm_f32, $make, rms_norm, $crate::DType::F32);
        $crate::__conformance_test!(rms_norm_bf16, $make, rms_norm, $crate::DType::BF16);
        $crate::__conformance_test!(rms_norm_f16, $make, rms_norm, $crate::DType::F16);
        $crate::__conformance_test!(attention_f32, $make, attention, $crate::DType::F32);
        $crate::__conformance_test!(attention_bf16, $make, attention, $crate::DType::BF16);
        $crate::__conformance_test!(attention_f16, $make, attention, $crate::DType::F16);
        $crate::__conformance_test!(attention_paged_f32, $make, attention_paged, $crate::DType::F32);
        $crate::__conformance_test!(attention_paged_f16, $make, attention_paged, $crate::DType::F16);
        $crate::__conformance_test!(attention_q8_0, $make, attention, $crate::DType::Q8_0);
        $crate::__conformance_test!(attention_paged_q8_0, $make, attention_paged, $crate::DType::Q8_0);
        $crate::__conformance_test!(gather_rows_f32, $make, gather_rows, $crate::DType::F32);
        $crate::__conformance_test!(gather_rows_bf16, $make, gather_rows, $crate::DType::BF16);
        $crate::__conformance_test!(gather_rows_f16, $make, gather_rows, $crate::DType::F16);
        $crate::__conformance_test!(rope, $make, rope);
        $crate::__conformance_test!(binary, $make, binary);
        $crate::__conformance_test!(scale, $make, scale);
        $crate::__conformance_test!(softmax, $make, softmax);
        $crate::__conformance_test!(top_k, $make, top_k);
        $crate::__conformance_test!(scatter_add_rows, $make, scatter_add_rows);
        $crate::__conformance_test!(scatter_add_rows_host, $make, scatter_add_rows_host);
        $crate::__conformance_test!(causal_conv1d_f32, $make, causal_conv1d, $crate::DType::F32);
        $crate::__conformance_test!(causal_conv1d_bf16, $make, causal_conv1d, $crate::DType::BF16);
        $crate::__conformance_test!(causal_conv1d_f16, $make, causal_conv1d, $crate::DType::F16);
        $crate::__conformance_test!(gated_delta_rule, $make, gated_delta_rule);
        $crate::__conformance_test!(copy_upload_download, $make, copy_upload_download);
        $crate::__conformance_test!(store_bf16, $make, store, $crate::DType::BF16);
        $crate::__conformance_test!(store_f16, $make, store, $crate::DType::F16);
        $crate::__conformance_test!(store_q8_0, $make, store, $crate::DType::Q8_0);
        $crate::__conformance_test!(import_host, $make, import_host);
        $crate::__conformance_test!(streams_events, $make, streams_events);
        $crate::__conformance_test!(memory, $make, memory);
        $crate::__conformance_test!(errors, $make, errors);
    };
}

/// One test of [`conformance_suite!`]; not for direct use.
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_test {
    ($name:ident, $make:expr, $body:ident $(, $arg:expr)?) => {
        #[test]
        fn $name() {
            if let Some(b) = $crate::conformance::backend_or_skip($make, stringify!($name)) {
                $crate::conformance::$body(&*b $(, $arg)?);
            }
        }
    };
}

/// A tiny deterministic PRNG (SplitMix64), so the suite needs no `rand` and every backend
/// sees identical inputs.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[-1, 1)`.
    pub fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    /// `n` values uniform in `[-scale, scale)`.
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform() * scale).collect()
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// Whether `op` on `dtype` is implemented; prints a skip line when it is not.
fn supported(b: &dyn Backend, op: Op, dtype: DType) -> bool {
    let ok = b.supports(op, dtype);
    if !ok {
        println!(
            "skipped: {op:?} with {dtype}: not supported by the {} backend",
            b.kind()
        );
    }
    ok
}

/// Uploads `values` as `dtype`; returns the buffer and the values as the device holds them
/// (decoded exactly, so the reference sees the same rounded weights).
fn upload(
    b: &dyn Backend,
    dtype: DType,
    values: &[f32],
    usage: BufferUsage,
) -> (DeviceBuffer, Vec<f32>) {
    let bytes = from_f32_slice(values, dtype);
    let mut buf = b.alloc(dtype, values.len(), usage).expect("alloc");
    b.upload(StreamId::COMPUTE, &bytes, &mut buf, 0)
        .expect("upload");
    let decoded = to_f32_vec(&bytes, dtype).expect("decode");
    (buf, decoded)
}

/// Uploads f32 activations.
fn upload_f32(b: &dyn Backend, values: &[f32]) -> DeviceBuffer {
    upload(b, DType::F32, values, BufferUsage::Scratch).0
}

/// Downloads a whole buffer as f32 values of its dtype.
fn download(b: &dyn Backend, buf: &DeviceBuffer) -> Vec<f32> {
    let mut bytes = vec![0u8; buf.size_bytes()];
    b.download(StreamId::COMPUTE, buf, 0, &mut bytes)
        .expect("download");
    b.synchronize(StreamId::COMPUTE).expect("synchronize");
    to_f32_vec(&bytes, buf.dtype()).expect("decode")
}

/// Asserts `|got[i] - want[i]| <= bound(i)` for all `i`, reporting the worst offender.
fn assert_close(what: &str, got: &[f32], want: &[f32], bound: impl Fn(usize) -> f32) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mut worst: Option<(usize, f32)> = None;
    let mut ratio = 0f32;
    for i in 0..got.len() {
        let err = (got[i] - want[i]).abs();
        if err > 0.0 {
            ratio = ratio.max(err / bound(i));
        }
        // NaN in either side fails unless both are NaN.
        let ok = err <= bound(i) || (got[i].is_nan() && want[i].is_nan()) || got[i] == want[i];
        if !ok && worst.is_none_or(|(_, e)| err > e || err.is_nan()) {
            worst = Some((i, err));
        }
    }
    // Backend authors tuning a kernel can see how close each check came to its bound.
    if std::env::var_os("FT_CONFORMANCE_VERBOSE").is_some() {
        println!("{what}: worst error/bound = {ratio:.3e}");
    }
    if let Some((i, err)) = worst {
        panic!(
            "{what}: element {i}: got {}, want {}, error {err} > bound {}",
            got[i],
            want[i],
            bound(i)
        );
    }
}

/// `|got - want| <= atol + rtol·|want|`.
fn assert_rel(what: &str, got: &[f32], want: &[f32], rtol: f32, atol: f32) {
    assert_close(what, got, want, |i| atol + rtol * want[i].abs());
}
