//! Quantized checkpoints as publishers release them: which scheme a folder uses, and how its
//! tensors become the engine's packed block types ([`ft_backend::quant`]).
//!
//! Supported: block-scaled FP8 (`quant_method: "fp8"`: `weight` F8_E4M3 + `weight_scale_inv`
//! per `weight_block_size` block, or a per-tensor/per-channel `weight_scale`), NVFP4 as
//! ModelOpt writes it (`weight` U8 pairs + `weight_scale` F8_E4M3 per 16 + `weight_scale_2`)
//! and as compressed-tensors writes it (`weight_packed`, `weight_scale`, and a
//! `weight_global_scale` that divides), gpt-oss's MXFP4 experts (`*_blocks`/`*_scales`), and
//! DeepSeek-V4's layout (FP8 with E8M0 block scales named `.scale`, experts as FP4 pairs in
//! `I8` with an E8M0 `.scale` per 32).
//! Modules a scheme leaves unconverted are simply stored in BF16/F16/F32 and load as such.
//!
//! Repacking copies the stored codes and scales bit for bit into self-contained blocks; no
//! value is re-rounded. The packed matrices are owned memory (the scales live in separate
//! tensors of the file, so a mapped view cannot hold both).

use super::weights_file::{FileDType, RawTensor, WeightFiles, WeightsError};
use ft_backend::{DType, HostBytes};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// A quantized checkpoint that cannot be read, naming the file and tensor or key.
#[derive(Debug, thiserror::Error)]
pub enum QuantError {
    /// A `quant_method` (or ModelOpt `quant_algo`, compressed-tensors `format`) the engine
    /// cannot run.
    #[error("{path}: quantization `{method}` is not supported; supported: {SUPPORTED}")]
    Unsupported { path: PathBuf, method: String },
    /// The quantization settings are malformed.
    #[error("{path}: quantization_config.{key}: {problem}")]
    Config { path: PathBuf, key: String, problem: String },
    /// A quantized tensor or its scales do not fit together.
    #[error("tensor `{name}` in {file}: {problem}")]
    Tensor { name: String, file: PathBuf, problem: String },
}

/// What [`QuantError::Unsupported`] lists.
pub const SUPPORTED: &str = "fp8 (block-scaled or per-tensor E4M3; with DeepSeek-V4's ue8m0 scales and FP4 experts), modelopt NVFP4/FP8, compressed-tensors nvfp4-pack-quantized, mxfp4 (gpt-oss), or unquantized F32/F16/BF16";

/// The quantization scheme of a checkpoint folder.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum QuantScheme {
    /// Plain F32/F16/BF16 weights.
    #[default]
    None,
    /// FP8 E4M3 weights with `weight_scale_inv` per `[rows, cols]` block (`None`: a
    /// per-tensor or per-channel `weight_scale`).
    Fp8 {
        /// `weight_block_size`: rows, columns.
        block: Option<(usize, usize)>,
    },
    /// NVFP4 (ModelOpt or compressed-tensors naming; told apart per tensor).
    Nvfp4,
    /// gpt-oss MXFP4 experts.
    Mxfp4,
}

impl QuantScheme {
    /// Reads `quantization_config` from `config.json` (or `text_config`), else ModelOpt's
    /// `hf_quant_config.json`.
    pub fn from_dir(dir: &Path) -> Result<QuantScheme, QuantError> {
        let path = dir.join("config.json");
        let config: Option<Value> = std::fs::read_to_string(&path).ok().and_then(|t| serde_json::from_str(&t).ok());
        let qc = config.as_ref().and_then(|c| {
            c.get("quantization_config").or_else(|| c.get("text_config").and_then(|t| t.get("quantization_config")))
        });
        if let Some(qc) = qc {
            return Self::from_json(qc, &path);
        }
        let hf = dir.join("hf_quant_config.json");
        if let Ok(text) = std::fs::read_to_string(&hf) {
            let v: Value = serde_json::from_str(&text).map_err(|e| QuantError::Config {
                path: hf.clone(),
                key: "<root>".into(),
                problem: format!("invalid JSON: {e}"),
            })?;
            let algo = v.pointer("/quantization/quant_algo").and_then(|a| a.as_str()).unwrap_or("");
            return modelopt(algo, &hf);
        }
        Ok(QuantScheme::None)
    }

