//! Size facts of a loaded model: parameters, bytes per expert and the memory plan.

use super::weights::{DeltaNetProjections, FeedForward, Linear, Mixer, Mlp};
use ft_backend::DeviceBuffer;
use super::Model;
use crate::kv::SequenceState;

/// Parameter and byte counts of a model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelStats {
    /// All parameters.
    pub total_params: u64,
    /// Parameters touched per token: non-expert weights (one embedding row, not the table)
    /// plus the top-k experts of every MoE layer.
    pub active_params: u64,
    /// Parameters of one routed expert.
    pub params_per_expert: u64,
    /// Bytes of one routed expert in its checkpoint dtype (packed, for quantized ones).
    pub bytes_per_expert: u64,
    /// The routed experts' weight format (`bf16`, `fp8`, `nvfp4`, …; `q4_k/q4_k/q6_k` for
    /// gate/up/down when they differ, as in a GGUF Q4_K_M).
    pub expert_format: String,
    /// Bytes of all weights by storage format, largest first.
    pub bytes_by_format: Vec<(&'static str, u64)>,
    /// Bytes of all non-expert weights (device resident).
    pub non_expert_bytes: u64,
    /// Bytes of all routed experts (host pool).
    pub expert_bytes: u64,
    /// Routed experts across all layers.
    pub total_experts: u64,
    /// Bytes of weights read to decode one token (non-expert + top-k experts per layer).
    pub bytes_per_token: u64,
    /// KV (or latent) cache bytes per token of context.
    pub kv_bytes_per_token: u64,
    /// Fixed-size recurrent state per sequence (linear-attention layers), in bytes.
    pub state_bytes_per_sequence: u64,
}

fn linear(l: &Linear) -> (u64, u64) {
    (l.params() as u64, l.size_bytes() as u64)
}

fn buffer(b: &DeviceBuffer) -> (u64, u64) {
    (b.len() as u64, b.size_bytes() as u64)
}

/// Parameters and bytes of a layer's token mixer.
fn mixer(m: &Mixer) -> (u64, u64) {
    let (lin, bufs) = mixer_parts(m);
    let (p, b) = lin.into_iter().map(linear).chain(bufs.into_iter().map(buffer)).fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    let host = host_params(m);
    (p + host, b + 4 * host)
}

/// f32 values a mixer keeps on the host (DeepSeek-V4's norms, sinks, window biases and
/// hyper-connections); its hash table is an index, not parameters.
fn host_params(m: &Mixer) -> u64 {
    let Mixer::DeepseekV4(w) = m else { return 0 };
    let hc = |h: &super::deepseek_v4::HyperConnection| h.fn_w.len() + h.base.len() + h.scale.len();
    let comp = w.compressor.iter().chain(w.indexer.as_ref().map(|i| &i.compressor)).map(|c| c.bias.len() + c.norm.len()).sum::<usize>();
    (w.q_a_norm.len() + w.kv_norm.len() + w.sinks.len() + comp + hc(&w.attn_hc) + hc(&w.ffn_hc)) as u64
}

/// The linear layers and other buffers of a token mixer.
fn mixer_parts(m: &Mixer) -> (Vec<&Linear>, Vec<&DeviceBuffer>) {
    match m {
        Mixer::Attention(a) => (vec![&a.q, &a.k, &a.v, &a.o], [&a.q_norm, &a.k_norm, &a.sinks].into_iter().flatten().collect()),
        Mixer::Mla(a) => {
            let mut l = vec![&a.q_b, &a.kv_a, &a.o];
            l.extend(&a.q_a);
            let mut b = vec![&a.kv_a_norm, &a.w_uk_t, &a.w_uv];
            b.extend(&a.q_a_norm);
            (l, b)
        }
        Mixer::DeltaNet(d) => {
            let l = match &d.proj {
                DeltaNetProjections::Grouped { qkvz, ba } => vec![qkvz, ba],
                DeltaNetProjections::Split { qkv, z, b, a } => vec![qkv, z, b, a],
            };
            (vec![&d.out].into_iter().chain(l).collect(), vec![&d.conv, &d.a_log, &d.dt_bias, &d.norm])
        }
        Mixer::DeepseekV4(w) => {
            let mut l = vec![&w.q_a, &w.q_b, &w.kv, &w.o_a, &w.o_b];
            for c in w.compressor.iter().chain(w.indexer.as_ref().map(|i| &i.compressor)) {
                l.extend([&c.kv, &c.gate]);
            }
            if let Some(i) = &w.indexer {
                l.extend([&i.q_b, &i.weights]);
            }
            (l, vec![])
        }
    }
}

