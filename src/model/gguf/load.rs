//! A GGUF file presented as the Hugging Face folder it was converted from: the config its
//! metadata describes, and its tensors under the names, shapes and row order the model loader
//! reads, as views of the mapped file (stacked experts are sliced per expert, not copied).

use super::{GgufError, GgufFile, GgufTensor};
use crate::model::arch::{self, ArchSpec, GgufKeys};
use crate::model::config::{ConfigError, ModelConfig};
use crate::model::weights_file::{ExternalTensor, FileDType, WeightFiles, WeightsError};
use crate::model::ModelError;
use ft_backend::{DType, HostBytes};
use serde_json::{json, Value};
use std::path::Path;

/// GGML type ids the engine computes with, and its dtype for each.
const TYPES: &[(u32, FileDType)] = &[
    (0, FileDType::Float(DType::F32)),
    (1, FileDType::Float(DType::F16)),
    (30, FileDType::Float(DType::BF16)),
    (2, FileDType::Packed(DType::Q4_0)),
    (8, FileDType::Packed(DType::Q8_0)),
    (12, FileDType::Packed(DType::Q4K)),
    (13, FileDType::Packed(DType::Q5K)),
    (14, FileDType::Packed(DType::Q6K)),
    (39, FileDType::Packed(DType::Mxfp4)),
];

/// The engine's element type for a GGML type id, or the message for one it cannot compute with.
pub fn file_dtype(ggml_type: u32) -> Result<FileDType, String> {
    TYPES.iter().find(|(t, _)| *t == ggml_type).map(|(_, d)| *d).ok_or_else(|| {
        let supported: Vec<String> = TYPES.iter().map(|(t, _)| super::file::ggml_type_name(*t)).collect();
        format!("{}, a block type this engine does not compute with (supported: {})", super::file::ggml_type_name(ggml_type), supported.join(", "))
    })
}

/// A GGUF model opened as a folder would be: its architecture, normalised config and tensors.
pub struct GgufModel {
    /// The family's name tables.
    pub spec: &'static ArchSpec,
    /// The `config.json` the metadata describes.
    pub config_json: Value,
    /// The normalised config.
    pub config: ModelConfig,
    /// The container (metadata, tokenizer keys).
    pub file: GgufFile,
}

impl GgufModel {
    /// Opens `path` (the first file of a split model) and derives the config.
    pub fn open(path: &Path) -> Result<GgufModel, ModelError> {
        let file = GgufFile::open(path)?;
        let meta = file.metadata();
        let spec = arch::spec_for(meta, path)?;
        let has = |name: &str| file.contains(name);
        let keys = GgufKeys { meta, arch: spec.gguf, path, tensors: &has };
        let mut config_json = arch::config_json(spec, &keys)?;
        if let Some(c) = config_json.as_object_mut() {
            if !c.contains_key("vocab_size") {
                // Older converters wrote no `{arch}.vocab_size`: the embedding's rows say it.
                let vocab = file.tensor("token_embd.weight").ok().and_then(|t| t.dims.get(1).copied());
                let vocab = vocab.ok_or_else(|| ConfigError::Missing { path: path.into(), key: format!("{}.vocab_size (or tensor token_embd.weight)", spec.gguf) })?;
                c.insert("vocab_size".into(), json!(vocab));
            }
        }
        let config = ModelConfig::from_json(&config_json, path)?;
        Ok(GgufModel { spec, config_json, config, file })
    }

    /// Which of [`GgufFile::files`] holds `t` (the index [`ExternalTensor::file`] takes).
    pub fn file_index(&self, t: &GgufTensor) -> usize {
        self.file.files().iter().position(|f| *f == t.file).unwrap_or(0)
    }

    /// The tensors under their Hugging Face names.
    pub fn weight_files(&self) -> Result<WeightFiles, ModelError> {
        let files = self.file.files().to_vec();
        let file_index = |t: &GgufTensor| self.file_index(t);
        let mut out = Vec::new();
        let mut names: Vec<&str> = self.file.tensor_names().collect();
        names.sort_unstable();
        for name in names {
            if let Some(parts) = super::fused::split(self, name, &file_index)? {
                out.extend(parts);
                continue;
            }
            let Some((hf, stacked)) = arch::hf_name(self.spec, name) else {
                tracing::debug!(tensor = name, "GGUF tensor not used by this architecture");
                continue;
            };
            let t = self.file.tensor(name)?;
            let dtype = file_dtype(t.ggml_type);
            // GGUF lists dimensions innermost first; the loader's shapes are outermost first.
            let mut shape: Vec<usize> = t.dims.iter().rev().copied().collect();
            if hf.ends_with("shared_expert_gate.weight") && shape.len() == 1 {
                shape.insert(0, 1);
            }
            let file = file_index(&t);
            let dtype_ok = match &dtype {
                Ok(d) => *d,
                Err(kind) => {
                    // The error surfaces only if the model reads the tensor.
                    let msg = format!("tensor `{name}` in {} is {kind}", t.file.display());
                    out.extend(unreadable(hf, file, shape, t.bytes, &msg, stacked));
                    continue;
                }
            };
            if stacked {
                out.extend(split_experts(&hf, &t, file, dtype_ok, &shape)?);
                continue;
            }
            let bytes = if self.spec.permuted_qk && (name.ends_with("attn_q.weight") || name.ends_with("attn_k.weight")) {
                let heads = if name.ends_with("attn_q.weight") { self.config.num_heads } else { self.config.num_kv_heads };
                unpermute_rows(&t, t.bytes.as_slice(), dtype_ok, &shape, heads)?
            } else {
                t.bytes.clone()
            };
            out.push(ExternalTensor { name: hf, file, dtype: Ok(dtype_ok), shape, bytes });
        }
        if let Some(extra) = self.spec.extra {
            out.extend(extra(self)?);
        }
        let spec = self.spec;
        let missing = Box::new(move |hf: &str| arch::gguf_name(spec, hf));
        Ok(WeightFiles::from_entries(self.file.path(), files, self.file.total_bytes(), out, missing)?)
    }
}

