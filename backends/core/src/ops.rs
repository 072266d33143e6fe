//! Op identifiers and the descriptors that parameterise each kernel.

/// Every kernel of the trait, for [`crate::Backend::supports`] and error messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// [`crate::Backend::matmul`]; the dtype is the weight dtype.
    Matmul,
    /// [`crate::Backend::rms_norm`]; the dtype is the weight dtype.
    RmsNorm,
    /// [`crate::Backend::rope`].
    Rope,
    /// [`crate::Backend::attention`]; the dtype is the KV cache dtype.
    Attention,
    /// [`crate::Backend::binary`].
    Binary,
    /// [`crate::Backend::scale`].
    Scale,
    /// [`crate::Backend::softmax`].
    Softmax,
    /// [`crate::Backend::top_k`].
    TopK,
    /// [`crate::Backend::gather_rows`]; the dtype is the table dtype.
    GatherRows,
    /// [`crate::Backend::scatter_add_rows`].
    ScatterAddRows,
    /// [`crate::Backend::copy`], upload and download.
    Copy,
    /// [`crate::Backend::causal_conv1d`]; the dtype is the weight dtype.
    CausalConv1d,
    /// [`crate::Backend::gated_delta_rule`].
    GatedDeltaRule,
}

impl Op {
    /// All ops, for listing what a backend supports.
    pub const ALL: [Op; 13] = [
        Op::Matmul,
        Op::RmsNorm,
        Op::Rope,
        Op::Attention,
        Op::Binary,
        Op::Scale,
        Op::Softmax,
        Op::TopK,
        Op::GatherRows,
        Op::ScatterAddRows,
        Op::Copy,
        Op::CausalConv1d,
        Op::GatedDeltaRule,
    ];

    /// Whether the op's dtype names stored data (weights, tables, caches, copies), which the
    /// trait allows in every dtype; the other ops work on f32 activations only.
    pub fn takes_stored_dtype(self) -> bool {
        matches!(self, Op::Matmul | Op::RmsNorm | Op::Attention | Op::GatherRows | Op::Copy | Op::CausalConv1d)
    }

    /// The [`crate::Backend::supports`] answer of a backend that implements every op in every
    /// dtype the trait allows: quantized types are weight formats, for `Matmul` only.
    pub fn fully_supported(self, dtype: crate::DType) -> bool {
        if dtype.is_quantized() {
            return self == Op::Matmul;
        }
        self.takes_stored_dtype() || dtype == crate::DType::F32
    }

    /// What a backend without kernels for the quantized weight types answers.
    pub fn supported_unquantized(self, dtype: crate::DType) -> bool {
        !dtype.is_quantized() && self.fully_supported(dtype)
    }
}

/// Element-wise `a = op(a, b)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum BinaryOp {
    /// `a + b` (residual connections).
    Add,
    /// `a * b`.
    Mul,
    /// `a * sigmoid(b)` (gated attention outputs).
    MulSigmoid,
    /// `silu(a) * b`: SwiGLU with `a` the gate and `b` the up projection.
    SwiGlu,
    /// gpt-oss's clamped SwiGLU: `g = min(a, limit)`, `u = clamp(b, -limit, limit)`,
    /// `a = g * sigmoid(alpha * g) * (u + 1)`.
    ClampedSwiGlu {
        /// Slope inside the sigmoid (1.702 in gpt-oss).
        alpha: f32,
        /// Clamp limit (7.0 in gpt-oss).
        limit: f32,
    },
    /// DeepSeek-V4's SwiGLU with clamped inputs: `a = silu(min(a, limit)) * clamp(b, -limit, limit)`.
    LimitedSwiGlu {
        /// Clamp limit (`swiglu_limit`).
        limit: f32,
    },
}

impl BinaryOp {
    /// The scalar definition every backend must match.
    #[inline]
    pub fn apply(self, a: f32, b: f32) -> f32 {
        match self {
            BinaryOp::Add => a + b,
            BinaryOp::Mul => a * b,
            BinaryOp::MulSigmoid => a * sigmoid(b),
            BinaryOp::SwiGlu => a * sigmoid(a) * b,
            BinaryOp::ClampedSwiGlu { alpha, limit } => {
                let g = a.min(limit);
                let u = b.clamp(-limit, limit);
                g * sigmoid(alpha * g) * (u + 1.0)
            }
            BinaryOp::LimitedSwiGlu { limit } => {
                let g = a.min(limit);
                g * sigmoid(g) * b.clamp(-limit, limit)
            }
        }
    }
}

