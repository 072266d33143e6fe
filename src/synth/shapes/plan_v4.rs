//! DeepSeek-V4's tensor list in the published naming (`embed`, `layers.{i}.attn.*`,
//! `layers.{i}.ffn.*`, `hc_*`, `head`), with the norms, hyper-connection weights, window
//! biases, sinks and router biases in f32 as the published checkpoints keep them.

use super::plan::Builder;
use super::{Init, ShapeSpec, SynthDtype, TensorKind, TensorPlan, V4Spec, BIAS, NORM, WEIGHT};

/// Every tensor of a DeepSeek-V4 shape, in module order.
pub(super) fn v4_plan(s: &ShapeSpec, v: &V4Spec, dtype: SynthDtype) -> Vec<TensorPlan> {
    let (h, nh, hd, hc) = (s.hidden, s.heads, s.head_dim, v.hc_mult);
    let router = Init { mean: 0.0, std: 1.0 / (h as f32).sqrt() };
    let f32 = |b: &mut Builder, name: String, shape: &[usize], init: Init| b.add_as(name, shape, init, SynthDtype::F32, TensorKind::Dense);
    let mut b = Builder { dtype, out: Vec::new() };
    b.add_as("embed.weight".into(), &[s.vocab, h], WEIGHT, dtype, TensorKind::Embedding);
    for i in 0..s.layers {
        let p = format!("layers.{i}");
        let a = format!("{p}.attn");
        f32(&mut b, format!("{p}.attn_norm.weight"), &[h], NORM);
        b.linear(&format!("{a}.wq_a"), v.q_lora_rank, h, false);
        f32(&mut b, format!("{a}.q_norm.weight"), &[v.q_lora_rank], NORM);
        b.linear(&format!("{a}.wq_b"), nh * hd, v.q_lora_rank, false);
        b.linear(&format!("{a}.wkv"), hd, h, false);
        f32(&mut b, format!("{a}.kv_norm.weight"), &[hd], NORM);
        b.linear(&format!("{a}.wo_a"), v.o_groups * v.o_lora_rank, nh * hd / v.o_groups, false);
        b.linear(&format!("{a}.wo_b"), h, v.o_groups * v.o_lora_rank, false);
        f32(&mut b, format!("{a}.attn_sink"), &[nh], BIAS);
        let (rate, csa) = (v.rate(i), v.is_csa(i));
        {
            let width = if csa { 2 * hd } else { hd };
            b.linear(&format!("{a}.compressor.wkv"), width, h, false);
            b.linear(&format!("{a}.compressor.wgate"), width, h, false);
            f32(&mut b, format!("{a}.compressor.ape"), &[rate, width], BIAS);
            f32(&mut b, format!("{a}.compressor.norm.weight"), &[hd], NORM);
            if csa {
                let (ih, id) = (v.index_heads, v.index_head_dim);
                b.linear(&format!("{a}.indexer.compressor.wkv"), 2 * id, h, false);
                b.linear(&format!("{a}.indexer.compressor.wgate"), 2 * id, h, false);
                f32(&mut b, format!("{a}.indexer.compressor.ape"), &[rate, 2 * id], BIAS);
                f32(&mut b, format!("{a}.indexer.compressor.norm.weight"), &[id], NORM);
                b.linear(&format!("{a}.indexer.wq_b"), ih * id, v.q_lora_rank, false);
                b.linear(&format!("{a}.indexer.weights_proj"), ih, h, false);
            }
        }
        f32(&mut b, format!("{p}.ffn_norm.weight"), &[h], NORM);
        let f = format!("{p}.ffn");
        b.add(format!("{f}.gate.weight"), &[s.experts, h], router);
        if i < v.hash_layers {
            let ids = Init { mean: 0.0, std: s.experts as f32 };
            b.add_as(format!("{f}.gate.tid2eid"), &[s.vocab, s.top_k], ids, SynthDtype::I64, TensorKind::Lookup);
        } else {
            f32(&mut b, format!("{f}.gate.bias"), &[s.experts], BIAS);
        }
        let inter = s.moe_intermediate;
        for e in 0..s.experts {
            let x = format!("{f}.experts.{e}");
            b.add_as(format!("{x}.w1.weight"), &[inter, h], WEIGHT, dtype, TensorKind::RoutedExpert);
            b.add_as(format!("{x}.w2.weight"), &[h, inter], WEIGHT, dtype, TensorKind::RoutedExpert);
            b.add_as(format!("{x}.w3.weight"), &[inter, h], WEIGHT, dtype, TensorKind::RoutedExpert);
        }
        if s.shared_intermediate > 0 {
            let x = format!("{f}.shared_experts");
            b.linear(&format!("{x}.w1"), s.shared_intermediate, h, false);
            b.linear(&format!("{x}.w2"), h, s.shared_intermediate, false);
            b.linear(&format!("{x}.w3"), s.shared_intermediate, h, false);
        }
        for which in ["attn", "ffn"] {
            let n = (2 + hc) * hc;
            f32(&mut b, format!("{p}.hc_{which}_fn"), &[n, hc * h], WEIGHT);
            f32(&mut b, format!("{p}.hc_{which}_base"), &[n], BIAS);
            f32(&mut b, format!("{p}.hc_{which}_scale"), &[3], NORM);
        }
    }
    f32(&mut b, "norm.weight".into(), &[h], NORM);
    b.linear("head", s.vocab, h, false);
    f32(&mut b, "hc_head_fn".into(), &[hc, hc * h], WEIGHT);
    f32(&mut b, "hc_head_base".into(), &[hc], BIAS);
    f32(&mut b, "hc_head_scale".into(), &[1], NORM);
    b.out
}
