//! Element types of device buffers and checkpoint tensors.

use crate::error::{BackendError, Result};
use half::{bf16, f16};

/// The element type of a buffer. Activations are F32; weights may be any of these.
///
/// The quantized types are packed blocks of values with their scales (see [`crate::quant`]
/// for the layouts). A buffer of one holds whole blocks; its length counts values including
/// the zero padding that completes each row's last block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE-754 single precision.
    F32,
    /// IEEE-754 half precision.
    F16,
    /// bfloat16 (the upper half of an f32).
    BF16,
    /// FP8 E4M3 with an f32 scale per 128 values of a row (block-scaled FP8 checkpoints).
    F8E4M3,
    /// NVFP4: E2M1 values, an E4M3 scale per 16 and an f32 global scale.
    Nvfp4,
    /// MXFP4: E2M1 values with an E8M0 scale per 32 (gpt-oss; GGUF's MXFP4 block).
    Mxfp4,
    /// GGML's Q8_0: 32 signed 8-bit values with an f16 scale (34 bytes, GGUF's block).
    Q8_0,
    /// GGML's Q4_0: 32 4-bit values offset by 8 with an f16 scale (18 bytes, GGUF's block).
    Q4_0,
    /// GGML's Q4_K: 256 4-bit values, 6-bit scale and min per 32, f16 super-block scales
    /// (144 bytes, GGUF's block).
    Q4K,
    /// GGML's Q5_K: Q4_K with a fifth bit per value (176 bytes, GGUF's block).
    Q5K,
    /// GGML's Q6_K: 256 6-bit values offset by 32, an i8 scale per 16 and an f16 super-block
    /// scale (210 bytes, GGUF's block).
    Q6K,
}

impl DType {
    /// Bytes per element of a plain type; for a quantized type, bytes per block (use
    /// [`DType::bytes_for`] and [`DType::row_bytes`] for sizes of those).
    pub const fn size(self) -> usize {
        crate::quant::block_bytes(self)
    }

    /// Values per block: 1 for the plain types.
    pub const fn block_elems(self) -> usize {
        crate::quant::block_elems(self)
    }

    /// Whether values are stored in scaled blocks rather than one by one.
    pub const fn is_quantized(self) -> bool {
        self.block_elems() > 1
    }

    /// `n` rounded up to whole blocks (the stored length of a row of `n` values).
    pub const fn padded(self, n: usize) -> usize {
        n.div_ceil(self.block_elems()) * self.block_elems()
    }

    /// Bytes of `n` values, or `None` when `n` is not a whole number of blocks (or overflows).
    pub const fn bytes_for(self, n: usize) -> Option<usize> {
        if n % self.block_elems() != 0 {
            return None;
        }
        (n / self.block_elems()).checked_mul(self.size())
    }

    /// Bytes of one stored row of `n` values (padded to whole blocks).
    pub const fn row_bytes(self, n: usize) -> usize {
        n.div_ceil(self.block_elems()) * self.size()
    }

    /// Values held by `bytes` bytes, or `None` when they are not whole blocks.
    pub const fn elems_in(self, bytes: usize) -> Option<usize> {
        if bytes % self.size() != 0 {
            return None;
        }
        Some(bytes / self.size() * self.block_elems())
    }