/// The logistic function.
#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `ln(1 + eˣ)`, returning `x` itself above 20 as PyTorch's `softplus` does (the two agree
/// to f32 precision there, and `eˣ` would overflow soon after).
#[inline]
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// `out[n, m] = x[n, k] · w[m, k]ᵀ (+ bias)`, all offsets in elements of each buffer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MatmulDesc {
    /// Rows of `x` (tokens).
    pub n: usize,
    /// Inner dimension.
    pub k: usize,
    /// Rows of `w` used (output features).
    pub m: usize,
    /// First element of `x` used.
    pub x_offset: usize,
    /// First element of `w` used (selects e.g. one expert of a fused tensor).
    pub w_offset: usize,
    /// First element of `bias` used.
    pub bias_offset: usize,
    /// First element of `out` written.
    pub out_offset: usize,
}

impl MatmulDesc {
    /// A plain `[n, k] · [m, k]ᵀ` with no offsets.
    pub fn new(n: usize, k: usize, m: usize) -> Self {
        Self { n, k, m, ..Default::default() }
    }
}

/// One product of [`crate::Backend::matmul_same_x`]: `out = x · wᵀ (+ bias)` as `desc` says.
pub struct MatmulPart<'a> {
    /// The weights.
    pub w: &'a crate::DeviceBuffer,
    /// Optional f32 bias.
    pub bias: Option<&'a crate::DeviceBuffer>,
    /// The output.
    pub out: &'a mut crate::DeviceBuffer,
    /// Shapes and offsets, as for [`crate::Backend::matmul`].
    pub desc: MatmulDesc,
}

/// Row-wise RMSNorm over `rows × dim` contiguous values.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RmsNormDesc {
    /// Number of rows.
    pub rows: usize,
    /// Row length (and weight length).
    pub dim: usize,
    /// Added to the mean square before the square root.
    pub eps: f32,
    /// Multiply by `(1 + w)` instead of `w` (Qwen3-Next / Gemma style).
    pub unit_offset: bool,
}

/// Rotary embedding applied in place to `x[token, head, rot_offset .. rot_offset + rotary_dim]`.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeDesc {
    /// Number of tokens (rows).
    pub n_tokens: usize,
    /// Heads per token.
    pub n_heads: usize,
    /// Elements between consecutive heads of a token.
    pub head_stride: usize,
    /// Elements between consecutive tokens.
    pub row_stride: usize,
    /// Where the rotated part starts inside a head.
    pub rot_offset: usize,
    /// Length of the rotated part (even).
    pub rotary_dim: usize,
    /// Pairs `(2i, 2i+1)` (interleaved, GPT-J style) instead of `(i, i + rotary_dim/2)`.
    pub interleaved: bool,
    /// Position of each token.
    pub positions: Vec<u32>,
    /// Inverse frequencies, `rotary_dim / 2` of them (YaRN etc. are folded in by the caller).
    pub inv_freq: Vec<f32>,
    /// Multiplies cos and sin (YaRN's attention scaling; 1.0 otherwise).
    pub scaling: f32,
}

/// Causal attention of `n_tokens` new queries against the first `kv_len` cache entries.
///
/// Layouts: `q[n_tokens, n_heads, head_dim]`, caches `[capacity, n_kv_heads, head_dim]`
/// (values `v_head_dim`), `out[n_tokens, n_heads, v_head_dim]`, `sinks[n_heads]`.
/// Query `i` sits at position `kv_len - n_tokens + i` and sees cache entries `j <= pos`
/// (and `j > pos - window` when a window is set).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionDesc {
    /// New query tokens.
    pub n_tokens: usize,
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads (divides `n_heads`).
    pub n_kv_heads: usize,
    /// Query/key head size.
    pub head_dim: usize,
    /// Value head size.
    pub v_head_dim: usize,
    /// Valid cache entries, including the new tokens.
    pub kv_len: usize,
    /// Softmax scale applied to `q·k`.
    pub scale: f32,
    /// Sliding window length, if any.
    pub window: Option<usize>,
}

