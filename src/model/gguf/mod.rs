//! GGUF files as llama.cpp, Ollama and LM Studio write them: the container reader, and the
//! model config, tokenizer and chat template rebuilt from their metadata.

pub mod file;
mod fused;
pub mod load;
pub mod tokenizer;

pub use file::{GgufError, GgufFile, GgufTensor};
pub(crate) use file::split_name;

/// One metadata value, as typed in the file.
#[derive(Clone, Debug, PartialEq)]
pub enum MetaValue {
    /// `UINT8`.
    U8(u8),
    /// `INT8`.
    I8(i8),
    /// `UINT16`.
    U16(u16),
    /// `INT16`.
    I16(i16),
    /// `UINT32`.
    U32(u32),
    /// `INT32`.
    I32(i32),
    /// `UINT64`.
    U64(u64),
    /// `INT64`.
    I64(i64),
    /// `FLOAT32`.
    F32(f32),
    /// `FLOAT64`.
    F64(f64),
    /// `BOOL`.
    Bool(bool),
    /// `STRING` (UTF-8; invalid bytes are replaced, as llama.cpp's token lists may hold them).
    String(String),
    /// `ARRAY` of one element type.
    Array(Vec<MetaValue>),
}

impl MetaValue {
    /// An integer value of any width, if non-negative.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::U8(v) => Some(v.into()),
            MetaValue::U16(v) => Some(v.into()),
            MetaValue::U32(v) => Some(v.into()),
            MetaValue::U64(v) => Some(v),
            MetaValue::I8(v) => u64::try_from(v).ok(),
            MetaValue::I16(v) => u64::try_from(v).ok(),
            MetaValue::I32(v) => u64::try_from(v).ok(),
            MetaValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// An integer value of any width, signed.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            MetaValue::I8(v) => Some(v.into()),
            MetaValue::I16(v) => Some(v.into()),
            MetaValue::I32(v) => Some(v.into()),
            MetaValue::I64(v) => Some(v),
            _ => self.as_u64().and_then(|v| i64::try_from(v).ok()),
        }
    }

    /// A numeric value as f64 (floats and integers).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(v) => Some(v.into()),
            MetaValue::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    /// A boolean value.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// A string value.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// An array value.
    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            MetaValue::Array(a) => Some(a),
            _ => None,
        }
    }

    /// The GGUF name of the value's type, for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            MetaValue::U8(_) => "UINT8",
            MetaValue::I8(_) => "INT8",
            MetaValue::U16(_) => "UINT16",
            MetaValue::I16(_) => "INT16",
            MetaValue::U32(_) => "UINT32",
            MetaValue::I32(_) => "INT32",
            MetaValue::U64(_) => "UINT64",
            MetaValue::I64(_) => "INT64",
            MetaValue::F32(_) => "FLOAT32",
            MetaValue::F64(_) => "FLOAT64",
            MetaValue::Bool(_) => "BOOL",
            MetaValue::String(_) => "STRING",
            MetaValue::Array(_) => "ARRAY",
        }
    }
}

/// Metadata keys and values of a GGUF file (of the first split, which holds them all).
pub type Metadata = std::collections::BTreeMap<String, MetaValue>;

/// Whether `path` names a GGUF file: by its extension, or for a file without one (Ollama keeps
/// models as `blobs/sha256-…`) by its first four bytes.
pub fn is_gguf(path: &std::path::Path) -> bool {
    if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")) {
        return true;
    }
    if !path.is_file() {
        return false;
    }
    let mut magic = [0u8; 4];
    std::fs::File::open(path).and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic)).is_ok() && &magic == b"GGUF"
}

/// The name of a split model without its `-00001-of-00003` part (`None` if it has none).
pub fn split_base(stem: &str) -> Option<&str> {
    let (head, count) = stem.rsplit_once("-of-")?;
    let (base, no) = head.rsplit_once('-')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    (digits(no) && digits(count)).then_some(base)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_names_and_gguf_paths() {
        assert_eq!(split_base("Qwen3-30B-A3B-Q4_K_M-00001-of-00003"), Some("Qwen3-30B-A3B-Q4_K_M"));
        assert_eq!(split_base("Qwen3-30B-A3B-Q4_K_M"), None);
        assert_eq!(split_base("model-x-of-y"), None);
        assert!(is_gguf(std::path::Path::new("/m/a.GGUF")) && !is_gguf(std::path::Path::new("/m/a")));
        assert_eq!(MetaValue::I32(-1).as_u64(), None);
        assert_eq!(MetaValue::U8(7).as_f64(), Some(7.0));
    }
}
