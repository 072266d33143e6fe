//! Qwen3-Next (`qwen3_next`; GGUF `qwen3next`) and Qwen3.5/3.6-MoE (`qwen3_5_moe`; GGUF
//! `qwen35moe`): Gated DeltaNet layers between gated full-attention layers, and MoE with a
//! sigmoid-gated shared expert.
//!
//! llama.cpp's converter (`Qwen3NextModel`; Qwen3.5 through `_LinearAttentionVReorderBase` on
//! top of it) stores several tensors in another form than the checkpoint; the `extra` hook
//! turns them back:
//! - every RMSNorm weight but the DeltaNet's gated `linear_attn.norm` as `1 + w`, since
//!   llama.cpp multiplies by the weight where the checkpoints multiply by `1 + w`;
//! - `A_log` as `ssm_a = -exp(A_log)`, `dt_bias` as `ssm_dt.bias`, and `conv1d [C, 1, K]`
//!   squeezed to `ssm_conv1d [C, K]`;
//! - Qwen3-Next's `in_proj_qkvz`, grouped per key head (`[q | k | v·r | z·r]`, r = Hv/Hk), as
//!   `attn_qkv` (all q, all k, all v: Qwen3.5's `in_proj_qkv` order) plus `attn_gate` (z);
//!   files from before that split hold the same rows in one `ssm_in`. `in_proj_ba` stays
//!   grouped (`[b·r | a·r]` per key head) as `ssm_ba`, split here into `in_proj_b`/`in_proj_a`;
//! - Qwen3.5's `in_proj_qkv/z/b/a` as `attn_qkv`, `attn_gate`, `ssm_beta`, `ssm_alpha`. With
//!   more value than key heads, every per-value-head tensor (the v rows of `attn_qkv` and of the
//!   convolution, z, b, a, `A_log`, `dt_bias` and the columns of `out_proj`) is reordered from
//!   grouped heads (`g·r + j`) to tiled ones (`j·Hk + g`) for ggml's broadcast; the grouped
//!   order is restored. Whole rows move in any block type; `out_proj`'s columns move as whole
//!   blocks when a head spans whole blocks, else the matrix is decoded to f32.
//!
//! `q_proj` (query and output gate per head) and the experts are stored as the checkpoint has
//! them; the second norm is `post_attention_norm`. The layer pattern is
//! `attention.recurrent_layers` where a file lists it, else `full_attention_interval` (every
//! n-th layer is full attention, 4 without the key, as in llama.cpp); the DeltaNet sizes are
//! the `ssm.*` keys and the rotated part of each head is `rope.dimension_count`.

use super::deepseek2::{decoder_layers, values};
use super::qwen3_moe::EXPERTS;
use super::{ArchSpec, GgufKeys, TensorPair, ATTN_PROJ, QKV_BIAS};
use crate::model::config::{Arch, ConfigError, LayerKind, LinearAttnConfig};
use crate::model::gguf::load::{file_dtype, format_err, row_bytes, GgufModel};
use crate::model::gguf::{GgufTensor, MetaValue};
use crate::model::weights_file::{ExternalTensor, FileDType};
use crate::model::ModelError;
use ft_backend::{DType, HostBytes};
use serde_json::{json, Map, Value};

/// Tensors both families store as their checkpoints do, beside the attention projections
/// ([`ATTN_PROJ`], [`QKV_BIAS`]). Norms and DeltaNet projections are left to the `extra` hook.
const TENSORS: &[TensorPair] = &[
    ("token_embd.weight", "model.embed_tokens.weight"),
    ("output.weight", "lm_head.weight"),
    ("blk.{i}.ssm_norm.weight", "model.layers.{i}.linear_attn.norm.weight"),
    ("blk.{i}.ffn_gate_inp.weight", "model.layers.{i}.mlp.gate.weight"),
    ("blk.{i}.ffn_gate_inp_shexp.weight", "model.layers.{i}.mlp.shared_expert_gate.weight"),
    ("blk.{i}.ffn_gate_shexp.weight", "model.layers.{i}.mlp.shared_expert.gate_proj.weight"),
    ("blk.{i}.ffn_up_shexp.weight", "model.layers.{i}.mlp.shared_expert.up_proj.weight"),
    ("blk.{i}.ffn_down_shexp.weight", "model.layers.{i}.mlp.shared_expert.down_proj.weight"),
    ("blk.{i}.ffn_gate.weight", "model.layers.{i}.mlp.gate_proj.weight"),
    ("blk.{i}.ffn_up.weight", "model.layers.{i}.mlp.up_proj.weight"),
    ("blk.{i}.ffn_down.weight", "model.layers.{i}.mlp.down_proj.weight"),
];