/// Where a paged KV cache keeps one sequence's rows: logical row `j` is row
/// `table[j / page_rows] * page_rows + j % page_rows` of the pool buffers, which hold the rows
/// of many sequences in fixed-size pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvPages<'a> {
    /// The pool page of each of the sequence's pages, in order.
    pub table: &'a [u32],
    /// Rows per page.
    pub page_rows: usize,
}

impl KvPages<'_> {
    /// The pool row of logical row `j` (`None` past the table's end).
    pub fn row(&self, j: usize) -> Option<usize> {
        let page = *self.table.get(j / self.page_rows.max(1))? as usize;
        Some(page * self.page_rows + j % self.page_rows)
    }

    /// The logical rows `start..end` as runs contiguous in the pool, in order: `(logical
    /// row, pool row, rows)`; neighbouring pages that are neighbours in the pool make one run.
    /// An error when the table does not reach `end` or the pages are zero rows.
    pub fn runs(&self, start: usize, end: usize) -> crate::Result<Vec<(usize, usize, usize)>> {
        self.check(end)?;
        let p = self.page_rows;
        let mut runs: Vec<(usize, usize, usize)> = Vec::new();
        let mut j = start;
        while j < end {
            let n = (p - j % p).min(end - j);
            let r = self.table[j / p] as usize * p + j % p;
            match runs.last_mut() {
                Some(last) if last.1 + last.2 == r => last.2 += n,
                _ => runs.push((j, r, n)),
            }
            j += n;
        }
        Ok(runs)
    }

    /// Pool rows a buffer must have for every page of the table.
    pub fn pool_rows(&self) -> usize {
        self.table.iter().max().map_or(0, |&m| (m as usize + 1) * self.page_rows)
    }

    /// An error unless the table reaches row `end` with pages of at least one row.
    pub fn check(&self, end: usize) -> crate::Result<()> {
        let p = self.page_rows;
        if p == 0 || end.div_ceil(p) > self.table.len() {
            return Err(crate::BackendError::Shape(format!(
                "a page table of {} pages of {p} rows does not reach row {end}",
                self.table.len()
            )));
        }
        Ok(())
    }

    /// Rows an attention kernel's cache buffers must hold for `kv_len` rows of a sequence:
    /// `kv_len` for a contiguous cache, every row of the pages for a paged one (whose table
    /// must reach `kv_len`).
    pub fn cache_rows(pages: Option<&Self>, kv_len: usize) -> crate::Result<usize> {
        match pages {
            Some(p) => {
                p.check(kv_len)?;
                Ok(p.pool_rows())
            }
            None => Ok(kv_len),
        }
    }
}

/// Element copy between buffers of the same dtype; offsets and length in elements.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CopyDesc {
    /// First source element.
    pub src_offset: usize,
    /// First destination element.
    pub dst_offset: usize,
    /// Number of elements.
    pub len: usize,
}

/// Result of [`crate::Backend::top_k`]: `rows × k` values and indices, best first.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TopK {
    /// Column indices.
    pub indices: Vec<u32>,
    /// The values at those columns.
    pub values: Vec<f32>,
}

/// Depthwise causal 1-D convolution over time, continuing from carried state (the short
/// convolution in front of Gated DeltaNet and Mamba-style layers).
///
/// Layouts: `x[n_tokens, channels]` and `out[n_tokens, channels]` (f32), `w[channels, kernel]`
/// (the checkpoint's `conv1d.weight [C, 1, K]`), `state[kernel - 1, channels]` (f32, oldest
/// row first). With `u` the rows of `state` followed by the rows of `x`,
/// `out[t, c] = act(Σ_{j<kernel} w[c, j] · u[t + j, c])`, `act` being SiLU or the identity;
/// afterwards `state` holds the last `kernel - 1` rows of `u`. A zero state is a sequence start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvDesc {
    /// New time steps.
    pub n_tokens: usize,
    /// Channels (each has its own filter).
    pub channels: usize,
    /// Filter length (at least 1).
    pub kernel: usize,
    /// Apply SiLU to the output.
    pub silu: bool,
}