    /// Interprets one `quantization_config` object; `path` is for messages.
    pub fn from_json(qc: &Value, path: &Path) -> Result<QuantScheme, QuantError> {
        let method = qc.get("quant_method").and_then(|m| m.as_str()).ok_or_else(|| QuantError::Config {
            path: path.into(),
            key: "quant_method".into(),
            problem: "missing or not a string".into(),
        })?;
        match method.to_ascii_lowercase().as_str() {
            "fp8" => {
                if let Some(fmt) = qc.get("fmt").and_then(|f| f.as_str()) {
                    if !fmt.eq_ignore_ascii_case("e4m3") {
                        return Err(QuantError::Unsupported { path: path.into(), method: format!("fp8 with fmt `{fmt}`") });
                    }
                }
                let block = match qc.get("weight_block_size") {
                    None | Some(Value::Null) => None,
                    Some(v) => {
                        let dims: Option<Vec<usize>> = v.as_array().map(|a| a.iter().filter_map(|d| d.as_u64().map(|d| d as usize)).collect());
                        match dims.as_deref() {
                            Some(&[r, c]) if r > 0 && c > 0 => Some((r, c)),
                            _ => {
                                return Err(QuantError::Config {
                                    path: path.into(),
                                    key: "weight_block_size".into(),
                                    problem: format!("expected two positive integers, found {v}"),
                                })
                            }
                        }
                    }
                };
                Ok(QuantScheme::Fp8 { block })
            }
            "mxfp4" => Ok(QuantScheme::Mxfp4),
            m if m.starts_with("modelopt") => {
                let algo = qc.get("quant_algo").and_then(|a| a.as_str()).unwrap_or(if m == "modelopt_fp4" { "NVFP4" } else { "" });
                modelopt(algo, path)
            }
            "compressed-tensors" => {
                let format = qc.get("format").and_then(|f| f.as_str()).unwrap_or("");
                match format {
                    "nvfp4-pack-quantized" => Ok(QuantScheme::Nvfp4),
                    // compressed-tensors' FP8 stores `weight` F8_E4M3 + per-tensor/channel `weight_scale`.
                    "float-quantized" | "naive-quantized" => Ok(QuantScheme::Fp8 { block: None }),
                    other => Err(QuantError::Unsupported { path: path.into(), method: format!("compressed-tensors format `{other}`") }),
                }
            }
            _ => Err(QuantError::Unsupported { path: path.into(), method: method.into() }),
        }
    }
}

fn modelopt(algo: &str, path: &Path) -> Result<QuantScheme, QuantError> {
    match algo.to_ascii_uppercase().as_str() {
        "NVFP4" | "W4A16_NVFP4" => Ok(QuantScheme::Nvfp4),
        "FP8" => Ok(QuantScheme::Fp8 { block: None }),
        other => Err(QuantError::Unsupported { path: path.into(), method: format!("modelopt quant_algo `{other}`") }),
    }
}

/// A `[rows, cols]` weight matrix ready for a backend: a view of the file for plain dtypes,
/// packed blocks (owned) for quantized ones.
pub struct PackedMatrix {
    /// The bytes: `rows * dtype.row_bytes(cols)`.
    pub bytes: HostBytes,
    /// Element type.
    pub dtype: DType,
}

