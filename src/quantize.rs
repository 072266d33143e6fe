//! `ft-actor quantize`: writes a bf16/f16/f32 checkpoint in a publisher's quantized layout
//! (block-scaled FP8 as DeepSeek-V3/Qwen-FP8, NVFP4 as ModelOpt, MXFP4 as gpt-oss), one
//! tensor at a time, so memory stays at the size of the largest tensor.
//!
//! Optionally it also writes the *dequantized twin*: an f32 checkpoint holding exactly the
//! values the quantized one decodes to (decoded here from the written bytes with the
//! publishers' formulas), which accuracy tests compare against. The engine loads these
//! layouts into its packed types ([`ft_backend::DType::F8E4M3`], `Nvfp4`, `Mxfp4`).

use crate::model::weights_file::{FileDType, WeightFiles};
use ft_backend::quant::{amax, e2m1_to_f32, e4m3_to_f32, e8m0_to_f32, f32_to_e4m3, fp8_scale, mxfp4_group, nvfp4_global_scale, nvfp4_group};
use serde_json::{json, Value};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The published layouts `quantize` writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuantFormat {
    /// FP8 E4M3 with `weight_scale_inv` per 128×128 block.
    Fp8,
    /// ModelOpt NVFP4.
    Nvfp4,
    /// gpt-oss MXFP4 experts.
    Mxfp4,
    /// DeepSeek-V4's published layout: FP8 with E8M0 block scales, FP4 routed experts.
    Fp8Fp4,
}

impl QuantFormat {
    /// Parses `fp8`, `nvfp4`, `mxfp4`, `fp8-fp4` (alias `deepseek-v4`).
    pub fn parse(s: &str) -> Option<QuantFormat> {
        match s.to_ascii_lowercase().as_str() {
            "fp8" => Some(QuantFormat::Fp8),
            "nvfp4" => Some(QuantFormat::Nvfp4),
            "mxfp4" => Some(QuantFormat::Mxfp4),
            "fp8-fp4" | "deepseek-v4" => Some(QuantFormat::Fp8Fp4),
            _ => None,
        }
    }
}