/// Entries that report `msg` when read: one per expert for a stacked tensor.
pub(super) fn unreadable(hf: String, file: usize, shape: Vec<usize>, bytes: HostBytes, msg: &str, stacked: bool) -> Vec<ExternalTensor> {
    let entry = |name: String, shape: Vec<usize>| ExternalTensor { name, file, dtype: Err(msg.to_string()), shape, bytes: bytes.clone() };
    match (stacked, shape.as_slice()) {
        (true, [n, rest @ ..]) => (0..*n).map(|e| entry(hf.replace("{e}", &e.to_string()), rest.to_vec())).collect(),
        _ => vec![entry(hf, shape)],
    }
}

/// Bytes of one row of `cols` values.
pub(crate) fn row_bytes(dtype: FileDType, cols: usize) -> usize {
    match dtype {
        FileDType::Packed(d) => d.row_bytes(cols),
        other => cols * other.size(),
    }
}

pub(crate) fn format_err(t: &GgufTensor, problem: String) -> ModelError {
    ModelError::Weights(WeightsError::Format { path: t.file.clone(), problem: format!("tensor `{}`: {problem}", t.name) })
}

/// `[E, rows, cols]` → one `[rows, cols]` view per expert, named with `{e}` filled in.
pub(crate) fn split_experts(hf: &str, t: &GgufTensor, file: usize, dtype: FileDType, shape: &[usize]) -> Result<Vec<ExternalTensor>, ModelError> {
    let [n, rows, cols] = *shape else {
        return Err(format_err(t, format!("a stacked expert tensor must have 3 dimensions, found {shape:?}")));
    };
    let per = rows * row_bytes(dtype, cols);
    if per * n != t.bytes.len() {
        return Err(format_err(t, format!("{} bytes for {n} experts of {rows}×{cols} {dtype}", t.bytes.len())));
    }
    (0..n)
        .map(|e| {
            let bytes = t.bytes.slice(e * per, per).ok_or_else(|| format_err(t, format!("expert {e} lies outside the tensor")))?;
            Ok(ExternalTensor { name: hf.replace("{e}", &e.to_string()), file, dtype: Ok(dtype), shape: vec![rows, cols], bytes })
        })
        .collect()
}

/// Undoes llama.cpp's reordering of query/key rows for interleaved RoPE: its converter
/// stores row `2j + t` of each head from row `t·(d/2) + j` of the checkpoint (whole rows move,
/// so any block type is reordered without decoding).
/// `src` holds the rows (all of `t`'s, or a part of a fused tensor); `t` names them in errors.
pub(super) fn unpermute_rows(t: &GgufTensor, src: &[u8], dtype: FileDType, shape: &[usize], heads: usize) -> Result<HostBytes, ModelError> {
    let [rows, cols] = *shape else {
        return Err(format_err(t, format!("expected a matrix, found shape {shape:?}")));
    };
    if heads == 0 || rows % heads != 0 || (rows / heads) % 2 != 0 {
        return Err(format_err(t, format!("{rows} rows do not split into {heads} heads of even size")));
    }
    let rb = row_bytes(dtype, cols);
    if src.len() != rows * rb {
        return Err(format_err(t, format!("{} bytes for {rows}×{cols} {dtype}", src.len())));
    }
    let (d, half) = (rows / heads, rows / heads / 2);
    let mut out = vec![0u8; src.len()];
    for h in 0..heads {
        for j in 0..half {
            for part in 0..2 {
                let from = (h * d + 2 * j + part) * rb;
                let to = (h * d + part * half + j) * rb;
                out[to..to + rb].copy_from_slice(&src[from..from + rb]);
            }
        }
    }
    Ok(HostBytes::from_vec(out))
}

impl From<GgufError> for ModelError {
    fn from(e: GgufError) -> Self {
        ModelError::Gguf(e)
    }
}