/// Loads the weight of linear layer `base` (`{base}.weight`, or compressed-tensors'
/// `{base}.weight_packed`) as `[rows, cols]`, repacking quantized storage.
pub fn load_matrix(files: &WeightFiles, scheme: &QuantScheme, base: &str, rows: usize, cols: usize) -> Result<PackedMatrix, super::ModelError> {
    let name = format!("{base}.weight");
    if !files.contains(&name) && files.contains(&format!("{base}.weight_packed")) {
        return Ok(compressed_nvfp4(files, base, rows, cols)?);
    }
    match files.file_dtype(&name) {
        Some(FileDType::F8E4M3) => Ok(fp8(files, scheme, base, rows, cols)?),
        Some(FileDType::U8) if files.contains(&format!("{base}.weight_scale_2")) => Ok(modelopt_nvfp4(files, base, rows, cols)?),
        Some(FileDType::I8) if files.contains(&format!("{base}.scale")) => Ok(fp4_e8m0(files, base, rows, cols)?),
        Some(FileDType::Packed(dtype)) => {
            let t = raw(files, &name)?;
            if t.shape != [rows, cols] || t.bytes.len() != rows * dtype.row_bytes(cols) {
                return Err(WeightsError::Shape { name, found: t.shape, expected: vec![rows, cols] }.into());
            }
            Ok(PackedMatrix { bytes: t.bytes, dtype })
        }
        _ => {
            let t = files.get_shaped(&name, &[rows, cols])?;
            Ok(PackedMatrix { bytes: t.bytes, dtype: t.dtype })
        }
    }
}

fn tensor_err(t: &RawTensor, problem: String) -> QuantError {
    QuantError::Tensor { name: t.name.clone(), file: t.file.clone(), problem }
}

fn raw(files: &WeightFiles, name: &str) -> Result<RawTensor, super::ModelError> {
    Ok(files.get_raw(name)?)
}

/// Checks a tensor's shape and dtype.
fn expect(t: &RawTensor, dtypes: &[FileDType], shape: &[&[usize]]) -> Result<(), QuantError> {
    if !dtypes.contains(&t.dtype) {
        let want: Vec<&str> = dtypes.iter().map(|d| d.tag()).collect();
        return Err(tensor_err(t, format!("dtype {} where {} was expected", t.dtype, want.join(" or "))));
    }
    if !shape.iter().any(|s| t.shape == *s) {
        return Err(tensor_err(t, format!("shape {:?} where {:?} was expected", t.shape, shape[0])));
    }
    Ok(())
}

/// A scalar f32 scale stored as `[]` or `[1]` (F32/BF16/F16).
fn scalar(t: &RawTensor) -> Result<f32, QuantError> {
    let floats = [FileDType::Float(DType::F32), FileDType::Float(DType::BF16), FileDType::Float(DType::F16)];
    expect(t, &floats, &[&[], &[1]])?;
    t.to_f32().and_then(|v| v.first().copied()).ok_or_else(|| tensor_err(t, "empty scale".into()))
}

fn fp8(files: &WeightFiles, scheme: &QuantScheme, base: &str, rows: usize, cols: usize) -> Result<PackedMatrix, super::ModelError> {
    let w = raw(files, &format!("{base}.weight"))?;
    expect(&w, &[FileDType::F8E4M3], &[&[rows, cols]])?;
    let floats = [FileDType::Float(DType::F32), FileDType::Float(DType::BF16), FileDType::Float(DType::F16)];
    // The scale of each (row, 128-column block) of the packed layout. DeepSeek-V4 names the
    // block scales `.scale` and stores them as E8M0 (`ue8m0`).
    let inv_name = [format!("{base}.weight_scale_inv"), format!("{base}.scale")].into_iter().find(|n| files.contains(n));
    let scale_of: Box<dyn Fn(usize, usize) -> f32> = if let Some(inv_name) = inv_name {
        let s = raw(files, &inv_name)?;
        let (b0, b1) = match scheme {
            QuantScheme::Fp8 { block: Some(b) } => *b,
            _ => {
                return Err(tensor_err(&s, "a block scale without `weight_block_size` in quantization_config".into()).into());
            }
        };
        if b1 % 128 != 0 {
            return Err(tensor_err(&s, format!("weight_block_size [{b0}, {b1}]: the column block must be a multiple of 128 (the engine's FP8 block)")).into());
        }
        let (sr, sc) = (rows.div_ceil(b0), cols.div_ceil(b1));
        expect(&s, &[&floats[..], &[FileDType::F8E8M0, FileDType::U8]].concat(), &[&[sr, sc]])?;
        let v = e8m0_or_float(&s);
        Box::new(move |r, c| v[(r / b0) * sc + c / b1])
    } else {
        let s = raw(files, &format!("{base}.weight_scale"))?;
        expect(&s, &floats, &[&[], &[1], &[rows], &[rows, 1]])?;
        let v = s.to_f32().unwrap_or_default();
        if v.len() == rows && rows > 1 {
            Box::new(move |r, _| v[r])
        } else {
            let one = v.first().copied().unwrap_or(1.0);
            Box::new(move |_, _| one)
        }
    };
    let codes = w.bytes.as_slice();
    let dtype = DType::F8E4M3;
    let mut out = Vec::with_capacity(rows * dtype.row_bytes(cols));
    for r in 0..rows {
        let row = &codes[r * cols..(r + 1) * cols];
        for (b, chunk) in row.chunks(128).enumerate() {
            out.extend_from_slice(&scale_of(r, b * 128).to_le_bytes());
            out.extend_from_slice(chunk);
            out.resize(out.len() + 128 - chunk.len(), 0);
        }
    }
    Ok(PackedMatrix { bytes: HostBytes::from_vec(out), dtype })
}

