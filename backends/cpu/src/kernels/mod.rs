//! The CPU kernels on plain host slices.
//!
//! [`crate::CpuBackend`] runs these on its buffers; the engine's CPU executors and benchmarks
//! call them directly on their own slices (e.g. expert weights in a memory-mapped
//! checkpoint). Every function checks its slice lengths and returns
//! [`BackendError::Shape`] instead of panicking; weight
//! bytes may sit at any alignment. Functions taking a `ThreadPool` split their work on it;
//! the rest run on the calling thread.

pub mod attention;
pub mod clock;
pub mod elementwise;
pub mod gemv;
mod many;
pub(crate) mod quant;
mod ranges;
pub mod recurrent;
pub mod rope;
pub mod select;
pub mod simd;
pub mod stream;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use attention::attention;
pub use elementwise::{
    axpy_row, binary, decode_row, exp_sub_sum, rms_norm_rows, scale, softmax_rows,
};
pub use gemv::{gemv_rows, matmul, matmul_rows};
pub use many::{matmul_many, matmul_same_x, ManyItem, SameX};
pub use quant::QuantDot;
pub use recurrent::{causal_conv1d, gated_delta_rule};
pub use rope::rope;
pub use select::{gather_rows, scatter_add_parts, scatter_add_rows, top_k};
pub use simd::SimdLevel;
pub use stream::{stream_sum, Loads};

use ft_backend::{BackendError, Result};

/// Whether bf16 products of 16 tokens or more run on AMX tiles here (the CPU has AMX-TILE,
/// AMX-BF16 and AVX-512 BF16, Linux granted the tile state, `FT_NO_AMX` is unset): their sums
/// then add in the tiles' order, so a token's last bits depend on whether its product had 16
/// tokens.
pub fn amx_tiles() -> bool {
    gemv::amx_tiles(SimdLevel::Auto, QuantDot::Int8, 16, 32)
}

/// An output the tasks of one call write at disjoint elements, none reading another's:
/// attention's (token, query head) rows, a prefill product's row tasks' columns.
#[derive(Clone, Copy)]
pub(crate) struct Out(pub(crate) *mut f32);
// SAFETY: the callers give each task elements of its own and wait for all of them.
unsafe impl Send for Out {}
unsafe impl Sync for Out {}

impl Out {
    /// Element `i`'s address (a method, so closures capture the whole wrapper).
    pub(crate) fn at(self, i: usize) -> *mut f32 {
        self.0.wrapping_add(i)
    }
}

/// A shape error with `msg`.
pub(crate) fn shape_err(msg: impl Into<String>) -> BackendError {
    BackendError::Shape(msg.into())
}

/// `a · b`, or a shape error naming `what` when it overflows `usize`.
pub(crate) fn need(a: usize, b: usize, what: &str) -> Result<usize> {
    a.checked_mul(b)
        .ok_or_else(|| shape_err(format!("{what} overflows: {a} × {b}")))
}