/// Qwen3-Next as llama.cpp converts it.
pub const QWEN3_NEXT: ArchSpec =
    ArchSpec { arch: Arch::Qwen3Next, hf: super::qwen2_moe::QWEN_SHARED, gguf: "qwen3next", model_type: "qwen3_next", tensors: &[ATTN_PROJ, QKV_BIAS, TENSORS], experts: EXPERTS, permuted_qk: false, config, extra: Some(extra) };

/// Qwen3.5/3.6-MoE (text) as llama.cpp converts it.
pub const QWEN35_MOE: ArchSpec =
    ArchSpec { arch: Arch::Qwen35Moe, hf: super::qwen2_moe::QWEN_SHARED, gguf: "qwen35moe", model_type: "qwen3_5_moe", tensors: &[ATTN_PROJ, QKV_BIAS, TENSORS], experts: EXPERTS, permuted_qk: false, config, extra: Some(extra) };

/// llama.cpp's layer pattern without `full_attention_interval`.
const DEFAULT_INTERVAL: usize = 4;

fn config(k: &GgufKeys, c: &mut Map<String, Value>) -> Result<(), ConfigError> {
    // Qwen3.5 files count their MTP layers in block_count.
    let layers = decoder_layers(k, c)?;
    let heads = k.usize("attention.head_count")?;
    let head_dim = match k.usize_opt("attention.key_length")? {
        Some(d) => d,
        None => k.usize("embedding_length")? / heads.max(1),
    };
    c.insert("head_dim".into(), json!(head_dim));
    // Without the key llama.cpp rotates the whole head.
    let rot = k.usize_opt("rope.dimension_count")?.unwrap_or(head_dim);
    if rot == 0 || rot > head_dim || rot % 2 != 0 {
        return Err(k.invalid(&k.full("rope.dimension_count"), format!("({rot}) must be even and in 2..={head_dim} (the head size)")));
    }
    c.insert("partial_rotary_factor".into(), json!(rot as f64 / head_dim as f64));

    let types: Vec<&str> = recurrent_layers(k, layers)?.into_iter().map(|r| if r { "linear_attention" } else { "full_attention" }).collect();
    c.insert("layer_types".into(), json!(types));

    let v_heads = k.usize("ssm.time_step_rank")?;
    let inner = k.usize("ssm.inner_size")?;
    if v_heads == 0 || inner % v_heads != 0 {
        return Err(k.invalid(&k.full("ssm.inner_size"), format!("({inner}) must be a multiple of ssm.time_step_rank ({v_heads}), the value heads")));
    }
    c.insert("linear_num_key_heads".into(), json!(k.usize("ssm.group_count")?));
    c.insert("linear_num_value_heads".into(), json!(v_heads));
    c.insert("linear_key_head_dim".into(), json!(k.usize("ssm.state_size")?));
    c.insert("linear_value_head_dim".into(), json!(inner / v_heads));
    c.insert("linear_conv_kernel_dim".into(), json!(k.usize("ssm.conv_kernel")?));

    match k.usize_opt("expert_shared_feed_forward_length")? {
        Some(n) => {
            c.insert("shared_expert_intermediate_size".into(), json!(n));
        }
        // Without the size the shared expert would silently be left out.
        None if (0..layers).any(|i| k.has(&format!("blk.{i}.ffn_up_shexp.weight"))) => {
            return Err(ConfigError::Missing { path: k.path.into(), key: k.full("expert_shared_feed_forward_length") });
        }
        None => {}
    }
    // llama.cpp always renormalises these families' top-k weights.
    c.insert("norm_topk_prob".into(), json!(k.bool_opt("expert_weights_norm")?.unwrap_or(true)));
    c.insert("attention_bias".into(), json!((0..layers).any(|i| k.has_qkv_bias(i))));
    if !c.contains_key("intermediate_size") {
        let dense = c.get("mlp_only_layers").and_then(Value::as_array).is_some_and(|a| !a.is_empty());
        if dense {
            return Err(ConfigError::Missing { path: k.path.into(), key: k.full("feed_forward_length") });
        }
        // Only dense layers use it, and there are none.
        c.insert("intermediate_size".into(), json!(0));
    }
    Ok(())
}

