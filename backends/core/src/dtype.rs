//! Element types of device buffers and checkpoint tensors.

use crate::error::{BackendError, Result};
use half::{bf16, f16};

/// The element type of a buffer. Activations are F32; weights may be any of these.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE-754 single precision.
    F32,
    /// IEEE-754 half precision.
    F16,
    /// bfloat16 (the upper half of an f32).
    BF16,
}

impl DType {
    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
        }
    }

    /// The lower-case name used in flags and messages.
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
        }
    }

    /// Parses `f32`, `f16`/`fp16`/`float16`, `bf16`/`bfloat16`.
    pub fn parse(s: &str) -> Option<DType> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "fp32" | "float32" => Some(DType::F32),
            "f16" | "fp16" | "float16" => Some(DType::F16),
            "bf16" | "bfloat16" => Some(DType::BF16),
            _ => None,
        }
    }

    /// All supported element types.
    pub const ALL: [DType; 3] = [DType::F32, DType::F16, DType::BF16];
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Decodes little-endian bytes of `dtype` into f32 values (unaligned input is fine).
pub fn to_f32_vec(bytes: &[u8], dtype: DType) -> Result<Vec<f32>> {
    if bytes.len() % dtype.size() != 0 {
        return Err(BackendError::Shape(format!(
            "{} bytes is not a whole number of {dtype} elements",
            bytes.len()
        )));
    }
    Ok(match dtype {
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

/// Encodes f32 values as little-endian bytes of `dtype` (round to nearest even).
pub fn from_f32_slice(values: &[f32], dtype: DType) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() * dtype.size());
    match dtype {
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