    /// The lower-case name used in flags and messages.
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F8E4M3 => "fp8",
            DType::Nvfp4 => "nvfp4",
            DType::Mxfp4 => "mxfp4",
            DType::Q8_0 => "q8_0",
            DType::Q4_0 => "q4_0",
            DType::Q4K => "q4_k",
            DType::Q5K => "q5_k",
            DType::Q6K => "q6_k",
        }
    }

    /// Parses `f32`, `f16`/`fp16`/`float16`, `bf16`/`bfloat16`, `fp8`/`f8e4m3`, `nvfp4`,
    /// `mxfp4`, and GGML's `q8_0`, `q4_0`, `q4_k`, `q5_k`, `q6_k` (any case; `q4k` etc. too).
    pub fn parse(s: &str) -> Option<DType> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "fp32" | "float32" => Some(DType::F32),
            "f16" | "fp16" | "float16" => Some(DType::F16),
            "bf16" | "bfloat16" => Some(DType::BF16),
            "fp8" | "f8e4m3" | "f8_e4m3" | "e4m3" => Some(DType::F8E4M3),
            "nvfp4" => Some(DType::Nvfp4),
            "mxfp4" => Some(DType::Mxfp4),
            "q8_0" => Some(DType::Q8_0),
            "q4_0" => Some(DType::Q4_0),
            "q4_k" | "q4k" => Some(DType::Q4K),
            "q5_k" | "q5k" => Some(DType::Q5K),
            "q6_k" | "q6k" => Some(DType::Q6K),
            _ => None,
        }
    }

    /// The plain (one value per element) types.
    pub const ALL: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

    /// The block-quantized (weight-only) types.
    pub const QUANTIZED: [DType; 8] = [
        DType::F8E4M3,
        DType::Nvfp4,
        DType::Mxfp4,
        DType::Q8_0,
        DType::Q4_0,
        DType::Q4K,
        DType::Q5K,
        DType::Q6K,
    ];
}

impl std::fmt::Display for DType {
    /// The [`DType::name`], except GGML's block types, which print as GGUF spells them
    /// (`Q8_0`, `Q4_0`, `Q4_K`, `Q5_K`, `Q6_K`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DType::Q8_0 => "Q8_0",
            DType::Q4_0 => "Q4_0",
            DType::Q4K => "Q4_K",
            DType::Q5K => "Q5_K",
            DType::Q6K => "Q6_K",
            d => d.name(),
        })
    }
}

/// Decodes little-endian bytes of `dtype` into f32 values (unaligned input is fine); a
/// quantized type yields every stored value, padding included.
pub fn to_f32_vec(bytes: &[u8], dtype: DType) -> Result<Vec<f32>> {
    if bytes.len() % dtype.size() != 0 {
        return Err(BackendError::Shape(format!(
            "{} bytes is not a whole number of {dtype} elements",
            bytes.len()
        )));
    }
    Ok(match dtype {
        DType::F8E4M3
        | DType::Nvfp4
        | DType::Mxfp4
        | DType::Q8_0
        | DType::Q4_0
        | DType::Q4K
        | DType::Q5K
        | DType::Q6K => {
            let be = dtype.block_elems();
            let mut out = vec![0f32; bytes.len() / dtype.size() * be];
            for (src, dst) in bytes
                .chunks_exact(dtype.size())
                .zip(out.chunks_exact_mut(be))
            {
                crate::quant::decode_block(dtype, src, dst);
            }
            out
        }
        DType::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        DType::F16 => bytes
            .chunks_exact(2)
            .map(|c| f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
            .collect(),
        DType::BF16 => bytes
            .chunks_exact(2)
            .map(|c| bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
            .collect(),
    })
}

/// Encodes f32 values as little-endian bytes of `dtype` (round to nearest even); a quantized
/// type treats `values` as one row (see [`crate::quant::quantize_row`]).
pub fn from_f32_slice(values: &[f32], dtype: DType) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() * dtype.size());
    match dtype {
        DType::F8E4M3
        | DType::Nvfp4
        | DType::Mxfp4
        | DType::Q8_0
        | DType::Q4_0
        | DType::Q4K
        | DType::Q5K
        | DType::Q6K => {
            crate::quant::quantize_row(dtype, values, &mut out)
        }
        DType::F32 => values.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        DType::F16 => values
            .iter()
            .for_each(|v| out.extend_from_slice(&f16::from_f32(*v).to_bits().to_le_bytes())),
        DType::BF16 => values
            .iter()
            .for_each(|v| out.extend_from_slice(&bf16::from_f32(*v).to_bits().to_le_bytes())),
    }
    out
}