/// The gated delta rule of Gated DeltaNet, run over `n_tokens` steps from a carried state.
///
/// Layouts (all f32): `qkv[n_tokens, 2·n_k_heads·k_head_dim + n_v_heads·v_head_dim]` (all
/// query heads, then all key heads, then all value heads), `beta_logits` and `decay_in`
/// `[n_tokens, n_v_heads]`, `a_log` and `dt_bias` `[n_v_heads]`, `state[n_v_heads, k_head_dim,
/// v_head_dim]`, `out[n_tokens, n_v_heads, v_head_dim]`. Value head `h` reads key/query head
/// `h / (n_v_heads / n_k_heads)`. Per step and value head, with `q`, `k` L2-normalised
/// (`x / √(Σx² + l2norm_eps)`) and `q` then multiplied by `scale`:
///
/// ```text
/// β = sigmoid(beta_logits)            g = −exp(a_log) · softplus(decay_in + dt_bias)
/// S ← S · exp(g)                      δ = β · (v − Sᵀk)
/// S ← S + k ⊗ δ                       out = Sᵀq
/// ```
///
/// A chunked evaluation is allowed as long as it agrees with this recurrence to float
/// precision; running the steps in one call or split over several gives the same result.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DeltaRuleDesc {
    /// Steps (tokens).
    pub n_tokens: usize,
    /// Query/key heads.
    pub n_k_heads: usize,
    /// Value heads (a multiple of `n_k_heads`), each with its own state.
    pub n_v_heads: usize,
    /// Query/key head size.
    pub k_head_dim: usize,
    /// Value head size.
    pub v_head_dim: usize,
    /// Added to `Σx²` in the L2 normalisation of `q` and `k`.
    pub l2norm_eps: f32,
    /// Multiplies the normalised query (usually `1/√k_head_dim`).
    pub scale: f32,
}

/// The read-only inputs of [`crate::Backend::gated_delta_rule`] (see [`DeltaRuleDesc`]).
#[derive(Clone, Copy, Debug)]
pub struct DeltaRuleInputs<'a> {
    /// Convolved query/key/value rows.
    pub qkv: &'a crate::DeviceBuffer,
    /// Logits of the write strength β (`b`), per token and value head.
    pub beta_logits: &'a crate::DeviceBuffer,
    /// Input of the decay gate (`a`), per token and value head.
    pub decay_in: &'a crate::DeviceBuffer,
    /// `A_log`, per value head.
    pub a_log: &'a crate::DeviceBuffer,
    /// `dt_bias`, per value head.
    pub dt_bias: &'a crate::DeviceBuffer,
}

/// One part of [`crate::Backend::scatter_add_rows_host`]: rows in host memory, each added with
/// its factor into a row of the accumulator.
#[derive(Clone, Copy, Debug)]
pub struct HostRows<'a> {
    /// `rows.len()` rows of the accumulator's width, one after another.
    pub x: &'a [f32],
    /// The accumulator row each row of `x` is added into.
    pub rows: &'a [u32],
    /// The factor of each row of `x`.
    pub scales: &'a [f32],
}

impl HostRows<'_> {
    /// Checks every part against an accumulator of `acc_len` values in rows of `cols`: `x`
    /// long enough, as many scales as rows, every row inside. Backends check all parts
    /// before the first addition, so that an error changes nothing.
    pub fn check(parts: &[HostRows<'_>], acc_len: usize, cols: usize) -> crate::Result<()> {
        let shape = |m: String| crate::BackendError::Shape(m);
        let acc_rows = acc_len.checked_div(cols).unwrap_or(0);
        for p in parts {
            if p.rows.len().checked_mul(cols).is_none_or(|n| n > p.x.len()) {
                return Err(shape(format!("scatter of {} rows × {cols} from {} values", p.rows.len(), p.x.len())));
            }
            if p.rows.len() != p.scales.len() {
                return Err(shape(format!("{} rows but {} scales", p.rows.len(), p.scales.len())));
            }
            if let Some(bad) = p.rows.iter().find(|&&r| r as usize >= acc_rows) {
                return Err(shape(format!("row {bad} out of a {acc_rows}-row accumulator")));
            }
        }
        Ok(())
    }
}