/// Why a checkpoint could not be quantized.
#[derive(Debug, thiserror::Error)]
pub enum QuantizeError {
    /// The output folder holds a checkpoint and `overwrite` was not given.
    #[error("{0} already holds a checkpoint; pass --overwrite to replace it")]
    Exists(PathBuf),
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    /// The source checkpoint cannot be read.
    #[error(transparent)]
    Model(#[from] crate::model::ModelError),
    /// The format does not apply to this checkpoint.
    #[error("{0}")]
    Unsupported(String),
}

/// What to quantize and where to.
#[derive(Clone, Debug)]
pub struct QuantizeOptions {
    /// Source checkpoint folder (F32/F16/BF16).
    pub model: PathBuf,
    /// Output folder.
    pub out: PathBuf,
    /// Layout to write.
    pub format: QuantFormat,
    /// Replace an existing checkpoint in `out`.
    pub overwrite: bool,
    /// Also write the dequantized f32 twin here.
    pub twin: Option<PathBuf>,
}

/// What was written.
#[derive(Clone, Debug, Default)]
pub struct QuantizeReport {
    /// Tensors quantized.
    pub quantized: usize,
    /// Tensors copied unchanged.
    pub copied: usize,
    /// Bytes of the source weight files.
    pub bytes_in: u64,
    /// Bytes of the written weight files.
    pub bytes_out: u64,
}

/// One output tensor: name, dtype tag, shape, bytes.
type Out = (String, &'static str, Vec<usize>, Vec<u8>);

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> QuantizeError + '_ {
    move |source| QuantizeError::Io { path: path.to_path_buf(), source }
}

/// Whether a 2-D `….weight` is a linear layer the publishers quantize (not embeddings, the LM
/// head, norms, routers or gates).
fn is_quantized_linear(name: &str, shape: &[usize]) -> bool {
    shape.len() == 2
        && name.ends_with(".weight")
        && (name.contains(".layers.") || name.starts_with("layers."))
        && !name.ends_with(".ffn.gate.weight")
        && !name.contains("norm")
        && !name.ends_with(".mlp.gate.weight")
        && !name.ends_with("shared_expert_gate.weight")
        && !name.contains(".router.")
        && !name.contains("conv1d")
}

/// A DeepSeek-V4 routed expert's projection (`layers.{i}.ffn.experts.{e}.w{1,2,3}.weight`).
fn is_v4_expert(name: &str) -> bool {
    name.contains(".ffn.experts.")
}

fn f32s(v: &[f32]) -> Vec<u8> {
    bytemuck::cast_slice(v).to_vec()
}

/// Block-scaled FP8 (DeepSeek-V3's recipe: `scale_inv = amax/448` per 128×128 block).
fn fp8(name: &str, w: &[f32], rows: usize, cols: usize) -> (Vec<Out>, Vec<f32>) {
    const B: usize = 128;
    let (sr, sc) = (rows.div_ceil(B), cols.div_ceil(B));
    let mut scales = vec![0f32; sr * sc];
    for (i, s) in scales.iter_mut().enumerate() {
        let (br, bc) = (i / sc, i % sc);
        let cs = bc * B..((bc + 1) * B).min(cols);
        *s = fp8_scale((br * B..((br + 1) * B).min(rows)).map(|r| amax(&w[r * cols..][cs.clone()])).fold(0.0, f32::max));
    }
    let codes: Vec<u8> = (0..rows * cols).map(|i| f32_to_e4m3(w[i] / scales[(i / cols / B) * sc + (i % cols) / B])).collect();
    let deq = (0..rows * cols).map(|i| e4m3_to_f32(codes[i]) * scales[(i / cols / B) * sc + (i % cols) / B]).collect();
    let base = name.trim_end_matches(".weight");
    (vec![(name.into(), "F8_E4M3", vec![rows, cols], codes), (format!("{base}.weight_scale_inv"), "F32", vec![sr, sc], f32s(&scales))], deq)
}

/// DeepSeek-V4's linear layers that its checkpoints keep in BF16: the compressors' and the
/// indexer's projections (transformers lists them in `_keep_in_fp32_modules`).
fn v4_keeps_unquantized(name: &str) -> bool {
    [".compressor.wkv.", ".compressor.wgate.", ".indexer.weights_proj."].iter().any(|p| name.contains(p))
}

/// An E8M0 power of two at or above `amax / max` (DeepSeek-V4's `ue8m0` scales).
fn ue8m0_code(amax: f32, max: f32) -> u8 {
    if amax <= 0.0 || !amax.is_finite() {
        return 127;
    }
    ((amax / max).log2().ceil() as i32 + 127).clamp(0, 254) as u8
}

/// DeepSeek-V4's FP8: E4M3 codes with an E8M0 `.scale` per 128×128 block.
fn fp8_ue8m0(name: &str, w: &[f32], rows: usize, cols: usize) -> (Vec<Out>, Vec<f32>) {
    const B: usize = 128;
    let (sr, sc) = (rows.div_ceil(B), cols.div_ceil(B));
    let codes_s: Vec<u8> = (0..sr * sc)
        .map(|i| {
            let (br, bc) = (i / sc, i % sc);
            let cs = bc * B..((bc + 1) * B).min(cols);
            ue8m0_code((br * B..((br + 1) * B).min(rows)).map(|r| amax(&w[r * cols..][cs.clone()])).fold(0.0, f32::max), 448.0)
        })
        .collect();
    let scale = |i: usize| e8m0_to_f32(codes_s[(i / cols / B) * sc + (i % cols) / B]);
    let codes: Vec<u8> = (0..rows * cols).map(|i| f32_to_e4m3(w[i] / scale(i))).collect();
    let deq = (0..rows * cols).map(|i| e4m3_to_f32(codes[i]) * scale(i)).collect();
    let base = name.trim_end_matches(".weight");
    (vec![(name.into(), "F8_E4M3", vec![rows, cols], codes), (format!("{base}.scale"), "F8_E8M0", vec![sr, sc], codes_s)], deq)
}

/// DeepSeek-V4's FP4 experts: E2M1 pairs in `I8` (value `2j` in the low nibble), an E8M0
/// `.scale` per 32 values of a row.
fn fp4_ue8m0(name: &str, w: &[f32], rows: usize, cols: usize) -> (Vec<Out>, Vec<f32>) {
    let nb = cols / 32;
    let (mut packed, mut scales, mut deq) = (vec![0u8; rows * cols / 2], vec![0u8; rows * nb], vec![0f32; rows * cols]);
    for r in 0..rows {
        for b in 0..nb {
            let at = r * cols + b * 32;
            let (code, q) = mxfp4_group(&w[at..at + 32]);
            scales[r * nb + b] = code;
            for j in 0..16 {
                packed[at / 2 + j] = q[2 * j] | (q[2 * j + 1] << 4);
            }
            for (d, c) in deq[at..at + 32].iter_mut().zip(q) {
                *d = e2m1_to_f32(c) * e8m0_to_f32(code);
            }
        }
    }
    let base = name.trim_end_matches(".weight");
    (vec![(name.into(), "I8", vec![rows, cols / 2], packed), (format!("{base}.scale"), "F8_E8M0", vec![rows, nb], scales)], deq)
}

/// ModelOpt NVFP4: global `amax/(6·448)`, E4M3 scale per 16, E2M1 pairs low nibble first.
fn nvfp4(name: &str, w: &[f32], rows: usize, cols: usize) -> (Vec<Out>, Vec<f32>) {
    let global = nvfp4_global_scale(amax(w));
    let groups = cols / 16;
    let mut scales = vec![0u8; rows * groups];
    let mut packed = vec![0u8; rows * cols / 2];
    let mut deq = vec![0f32; rows * cols];
    for r in 0..rows {
        for g in 0..groups {
            let at = r * cols + g * 16;
            let (code, q) = nvfp4_group(&w[at..at + 16], global);
            scales[r * groups + g] = code;
            // The twin decodes what was written, with ModelOpt's scale product.
            let s = e4m3_to_f32(code) * global;
            for j in 0..8 {
                packed[at / 2 + j] = q[2 * j] | (q[2 * j + 1] << 4);
            }
            for (d, c) in deq[at..at + 16].iter_mut().zip(q) {
                *d = e2m1_to_f32(c) * s;
            }
        }
    }
    let base = name.trim_end_matches(".weight");
    (
        vec![
            (name.into(), "U8", vec![rows, cols / 2], packed),
            (format!("{base}.weight_scale"), "F8_E4M3", vec![rows, groups], scales),
            (format!("{base}.weight_scale_2"), "F32", vec![], f32s(&[global])),
        ],
        deq,
    )
}

/// gpt-oss MXFP4 for one stacked expert tensor stored `[E, in, out]` (the bf16 layout):
/// blocks `[E, out, in/32, 16]` (value `2j` in the low nibble), scales `[E, out, in/32]`.
/// Returns the outputs and the dequantized values in the source `[E, in, out]` layout.
fn mxfp4(prefix: &str, w: &[f32], e: usize, din: usize, dout: usize) -> (Vec<Out>, Vec<f32>) {
    let nb = din / 32;
    let mut blocks = vec![0u8; e * dout * nb * 16];
    let mut scales = vec![0u8; e * dout * nb];
    let mut deq = vec![0f32; w.len()];
    for x in 0..e {
        for o in 0..dout {
            for b in 0..nb {
                let at = |i: usize| x * din * dout + (b * 32 + i) * dout + o;
                let vals: Vec<f32> = (0..32).map(|i| w[at(i)]).collect();
                let (code, q) = mxfp4_group(&vals);
                let bi = (x * dout + o) * nb + b;
                scales[bi] = code;
                for j in 0..16 {
                    blocks[bi * 16 + j] = q[2 * j] | (q[2 * j + 1] << 4);
                }
                for (i, c) in q.iter().enumerate() {
                    deq[at(i)] = e2m1_to_f32(*c) * e8m0_to_f32(code);
                }
            }
        }
    }
    (
        vec![
            (format!("{prefix}_blocks"), "U8", vec![e, dout, nb, 16], blocks),
            (format!("{prefix}_scales"), "U8", vec![e, dout, nb], scales),
        ],
        deq,
    )
}

/// Writes `tensors` as one safetensors file, streaming: the header is computed from the
/// sizes, then each tensor is produced by `make` and written before the next is made.
fn write_safetensors(path: &Path, plan: &[(String, &'static str, Vec<usize>, usize)], mut make: impl FnMut(usize) -> Result<Vec<u8>, QuantizeError>) -> Result<u64, QuantizeError> {
    let mut header = serde_json::Map::new();
    let mut offset = 0usize;
    for (name, dtype, shape, len) in plan {
        header.insert(name.clone(), json!({"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len]}));
        offset += len;
    }
    let mut text = serde_json::to_vec(&Value::Object(header)).map_err(|e| QuantizeError::Unsupported(e.to_string()))?;
    while text.len() % 8 != 0 {
        text.push(b' ');
    }
    let file = std::fs::File::create(path).map_err(io(path))?;
    let mut out = std::io::BufWriter::new(file);
    out.write_all(&(text.len() as u64).to_le_bytes()).map_err(io(path))?;
    out.write_all(&text).map_err(io(path))?;
    for (i, (name, _, _, len)) in plan.iter().enumerate() {
        let bytes = make(i)?;
        if bytes.len() != *len {
            return Err(QuantizeError::Unsupported(format!("internal: `{name}` produced {} bytes, planned {len}", bytes.len())));
        }
        out.write_all(&bytes).map_err(io(path))?;
    }
    out.flush().map_err(io(path))?;
    Ok((8 + text.len() + offset) as u64)
}

/// Quantizes `opts.model` into `opts.out`; `progress(done, total)` counts source tensors.
pub fn quantize_checkpoint(opts: &QuantizeOptions, mut progress: impl FnMut(usize, usize)) -> Result<QuantizeReport, QuantizeError> {
    let src = &opts.model;
    let config_path = src.join("config.json");
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(&config_path).map_err(io(&config_path))?)
        .map_err(|e| QuantizeError::Unsupported(format!("{}: invalid JSON: {e}", config_path.display())))?;
    if config.get("quantization_config").is_some() {
        return Err(QuantizeError::Unsupported(format!("{} is already quantized", src.display())));
    }
    let model_type = config.get("model_type").and_then(|m| m.as_str()).unwrap_or("").to_string();
    if opts.format == QuantFormat::Fp8Fp4 && model_type != "deepseek_v4" {
        return Err(QuantizeError::Unsupported(format!("fp8-fp4 is DeepSeek-V4's published layout; {} is `{model_type}`: use fp8 or nvfp4", src.display())));
    }
    if opts.format == QuantFormat::Mxfp4 && model_type != "gpt_oss" {
        return Err(QuantizeError::Unsupported(format!(
            "mxfp4 is written in gpt-oss's published layout (its experts only); {} is `{model_type}`: use fp8 or nvfp4",
            src.display()
        )));
    }
    let files = WeightFiles::open(src).map_err(crate::model::ModelError::from)?;
    let mut names: Vec<String> = files.names().map(String::from).collect();
    names.sort();
    let dirs: Vec<&PathBuf> = std::iter::once(&opts.out).chain(opts.twin.as_ref()).collect();
    for dir in &dirs {
        if dir.join("config.json").exists() && !opts.overwrite {
            return Err(QuantizeError::Exists(dir.to_path_buf()));
        }
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        for entry in std::fs::read_dir(dir).map_err(io(dir))?.flatten() {
            let p = entry.path();
            if p.extension().is_some_and(|x| x == "safetensors") || p.file_name().is_some_and(|n| n == "model.safetensors.index.json") {
                std::fs::remove_file(&p).map_err(io(&p))?;
            }
        }
    }
    // One output file per source file, with the same name, so shard layouts carry over.
    let mut by_file: Vec<(PathBuf, Vec<String>)> = files.files().iter().map(|f| (f.clone(), vec![])).collect();
    for n in &names {
        let file = files.get_raw(n).map_err(crate::model::ModelError::from)?.file;
        if let Some(slot) = by_file.iter_mut().find(|(f, _)| *f == file) {
            slot.1.push(n.clone());
        }
    }
    let mut report = QuantizeReport { bytes_in: files.total_bytes(), ..Default::default() };
    let (total, mut done) = (names.len(), 0usize);
    let mut weight_map = serde_json::Map::new();
    let mut twin_map = serde_json::Map::new();
    let mut skipped: Vec<String> = vec![];
    for (file, tensor_names) in &by_file {
        // Each source tensor becomes one or more outputs; the twin keeps the source names.
        let mut outs: Vec<Out> = vec![];
        let mut twins: Vec<Out> = vec![];
        for n in tensor_names {
            let t = files.get_raw(n).map_err(crate::model::ModelError::from)?;
            let shape = t.shape.clone();
            let values = || t.to_f32().unwrap_or_default();
            let quantize = match opts.format {
                QuantFormat::Mxfp4 => (n.ends_with("experts.gate_up_proj") || n.ends_with("experts.down_proj")) && shape.len() == 3 && shape[1] % 32 == 0,
                QuantFormat::Nvfp4 => is_quantized_linear(n, &shape) && shape[1] % 16 == 0,
                QuantFormat::Fp8 => is_quantized_linear(n, &shape),
                QuantFormat::Fp8Fp4 => is_quantized_linear(n, &shape) && !v4_keeps_unquantized(n) && (!is_v4_expert(n) || shape[1] % 32 == 0),
            } && matches!(t.dtype, FileDType::Float(_));
            if !quantize {
                if matches!(t.dtype, FileDType::Float(_)) && t.name.ends_with(".weight") && shape.len() == 2 && t.name.contains(".layers.") {
                    skipped.push(t.name.clone());
                }
                let tag = t.dtype.tag();
                outs.push((n.clone(), tag, shape.clone(), t.bytes.as_slice().to_vec()));
                twins.push((n.clone(), tag, shape, t.bytes.as_slice().to_vec()));
                report.copied += 1;
            } else {
                let (o, deq) = match opts.format {
                    QuantFormat::Fp8 => fp8(n, &values(), shape[0], shape[1]),
                    QuantFormat::Nvfp4 => nvfp4(n, &values(), shape[0], shape[1]),
                    QuantFormat::Mxfp4 => mxfp4(n, &values(), shape[0], shape[1], shape[2]),
                    QuantFormat::Fp8Fp4 if is_v4_expert(n) => fp4_ue8m0(n, &values(), shape[0], shape[1]),
                    QuantFormat::Fp8Fp4 => fp8_ue8m0(n, &values(), shape[0], shape[1]),
                };
                outs.extend(o);
                twins.push((n.clone(), "F32", shape, f32s(&deq)));
                report.quantized += 1;
            }
            done += 1;
            progress(done, total);
        }
        let fname = file.file_name().map(PathBuf::from).unwrap_or_else(|| PathBuf::from("model.safetensors"));
        report.bytes_out += write_file(&opts.out.join(&fname), outs, &mut weight_map)?;
        if let Some(twin) = &opts.twin {
            write_file(&twin.join(&fname), twins, &mut twin_map)?;
        }
    }
    // Side files (tokenizer, templates, generation config) are copied as they are.
    for entry in std::fs::read_dir(src).map_err(io(src))?.flatten() {
        let p = entry.path();
        let name = entry.file_name();
        let skip = p.extension().is_some_and(|x| x == "safetensors") || name == "model.safetensors.index.json" || name == "config.json" || !p.is_file();
        if !skip {
            for dir in &dirs {
                std::fs::copy(&p, dir.join(&name)).map_err(io(&p))?;
            }
        }
    }
    if by_file.len() > 1 {
        let write_index = |dir: &Path, map: serde_json::Map<String, Value>| -> Result<(), QuantizeError> {
            let p = dir.join("model.safetensors.index.json");
            std::fs::write(&p, serde_json::to_vec_pretty(&json!({"metadata": {}, "weight_map": map})).unwrap_or_default()).map_err(io(&p))
        };
        write_index(&opts.out, weight_map)?;
        if let Some(t) = &opts.twin {
            write_index(t, twin_map)?;
        }
    }
    if let Some(t) = &opts.twin {
        let p = t.join("config.json");
        std::fs::write(&p, serde_json::to_vec_pretty(&config).unwrap_or_default()).map_err(io(&p))?;
    }
    let qc = match opts.format {
        QuantFormat::Fp8 => json!({"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128], "modules_to_not_convert": skipped}),
        QuantFormat::Nvfp4 => json!({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "ignore": skipped}),
        QuantFormat::Fp8Fp4 => json!({"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0", "activation_scheme": "dynamic", "weight_block_size": [128, 128], "expert_dtype": "fp4"}),
        QuantFormat::Mxfp4 => json!({"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}),
    };
    if opts.format == QuantFormat::Nvfp4 {
        let p = opts.out.join("hf_quant_config.json");
        let hf = json!({"producer": {"name": "ft-actor"}, "quantization": {"quant_algo": "NVFP4", "group_size": 16, "exclude_modules": skipped}});
        std::fs::write(&p, serde_json::to_vec_pretty(&hf).unwrap_or_default()).map_err(io(&p))?;
    }
    if let Some(obj) = config.as_object_mut() {
        obj.insert("quantization_config".into(), qc);
    }
    let p = opts.out.join("config.json");
    std::fs::write(&p, serde_json::to_vec_pretty(&config).unwrap_or_default()).map_err(io(&p))?;
    Ok(report)
}

/// Writes `tensors` to `path` and records them in an index `weight_map`.
fn write_file(path: &Path, mut tensors: Vec<Out>, map: &mut serde_json::Map<String, Value>) -> Result<u64, QuantizeError> {
    let fname = path.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
    let plan: Vec<_> = tensors.iter().map(|(n, d, s, b)| (n.clone(), *d, s.clone(), b.len())).collect();
    for (n, ..) in &plan {
        map.insert(n.clone(), json!(fname));
    }
    write_safetensors(path, &plan, |i| Ok(std::mem::take(&mut tensors[i].3)))
}