/// Which decoder layers are DeltaNet layers: newer llama.cpp files may list them
/// (`attention.recurrent_layers`, one flag per block or one for all, as llama.cpp's
/// `get_key_or_arr` reads it), else every `full_attention_interval`-th layer is full attention.
fn recurrent_layers(k: &GgufKeys, layers: usize) -> Result<Vec<bool>, ConfigError> {
    let key = k.full("attention.recurrent_layers");
    let flag = |v: &MetaValue| v.as_bool().or_else(|| v.as_u64().map(|n| n != 0));
    match k.meta.get(&key) {
        Some(MetaValue::Array(a)) => {
            // The list covers the MTP blocks after the decoder layers too.
            let flags: Option<Vec<bool>> = a.iter().map(flag).collect();
            match flags {
                Some(f) if f.len() >= layers => Ok(f[..layers].to_vec()),
                Some(f) => Err(k.invalid(&key, format!("lists {} layers, the model has {layers}", f.len()))),
                None => Err(k.invalid(&key, "must hold booleans or integers".into())),
            }
        }
        Some(v) => match flag(v) {
            Some(r) => Ok(vec![r; layers]),
            None => Err(k.invalid(&key, format!("must be a boolean or per-layer flags, found {}", v.type_name()))),
        },
        None => {
            let interval = k.usize_opt("full_attention_interval")?.unwrap_or(DEFAULT_INTERVAL);
            if interval == 0 {
                return Err(k.invalid(&k.full("full_attention_interval"), "must be at least 1".into()));
            }
            Ok((0..layers).map(|i| (i + 1) % interval != 0).collect())
        }
    }
}

/// Where the checkpoint's (grouped) value heads are in the file.
#[derive(Clone, Copy, Debug)]
struct VHeads {
    k_heads: usize,
    per_k: usize,
    tiled: bool,
}

impl VHeads {
    fn new(l: &LinearAttnConfig, arch: Arch) -> VHeads {
        let per_k = l.num_v_heads / l.num_k_heads.max(1);
        VHeads { k_heads: l.num_k_heads, per_k, tiled: arch == Arch::Qwen35Moe && per_k > 1 }
    }

    /// The file's head holding value head `h` (`g·r + j`); tiled files put it at `j·Hk + g`.
    fn file_head(self, h: usize) -> usize {
        if self.tiled {
            (h % self.per_k) * self.k_heads + h / self.per_k
        } else {
            h
        }
    }

    /// The file row of checkpoint row `row`, where rows from `base` on are value heads of
    /// `unit` rows each.
    fn file_row(self, row: usize, base: usize, unit: usize) -> usize {
        match row.checked_sub(base) {
            Some(x) => base + self.file_head(x / unit) * unit + x % unit,
            None => row,
        }
    }
}

/// The norms without llama.cpp's `+1`, the DeltaNet tensors in the checkpoint's form.
fn extra(m: &GgufModel) -> Result<Vec<ExternalTensor>, ModelError> {
    let cfg = &m.config;
    let mut out = vec![unit_offset(m, "output_norm.weight", "model.norm.weight")?];
    for (i, kind) in cfg.layer_kinds.iter().enumerate() {
        let (g, hf) = (|s: &str| format!("blk.{i}.{s}"), |s: &str| format!("model.layers.{i}.{s}"));
        out.push(unit_offset(m, &g("attn_norm.weight"), &hf("input_layernorm.weight"))?);
        out.push(unit_offset(m, &g("post_attention_norm.weight"), &hf("post_attention_layernorm.weight"))?);
        match (kind, cfg.linear_attn) {
            (LayerKind::LinearAttention, Some(l)) => out.extend(delta_net(m, i, &l)?),
            (LayerKind::LinearAttention, None) => return Err(ModelError::Invalid("linear-attention layer without its settings".into())),
            _ => {
                out.push(unit_offset(m, &g("attn_q_norm.weight"), &hf("self_attn.q_norm.weight"))?);
                out.push(unit_offset(m, &g("attn_k_norm.weight"), &hf("self_attn.k_norm.weight"))?);
            }
        }
    }
    Ok(out)
}