/// Bytes of all weights by storage format (`q4_k`, `bf16`, …), largest first: a GGUF's
/// Q4_K_M, say, mixes Q4_K, Q6_K and f32 tensors.
pub fn bytes_by_format(model: &Model) -> Vec<(&'static str, u64)> {
    let mut acc: std::collections::BTreeMap<&'static str, u64> = Default::default();
    let mut add = |d: ft_backend::DType, bytes: usize| *acc.entry(d.name()).or_default() += bytes as u64;
    add(model.embed.dtype(), model.embed.size_bytes());
    let mut add_buf = |b: &DeviceBuffer| add(b.dtype(), b.size_bytes());
    add_buf(&model.final_norm);
    let mut linears: Vec<&Linear> = model.lm_head.iter().collect();
    let mut bufs: Vec<&DeviceBuffer> = vec![];
    let mut host: Vec<&super::weights::HostMatrix> = vec![];
    for layer in model.layers() {
        bufs.extend([&layer.input_norm, &layer.post_attention_norm]);
        let (l, b) = mixer_parts(&layer.mixer);
        linears.extend(l);
        bufs.extend(b);
        match &layer.ffn {
            FeedForward::Dense(m) => linears.extend([&m.gate, &m.up, &m.down]),
            FeedForward::Moe(moe) => {
                linears.push(&moe.router);
                linears.extend(moe.shared.iter().flat_map(|m| [&m.gate, &m.up, &m.down]));
                linears.extend(&moe.shared_gate);
                host.extend(moe.experts.iter().flat_map(|e| [&e.gate, &e.up, &e.down]));
            }
        }
    }
    for l in linears {
        add_buf(&l.w);
        bufs.extend(&l.bias);
    }
    for b in bufs {
        add_buf(b);
    }
    // DeepSeek-V4's host-side f32 values.
    let host_f32 = model.hc_head.as_ref().map_or(0, |h| (h.fn_w.len() + h.base.len() + 1) as u64)
        + model.layers().iter().map(|l| host_params(&l.mixer)).sum::<u64>();
    if host_f32 > 0 {
        *acc.entry("f32").or_default() += 4 * host_f32;
    }
    let mut out: Vec<(&'static str, u64)> = acc.into_iter().collect();
    for m in host {
        match out.iter_mut().find(|(n, _)| *n == m.dtype.name()) {
            Some(e) => e.1 += m.size_bytes() as u64,
            None => out.push((m.dtype.name(), m.size_bytes() as u64)),
        }
    }
    out.sort_by(|a, b| b.1.cmp(&a.1));
    out
}

fn mlp(m: &Mlp) -> (u64, u64) {
    [&m.gate, &m.up, &m.down].iter().map(|l| linear(l)).fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
}

/// Counts parameters and bytes of `model`.
pub fn stats(model: &Model) -> ModelStats {
    let cfg = model.config();
    let mut dense = (model.embed.len() as u64 + model.final_norm.len() as u64, model.embed.size_bytes() as u64 + model.final_norm.size_bytes() as u64);
    let mut expert_format = String::from("none");
    let add = |acc: &mut (u64, u64), x: (u64, u64)| {
        acc.0 += x.0;
        acc.1 += x.1;
    };
    if let Some(l) = &model.lm_head {
        add(&mut dense, linear(l));
    }
    if let Some(h) = &model.hc_head {
        let n = (h.fn_w.len() + h.base.len() + 1) as u64;
        add(&mut dense, (n, 4 * n));
    }
    let (mut expert_params, mut expert_bytes, mut total_experts, mut active_expert_params, mut active_expert_bytes) = (0u64, 0u64, 0u64, 0u64, 0u64);
    let (mut per_expert_params, mut per_expert_bytes) = (0u64, 0u64);
    for layer in model.layers() {
        add(&mut dense, ((layer.input_norm.len() + layer.post_attention_norm.len()) as u64, (layer.input_norm.size_bytes() + layer.post_attention_norm.size_bytes()) as u64));
        add(&mut dense, mixer(&layer.mixer));
        match &layer.ffn {
            FeedForward::Dense(m) => add(&mut dense, mlp(m)),
            FeedForward::Moe(moe) => {
                add(&mut dense, linear(&moe.router));
                if let Some(b) = &moe.params.correction_bias {
                    add(&mut dense, (b.len() as u64, (b.len() * 4) as u64));
                }
                if let Some(s) = &moe.shared {
                    add(&mut dense, mlp(s));
                }
                if let Some(g) = &moe.shared_gate {
                    add(&mut dense, linear(g));
                }
                for e in &moe.experts {
                    let p = e.params() as u64;
                    expert_params += p;
                    expert_bytes += e.size_bytes() as u64;
                    total_experts += 1;
                    per_expert_params = p;
                    per_expert_bytes = e.size_bytes() as u64;
                    let (g, u, d) = (e.gate.dtype.name(), e.up.dtype.name(), e.down.dtype.name());
                    if expert_format == "none" {
                        expert_format = if g == u && u == d { g.to_string() } else { format!("{g}/{u}/{d}") };
                    }
                }
                active_expert_params += per_expert_params * cfg.top_k as u64;
                active_expert_bytes += per_expert_bytes * cfg.top_k as u64;
            }
        }
    }
    // Decoding reads one embedding row, not the table; the lm_head is read whole.
    let embed_row_bytes = (model.embed.size_bytes() / cfg.vocab_size.max(1)) as u64;
    let tied_head = if model.lm_head.is_none() { model.embed.size_bytes() as u64 } else { 0 };
    ModelStats {
        total_params: dense.0 + expert_params,
        active_params: dense.0 - model.embed.len() as u64 + (model.embed.len() / cfg.vocab_size.max(1)) as u64
            + if model.lm_head.is_none() { model.embed.len() as u64 } else { 0 }
            + active_expert_params,
        params_per_expert: per_expert_params,
        bytes_per_expert: per_expert_bytes,
        expert_format,
        bytes_by_format: bytes_by_format(model),
        non_expert_bytes: dense.1,
        expert_bytes,
        total_experts,
        bytes_per_token: dense.1 - model.embed.size_bytes() as u64 + embed_row_bytes + tied_head + active_expert_bytes,
        kv_bytes_per_token: SequenceState::bytes_per_token(model) as u64,
        state_bytes_per_sequence: SequenceState::fixed_bytes(model) as u64,
    }
}
