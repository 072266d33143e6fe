//! Loading a DeepSeek-V4 checkpoint in the published tensor naming (`embed`, `layers.{i}.attn.*`,
//! `layers.{i}.ffn.*`, `hc_*`, `head`), which transformers' converter renames only.

use super::hyper::{HyperConnection, HyperHead};
use super::{Compressor, Indexer, V4Layer};
use crate::model::config::{ModelConfig, V4Attention, V4Config};
use crate::model::embedding::Embedding;
use crate::model::routing::RouterParams;
use crate::model::weights::{FeedForward, LayerWeights, Linear, Loader, Mixer, Mlp, MoeWeights};
use crate::model::weights_file::FileDType;
use crate::model::ModelError;
use ft_backend::DeviceBuffer;

/// Everything outside the layers plus the layers, in the order `Model` keeps them.
pub struct V4Parts {
    /// `embed.weight`.
    pub embed: Embedding,
    /// The decoder layers.
    pub layers: Vec<LayerWeights>,
    /// `norm.weight`.
    pub final_norm: DeviceBuffer,
    /// `head.weight`.
    pub lm_head: Linear,
    /// `hc_head_*`.
    pub hc_head: HyperHead,
}

fn v4_of(cfg: &ModelConfig) -> Result<&V4Config, ModelError> {
    cfg.v4.as_ref().ok_or_else(|| ModelError::Invalid("DeepSeek-V4 model without its settings".into()))
}

/// Loads a whole DeepSeek-V4 checkpoint.
pub fn load_top(loader: &mut Loader<'_>, cfg: &ModelConfig) -> Result<V4Parts, ModelError> {
    let v4 = v4_of(cfg)?;
    let (h, v, hc) = (cfg.hidden_size, cfg.vocab_size, v4.hc_mult);
    let embed = loader.embedding("embed.weight", v, h)?;
    let layers = (0..cfg.num_layers).map(|i| layer(loader, cfg, v4, i)).collect::<Result<Vec<_>, _>>()?;
    let final_norm = loader.vector("norm.weight", h)?;
    let lm_head = loader.linear("head", v, h, false)?;
    let hc_head = HyperHead {
        fn_w: host(loader, "hc_head_fn", &[hc, hc * h])?,
        base: host(loader, "hc_head_base", &[hc])?,
        scale: host(loader, "hc_head_scale", &[1])?[0],
    };
    Ok(V4Parts { embed, layers, final_norm, lm_head, hc_head })
}

fn host(loader: &mut Loader<'_>, name: &str, shape: &[usize]) -> Result<Vec<f32>, ModelError> {
    Ok(loader.tensor(name, shape)?.to_f32())
}

fn hyper(loader: &mut Loader<'_>, p: &str, hc: usize, h: usize) -> Result<HyperConnection, ModelError> {
    let n = (2 + hc) * hc;
    let scale = host(loader, &format!("{p}_scale"), &[3])?;
    Ok(HyperConnection {
        fn_w: host(loader, &format!("{p}_fn"), &[n, hc * h])?,
        base: host(loader, &format!("{p}_base"), &[n])?,
        scale: [scale[0], scale[1], scale[2]],
    })
}

fn load_compressor(loader: &mut Loader<'_>, p: &str, h: usize, dim: usize, rate: usize, overlap: bool) -> Result<Compressor, ModelError> {
    let width = if overlap { 2 * dim } else { dim };
    Ok(Compressor {
        kv: loader.linear(&format!("{p}.wkv"), width, h, false)?,
        gate: loader.linear(&format!("{p}.wgate"), width, h, false)?,
        bias: host(loader, &format!("{p}.ape"), &[rate, width])?,
        norm: host(loader, &format!("{p}.norm.weight"), &[dim])?,
        dim,
        rate,
        overlap,
    })
}

/// `tid2eid [vocab, top_k]`, integer ids checked against the expert count.
fn hash_table(loader: &mut Loader<'_>, name: &str, cfg: &ModelConfig) -> Result<Vec<u32>, ModelError> {
    (loader.on_tensor)(name);
    let t = loader.files.get_raw(name)?;
    let want = [cfg.vocab_size, cfg.top_k];
    if t.shape != want {
        return Err(crate::model::load::shape_error(name, &t.shape, want.to_vec()));
    }
    let b = t.bytes.as_slice();
    let ids: Vec<i64> = match t.dtype {
        FileDType::I64 => b.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect(),
        FileDType::I32 => b.chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().unwrap_or([0; 4])) as i64).collect(),
        other => return Err(ModelError::Invalid(format!("`{name}` is {other}; a hash table must hold I64 or I32 expert ids"))),
    };
    ids.iter()
        .map(|&e| {
            u32::try_from(e)
                .ok()
                .filter(|&e| (e as usize) < cfg.num_experts)
                .ok_or_else(|| ModelError::Invalid(format!("`{name}` names expert {e}, the layer has {}", cfg.num_experts)))
        })
        .collect()
}