/// Layer `i`'s DeltaNet tensors under `linear_attn.*`.
fn delta_net(m: &GgufModel, i: usize, l: &LinearAttnConfig) -> Result<Vec<ExternalTensor>, ModelError> {
    let h = m.config.hidden_size;
    let v = VHeads::new(l, m.config.arch);
    let (hv, dv, qk_rows) = (l.num_v_heads, l.v_head_dim, 2 * l.num_k_heads * l.k_head_dim);
    let g = |s: &str| format!("blk.{i}.{s}");
    let hf = |s: &str| format!("model.layers.{i}.linear_attn.{s}");
    let mut out = vec![];

    if !m.file.contains(&g("attn_qkv.weight")) && m.file.contains(&g("ssm_in.weight")) {
        // Before the split: q, k, v and z rows in one matrix, in the checkpoint's head order.
        let t = m.file.tensor(&g("ssm_in.weight"))?;
        let (dtype, rb) = checked_rows(&t, &[l.conv_dim() + l.value_dim(), h])?;
        let part = |first: usize, rows: usize| t.bytes.slice(first * rb, rows * rb).ok_or_else(|| format_err(&t, "shorter than its shape".into()));
        out.push(entry(m, &t, hf("in_proj_qkv.weight"), dtype, vec![l.conv_dim(), h], part(0, l.conv_dim())?));
        out.push(entry(m, &t, hf("in_proj_z.weight"), dtype, vec![l.value_dim(), h], part(l.conv_dim(), l.value_dim())?));
    } else {
        let t = m.file.tensor(&g("attn_qkv.weight"))?;
        let (dtype, bytes) = gather_rows(&t, &[l.conv_dim(), h], |r| v.file_row(r, qk_rows, dv))?;
        out.push(entry(m, &t, hf("in_proj_qkv.weight"), dtype, vec![l.conv_dim(), h], bytes));
        let t = m.file.tensor(&g("attn_gate.weight"))?;
        let (dtype, bytes) = gather_rows(&t, &[l.value_dim(), h], |r| v.file_row(r, 0, dv))?;
        out.push(entry(m, &t, hf("in_proj_z.weight"), dtype, vec![l.value_dim(), h], bytes));
    }

    if m.file.contains(&g("ssm_ba.weight")) {
        // Per key head: r beta rows, then r alpha rows.
        let t = m.file.tensor(&g("ssm_ba.weight"))?;
        let r = v.per_k;
        let (dtype, rb) = checked_rows(&t, &[2 * hv, h])?;
        for (name, skip) in [("in_proj_b.weight", 0), ("in_proj_a.weight", r)] {
            let bytes = pick_rows(&t, rb, hv, |x| x / r * 2 * r + skip + x % r)?;
            out.push(entry(m, &t, hf(name), dtype, vec![hv, h], bytes));
        }
    } else {
        for (file, name) in [("ssm_beta.weight", "in_proj_b.weight"), ("ssm_alpha.weight", "in_proj_a.weight")] {
            let t = m.file.tensor(&g(file))?;
            let (dtype, bytes) = gather_rows(&t, &[hv, h], |r| v.file_head(r))?;
            out.push(entry(m, &t, hf(name), dtype, vec![hv, h], bytes));
        }
    }

    let t = m.file.tensor(&g("ssm_a"))?;
    let a = values(&t, &[hv])?;
    let mut a_log = Vec::with_capacity(hv);
    for head in 0..hv {
        let x = a[v.file_head(head)];
        // -exp(A_log) is never positive.
        if x.is_nan() || x > 0.0 {
            return Err(format_err(&t, format!("holds {x}, but llama.cpp stores -exp(A_log), which is negative")));
        }
        a_log.push((-x).ln());
    }
    out.push(owned_f32(m, &t, hf("A_log"), &a_log));

    let t = m.file.tensor(&g("ssm_dt.bias"))?;
    let (dtype, bytes) = gather_rows(&t, &[hv], |r| v.file_head(r))?;
    out.push(entry(m, &t, hf("dt_bias"), dtype, vec![hv], bytes));

    let t = m.file.tensor(&g("ssm_conv1d.weight"))?;
    let (dtype, bytes) = gather_rows(&t, &[l.conv_dim(), l.conv_kernel], |r| v.file_row(r, qk_rows, dv))?;
    out.push(entry(m, &t, hf("conv1d.weight"), dtype, vec![l.conv_dim(), 1, l.conv_kernel], bytes));

    let t = m.file.tensor(&g("ssm_out.weight"))?;
    let (dtype, bytes) = gather_cols(&t, h, hv, dv, |c| v.file_head(c))?;
    out.push(entry(m, &t, hf("out_proj.weight"), dtype, vec![h, l.value_dim()], bytes));
    Ok(out)
}

/// A norm weight `1 + w` of the file as the checkpoint's `w`, in f32.
fn unit_offset(m: &GgufModel, name: &str, hf: &str) -> Result<ExternalTensor, ModelError> {
    let t = m.file.tensor(name)?;
    let n = t.dims.iter().product();
    let w: Vec<f32> = values(&t, &[n])?.into_iter().map(|x| x - 1.0).collect();
    Ok(owned_f32(m, &t, hf.into(), &w))
}

fn owned_f32(m: &GgufModel, t: &GgufTensor, name: String, v: &[f32]) -> ExternalTensor {
    let len = v.len();
    entry(m, t, name, FileDType::Float(DType::F32), vec![len], HostBytes::from_vec(bytemuck::cast_slice(v).to_vec()))
}