/// A scale tensor's values: floats as they are, E8M0 (`F8_E8M0`, or its bytes as `U8`) as
/// powers of two.
fn e8m0_or_float(t: &RawTensor) -> Vec<f32> {
    match t.dtype {
        FileDType::U8 => t.bytes.as_slice().iter().map(|c| ft_backend::quant::e8m0_to_f32(*c)).collect(),
        _ => t.to_f32().unwrap_or_default(),
    }
}

/// DeepSeek-V4's FP4 experts: `weight` I8 `[rows, cols/2]` (value `2j` in the low nibble of
/// byte `j`) and `scale` E8M0 `[rows, cols/32]`, which is MXFP4: repacked into its blocks.
fn fp4_e8m0(files: &WeightFiles, base: &str, rows: usize, cols: usize) -> Result<PackedMatrix, super::ModelError> {
    let w = raw(files, &format!("{base}.weight"))?;
    if !cols.is_multiple_of(32) {
        return Err(tensor_err(&w, format!("FP4 with a scale per 32 needs the input size to be a multiple of 32, found {cols}")).into());
    }
    let nb = cols / 32;
    expect(&w, &[FileDType::I8, FileDType::U8], &[&[rows, cols / 2]])?;
    let s = raw(files, &format!("{base}.scale"))?;
    expect(&s, &[FileDType::F8E8M0, FileDType::U8], &[&[rows, nb]])?;
    let (b, sc) = (w.bytes.as_slice(), s.bytes.as_slice());
    let mut out = Vec::with_capacity(rows * DType::Mxfp4.row_bytes(cols));
    for i in 0..rows * nb {
        out.push(sc[i]);
        let src = &b[i * 16..i * 16 + 16];
        let nib = |v: usize| (src[v / 2] >> (4 * (v % 2))) & 0x0f;
        out.extend((0..16).map(|j| nib(j) | (nib(j + 16) << 4)));
    }
    Ok(PackedMatrix { bytes: HostBytes::from_vec(out), dtype: DType::Mxfp4 })
}

/// Packs NVFP4 rows: `data [rows, cols/2]` (low nibble first), E4M3 `scales [rows, cols/16]`,
/// one global multiplier.
fn pack_nvfp4(data: &[u8], scales: &[u8], global: f32, rows: usize, cols: usize) -> Vec<u8> {
    let dtype = DType::Nvfp4;
    let (groups, half) = (cols / 16, cols / 2);
    let mut out = Vec::with_capacity(rows * dtype.row_bytes(cols));
    for r in 0..rows {
        for sb in 0..cols.div_ceil(256) {
            out.extend_from_slice(&global.to_le_bytes());
            let g0 = sb * 16;
            let g1 = (g0 + 16).min(groups);
            let mut s = [0u8; 16];
            s[..g1 - g0].copy_from_slice(&scales[r * groups + g0..r * groups + g1]);
            out.extend_from_slice(&s);
            let mut d = [0u8; 128];
            let (b0, b1) = (r * half + g0 * 8, r * half + g1 * 8);
            d[..b1 - b0].copy_from_slice(&data[b0..b1]);
            out.extend_from_slice(&d);
        }
    }
    out
}

