//! Tensors llama.cpp's converter can fuse (`--fuse-gate-up-exps`, `--fuse-qkv`), split back
//! into the per-part views the unfused name tables give. The parts are whole rows, so packed
//! blocks split without decoding; the views point into the mapped file.

use super::load::{file_dtype, format_err, row_bytes, unpermute_rows, unreadable, GgufModel};
use super::GgufTensor;
use crate::model::arch;
use crate::model::config::LayerKind;
use crate::model::weights_file::ExternalTensor;
use crate::model::ModelError;

/// `blk.N.ffn_gate_up_exps [E, 2I, H]`: each expert's `I` gate rows then its `I` up rows
/// (`torch.cat([gate, up], dim=1)`); llama.cpp reads it for DeepSeek-V2/V3, Qwen3-Next and
/// Qwen3.5-MoE.
const GATE_UP: &str = "ffn_gate_up_exps.weight";
/// `blk.N.attn_qkv.{weight,bias}`: the query, key and value rows one after another
/// (`torch.cat([q, k, v], dim=0)`, after llama's query/key row permutation); read for most
/// families.
const QKV: &str = "attn_qkv.";

/// The parts of `name` if it is a fused tensor, `None` if it is not one.
pub(super) fn split(m: &GgufModel, name: &str, file_index: &dyn Fn(&GgufTensor) -> usize) -> Result<Option<Vec<ExternalTensor>>, ModelError> {
    if let Some(blk) = name.strip_suffix(GATE_UP) {
        return gate_up(m, name, blk, file_index).map(Some);
    }
    if let Some((blk, suffix)) = name.split_once(QKV).filter(|(b, _)| b.starts_with("blk.")) {
        // Qwen3-Next's and Qwen3.5's DeltaNet layers call their own projection `attn_qkv`
        // (the family's hook reads it); only full-attention layers hold a fused q/k/v.
        let layer = blk.trim_start_matches("blk.").trim_end_matches('.').parse::<usize>().ok();
        let linear = layer.and_then(|l| m.config.layer_kinds.get(l)).is_some_and(|k| *k == LayerKind::LinearAttention);
        if linear {
            return Ok(None);
        }
        return qkv(m, name, blk, suffix, file_index).map(Some);
    }
    Ok(None)
}

/// The unfused tensor `unfused` under its Hugging Face name, if the family has it.
fn hf(m: &GgufModel, unfused: &str) -> Option<String> {
    arch::hf_name(m.spec, unfused).map(|(h, _)| h)
}

fn gate_up(m: &GgufModel, name: &str, blk: &str, file_index: &dyn Fn(&GgufTensor) -> usize) -> Result<Vec<ExternalTensor>, ModelError> {
    let (Some(gate), Some(up)) = (hf(m, &format!("{blk}ffn_gate_exps.weight")), hf(m, &format!("{blk}ffn_up_exps.weight"))) else {
        tracing::debug!(tensor = name, "GGUF tensor not used by this architecture");
        return Ok(vec![]);
    };
    let t = m.file.tensor(name)?;
    let file = file_index(&t);
    let shape: Vec<usize> = t.dims.iter().rev().copied().collect();
    let [n, rows2, cols] = *shape.as_slice() else {
        return Err(format_err(&t, format!("a fused gate/up expert tensor must have 3 dimensions, found {shape:?}")));
    };
    if rows2 % 2 != 0 {
        return Err(format_err(&t, format!("{rows2} rows do not split into equal gate and up halves")));
    }
    let rows = rows2 / 2;
    let dtype = match file_dtype(t.ggml_type) {
        Ok(d) => d,
        Err(kind) => {
            let msg = format!("tensor `{name}` in {} is {kind}", t.file.display());
            let mut v = unreadable(gate, file, vec![n, rows, cols], t.bytes.clone(), &msg, true);
            v.extend(unreadable(up, file, vec![n, rows, cols], t.bytes.clone(), &msg, true));
            return Ok(v);
        }
    };
    let half = rows * row_bytes(dtype, cols);
    if 2 * half * n != t.bytes.len() {
        return Err(format_err(&t, format!("{} bytes for {n} experts of {rows2}×{cols} {dtype}", t.bytes.len())));
    }
    let mut out = Vec::with_capacity(2 * n);
    for e in 0..n {
        for (i, hf) in [&gate, &up].into_iter().enumerate() {
            let bytes = t.bytes.slice((2 * e + i) * half, half).ok_or_else(|| format_err(&t, format!("expert {e} lies outside the tensor")))?;
            out.push(ExternalTensor { name: hf.replace("{e}", &e.to_string()), file, dtype: Ok(dtype), shape: vec![rows, cols], bytes });
        }
    }
    Ok(out)
}

/// `attn_qkv`: key and value rows are `num_kv_heads · head_dim` each, the query takes the
/// rest (with Qwen3-Next's output gate, twice the heads' width).
fn qkv(m: &GgufModel, name: &str, blk: &str, suffix: &str, file_index: &dyn Fn(&GgufTensor) -> usize) -> Result<Vec<ExternalTensor>, ModelError> {
    let [q, k, v] = ["q", "k", "v"].map(|p| hf(m, &format!("{blk}attn_{p}.{suffix}")));
    let (Some(q), Some(k), Some(v)) = (q, k, v) else {
        tracing::debug!(tensor = name, "GGUF tensor not used by this architecture");
        return Ok(vec![]);
    };
    let t = m.file.tensor(name)?;
    let file = file_index(&t);
    let shape: Vec<usize> = t.dims.iter().rev().copied().collect();
    let kv = m.config.num_kv_heads * m.config.head_dim;
    let (rows, cols) = match *shape.as_slice() {
        [rows, cols] => (rows, Some(cols)),
        [rows] => (rows, None),
        _ => return Err(format_err(&t, format!("a fused q/k/v tensor must have 1 or 2 dimensions, found {shape:?}"))),
    };
    if rows <= 2 * kv {
        return Err(format_err(&t, format!("{rows} rows cannot hold the query and two {kv}-row key/value parts")));
    }
    let parts = [(q, rows - 2 * kv, m.config.num_heads), (k, kv, m.config.num_kv_heads), (v, kv, 0)];
    let part_shape = |r: usize| cols.map_or(vec![r], |c| vec![r, c]);
    let dtype = match file_dtype(t.ggml_type) {
        Ok(d) => d,
        Err(kind) => {
            let msg = format!("tensor `{name}` in {} is {kind}", t.file.display());
            return Ok(parts.into_iter().flat_map(|(hf, r, _)| unreadable(hf, file, part_shape(r), t.bytes.clone(), &msg, false)).collect());
        }
    };
    let rb = row_bytes(dtype, cols.unwrap_or(1));
    if rows * rb != t.bytes.len() {
        return Err(format_err(&t, format!("{} bytes for {rows} rows of {dtype}", t.bytes.len())));
    }
    let mut out = Vec::with_capacity(3);
    let mut at = 0;
    for (hf, r, heads) in parts {
        let bytes = t.bytes.slice(at * rb, r * rb).ok_or_else(|| format_err(&t, "a part lies outside the tensor".into()))?;
        at += r;
        // llama's query and key rows are permuted for its RoPE before the fusion (weights only).
        let bytes = match cols {
            Some(c) if m.spec.permuted_qk && heads > 0 => unpermute_rows(&t, bytes.as_slice(), dtype, &[r, c], heads)?,
            _ => bytes,
        };
        out.push(ExternalTensor { name: hf, file, dtype: Ok(dtype), shape: part_shape(r), bytes });
    }
    Ok(out)
}