fn entry(m: &GgufModel, t: &GgufTensor, name: String, dtype: FileDType, shape: Vec<usize>, bytes: HostBytes) -> ExternalTensor {
    ExternalTensor { name, file: m.file_index(t), dtype: Ok(dtype), shape, bytes }
}

/// `t`'s element type and bytes per row, once its shape (outermost first; a vector is rows of
/// one value) and size are checked against the config's.
fn checked_rows(t: &GgufTensor, shape: &[usize]) -> Result<(FileDType, usize), ModelError> {
    let dtype = file_dtype(t.ggml_type).map_err(|kind| format_err(t, format!("is {kind}")))?;
    if !t.dims.iter().rev().eq(shape.iter()) {
        let found: Vec<usize> = t.dims.iter().rev().copied().collect();
        return Err(format_err(t, format!("expected shape {shape:?} from the model's config, found {found:?}")));
    }
    let (rows, cols) = match shape {
        [n] => (*n, 1),
        [outer @ .., cols] => (outer.iter().product(), *cols),
        [] => (0, 0),
    };
    let rb = row_bytes(dtype, cols);
    if t.bytes.len() != rows * rb {
        return Err(format_err(t, format!("{} bytes for {rows}×{cols} {dtype}", t.bytes.len())));
    }
    Ok((dtype, rb))
}

/// `t` with its rows reordered: row `r` comes from the file's row `src(r)`. Whole rows move,
/// so any block type is reordered without decoding; in order, the file's bytes are viewed.
fn gather_rows(t: &GgufTensor, shape: &[usize], src: impl Fn(usize) -> usize) -> Result<(FileDType, HostBytes), ModelError> {
    let (dtype, rb) = checked_rows(t, shape)?;
    let rows = if rb == 0 { 0 } else { t.bytes.len() / rb };
    Ok((dtype, pick_rows(t, rb, rows, src)?))
}

/// `count` rows of `rb` bytes, row `r` from the file's row `src(r)`; the file's bytes viewed
/// when that is all of them in order.
fn pick_rows(t: &GgufTensor, rb: usize, count: usize, src: impl Fn(usize) -> usize) -> Result<HostBytes, ModelError> {
    let from = t.bytes.as_slice();
    if count * rb == from.len() && (0..count).all(|r| src(r) == r) {
        return Ok(t.bytes.clone());
    }
    let mut out = Vec::with_capacity(count * rb);
    for r in 0..count {
        let s = src(r);
        let row = from.get(s * rb..(s + 1) * rb).ok_or_else(|| format_err(t, format!("row {s} lies outside the tensor")))?;
        out.extend_from_slice(row);
    }
    Ok(HostBytes::from_vec(out))
}

/// `t` (`[rows, heads·unit]`) with its columns reordered per head: head `c` comes from the
/// file's head `src(c)`. Block types move whole blocks when a head spans whole blocks;
/// otherwise the matrix is decoded to f32.
fn gather_cols(t: &GgufTensor, rows: usize, heads: usize, unit: usize, src: impl Fn(usize) -> usize) -> Result<(FileDType, HostBytes), ModelError> {
    let cols = heads * unit;
    let (dtype, rb) = checked_rows(t, &[rows, cols])?;
    if (0..heads).all(|c| src(c) == c) {
        return Ok((dtype, t.bytes.clone()));
    }
    let chunk = match dtype {
        FileDType::Packed(d) if unit % d.block_elems() == 0 => unit / d.block_elems() * d.size(),
        FileDType::Packed(_) => {
            let x = values(t, &[rows, cols])?;
            let mut out = Vec::with_capacity(x.len());
            for row in x.chunks_exact(cols) {
                for c in 0..heads {
                    let s = src(c) * unit;
                    out.extend_from_slice(row.get(s..s + unit).ok_or_else(|| format_err(t, format!("head {} lies outside the row", src(c))))?);
                }
            }
            return Ok((FileDType::Float(DType::F32), HostBytes::from_vec(bytemuck::cast_slice(&out).to_vec())));
        }
        other => unit * other.size(),
    };
    let mut out = Vec::with_capacity(t.bytes.len());
    for row in t.bytes.as_slice().chunks_exact(rb) {
        for c in 0..heads {
            let s = src(c) * chunk;
            out.extend_from_slice(row.get(s..s + chunk).ok_or_else(|| format_err(t, format!("head {} lies outside the row", src(c))))?);
        }
    }
    Ok((dtype, HostBytes::from_vec(out)))
}

#[cfg(test)]
#[path = "qwen3_next_tests.rs"]
mod tests;