fn nvfp4_parts(files: &WeightFiles, data: &str, scale: &str, rows: usize, cols: usize) -> Result<(RawTensor, RawTensor), super::ModelError> {
    let w = raw(files, data)?;
    if cols % 16 != 0 {
        return Err(tensor_err(&w, format!("NVFP4 needs the input size to be a multiple of 16, found {cols}")).into());
    }
    expect(&w, &[FileDType::U8], &[&[rows, cols / 2]])?;
    let s = raw(files, scale)?;
    expect(&s, &[FileDType::F8E4M3], &[&[rows, cols / 16]])?;
    Ok((w, s))
}

fn modelopt_nvfp4(files: &WeightFiles, base: &str, rows: usize, cols: usize) -> Result<PackedMatrix, super::ModelError> {
    let (w, s) = nvfp4_parts(files, &format!("{base}.weight"), &format!("{base}.weight_scale"), rows, cols)?;
    let global = scalar(&raw(files, &format!("{base}.weight_scale_2"))?)?;
    let packed = pack_nvfp4(w.bytes.as_slice(), s.bytes.as_slice(), global, rows, cols);
    Ok(PackedMatrix { bytes: HostBytes::from_vec(packed), dtype: DType::Nvfp4 })
}

/// compressed-tensors stores the global scale as a divisor; the kernels multiply, so it is
/// inverted once here (within one ulp of dividing every block scale by it).
fn compressed_nvfp4(files: &WeightFiles, base: &str, rows: usize, cols: usize) -> Result<PackedMatrix, super::ModelError> {
    let (w, s) = nvfp4_parts(files, &format!("{base}.weight_packed"), &format!("{base}.weight_scale"), rows, cols)?;
    let gt = raw(files, &format!("{base}.weight_global_scale"))?;
    let divisor = scalar(&gt)?;
    if divisor == 0.0 || !divisor.is_finite() {
        return Err(tensor_err(&gt, format!("global scale {divisor} cannot divide")).into());
    }
    let packed = pack_nvfp4(w.bytes.as_slice(), s.bytes.as_slice(), 1.0 / divisor, rows, cols);
    Ok(PackedMatrix { bytes: HostBytes::from_vec(packed), dtype: DType::Nvfp4 })
}

/// gpt-oss MXFP4 experts: `{prefix}.{proj}_blocks [E, rows, cols/32, 16]` (value `2j` in the
/// low nibble of byte `j`) and `{prefix}.{proj}_scales [E, rows, cols/32]` (E8M0). Returns one
/// packed `[rows, cols]` matrix per expert, rows in the stored (output-feature) order.
pub fn mxfp4_experts(files: &WeightFiles, prefix: &str, proj: &str, n: usize, rows: usize, cols: usize) -> Result<Vec<Vec<u8>>, super::ModelError> {
    let blocks = raw(files, &format!("{prefix}.{proj}_blocks"))?;
    if cols % 32 != 0 {
        return Err(tensor_err(&blocks, format!("MXFP4 needs the input size to be a multiple of 32, found {cols}")).into());
    }
    let nb = cols / 32;
    expect(&blocks, &[FileDType::U8], &[&[n, rows, nb, 16]])?;
    let scales = raw(files, &format!("{prefix}.{proj}_scales"))?;
    expect(&scales, &[FileDType::U8], &[&[n, rows, nb]])?;
    let (b, s) = (blocks.bytes.as_slice(), scales.bytes.as_slice());
    let per_expert = rows * DType::Mxfp4.row_bytes(cols);
    Ok((0..n)
        .map(|e| {
            let mut out = Vec::with_capacity(per_expert);
            for i in (e * rows * nb)..((e + 1) * rows * nb) {
                out.push(s[i]);
                let src = &b[i * 16..i * 16 + 16];
                // Stored: byte j = values 2j (low), 2j+1 (high). Engine: byte j = values j
                // (low), j+16 (high).
                let nib = |v: usize| (src[v / 2] >> (4 * (v % 2))) & 0x0f;
                out.extend((0..16).map(|j| nib(j) | (nib(j + 16) << 4)));
            }
            out
        })
        .collect())
}