fn layer(loader: &mut Loader<'_>, cfg: &ModelConfig, v4: &V4Config, i: usize) -> Result<LayerWeights, ModelError> {
    let (h, nh, hd) = (cfg.hidden_size, cfg.num_heads, cfg.head_dim);
    let p = format!("layers.{i}");
    let a = format!("{p}.attn");
    let kind = v4.attention[i];
    let q_lora = v4.q_lora_rank;
    let group_in = nh * hd / v4.o_groups;
    let compressor = match kind {
        V4Attention::Sliding => None,
        V4Attention::CompressedSparse => Some(load_compressor(loader, &format!("{a}.compressor"), h, hd, v4.csa_rate, true)?),
        V4Attention::HeavilyCompressed => Some(load_compressor(loader, &format!("{a}.compressor"), h, hd, v4.hca_rate, false)?),
    };
    let indexer = match kind {
        V4Attention::CompressedSparse => Some(Indexer {
            compressor: load_compressor(loader, &format!("{a}.indexer.compressor"), h, v4.index_head_dim, v4.csa_rate, true)?,
            q_b: loader.linear(&format!("{a}.indexer.wq_b"), v4.index_heads * v4.index_head_dim, q_lora, false)?,
            weights: loader.linear(&format!("{a}.indexer.weights_proj"), v4.index_heads, h, false)?,
        }),
        _ => None,
    };
    let attn_norm = host(loader, &format!("{p}.attn_norm.weight"), &[h])?;
    let ffn_norm = host(loader, &format!("{p}.ffn_norm.weight"), &[h])?;
    let hashed = v4.hash_routed[i];
    let mixer = V4Layer {
        kind,
        q_a: loader.linear(&format!("{a}.wq_a"), q_lora, h, false)?,
        q_a_norm: host(loader, &format!("{a}.q_norm.weight"), &[q_lora])?,
        q_b: loader.linear(&format!("{a}.wq_b"), nh * hd, q_lora, false)?,
        kv: loader.linear(&format!("{a}.wkv"), hd, h, false)?,
        kv_norm: host(loader, &format!("{a}.kv_norm.weight"), &[hd])?,
        o_a: loader.linear(&format!("{a}.wo_a"), v4.o_groups * v4.o_lora_rank, group_in, false)?,
        o_b: loader.linear(&format!("{a}.wo_b"), h, v4.o_groups * v4.o_lora_rank, false)?,
        sinks: host(loader, &format!("{a}.attn_sink"), &[nh])?,
        compressor,
        indexer,
        attn_hc: hyper(loader, &format!("{p}.hc_attn"), v4.hc_mult, h)?,
        ffn_hc: hyper(loader, &format!("{p}.hc_ffn"), v4.hc_mult, h)?,
        attn_norm: attn_norm.clone(),
        ffn_norm: ffn_norm.clone(),
        tid2eid: if hashed { Some(hash_table(loader, &format!("{p}.ffn.gate.tid2eid"), cfg)?) } else { None },
    };
    let f = format!("{p}.ffn");
    let shared = |loader: &mut Loader<'_>| -> Result<Mlp, ModelError> {
        let s = format!("{f}.shared_experts");
        let inter = cfg.shared_intermediate_size;
        Ok(Mlp {
            gate: loader.linear(&format!("{s}.w1"), inter, h, false)?,
            up: loader.linear(&format!("{s}.w3"), inter, h, false)?,
            down: loader.linear(&format!("{s}.w2"), h, inter, false)?,
        })
    };
    let moe = MoeWeights {
        router: loader.linear(&format!("{f}.gate"), cfg.num_experts, h, false)?,
        params: RouterParams {
            kind: cfg.routing,
            top_k: cfg.top_k,
            norm_topk_prob: true,
            routed_scaling_factor: cfg.routed_scaling_factor,
            correction_bias: if hashed { None } else { Some(host(loader, &format!("{f}.gate.bias"), &[cfg.num_experts])?) },
        },
        experts: loader.experts(&format!("{f}.experts"), cfg)?,
        shared: if cfg.shared_intermediate_size > 0 { Some(shared(loader)?) } else { None },
        shared_gate: None,
    };
    Ok(LayerWeights {
        input_norm: loader.f32_buffer(&attn_norm)?,
        post_attention_norm: loader.f32_buffer(&ffn_norm)?,
        mixer: Mixer::DeepseekV4(Box::new(mixer)),
        ffn: FeedForward::Moe(moe),
    })
}
