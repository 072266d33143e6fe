//! Conformance bodies for the recurrent-layer ops (causal convolution, gated delta rule);
//! tolerances are in the [parent module](super).

use super::*;
use crate::{reference, ConvDesc, DeltaRuleDesc, DeltaRuleInputs};

/// `causal_conv1d` with a filter of `dtype`: decode (one step), prefill longer and shorter
/// than the history, kernel 1 (no history), with and without SiLU, and the same sequence
/// fed in two calls, which must continue exactly from the carried state.
pub fn causal_conv1d(b: &dyn Backend, dtype: DType) {
    if !supported(b, Op::CausalConv1d, dtype) {
        return;
    }
    let mut rng = Rng::new(0x636f_6e76 + dtype.size() as u64 * 5 + (dtype == DType::BF16) as u64);
    // (tokens, channels, kernel, silu, first call's tokens)
    let cases = [
        (1, 8, 4, true, 1),
        (7, 33, 4, true, 7),
        (2, 5, 4, false, 2),
        (20, 64, 3, true, 13),
        (5, 17, 1, false, 2),
        (9, 300, 4, true, 1),
    ];
    for (n, c, k, silu, first) in cases {
        let what = format!("causal_conv1d {dtype} tokens={n} channels={c} kernel={k} silu={silu}");
        let x = rng.vec(n * c, 1.0);
        let (w, wv) = upload(b, dtype, &rng.vec(c * k, 1.0), BufferUsage::Weights);
        let state0 = rng.vec((k - 1) * c, 1.0);
        let mut want_state = state0.clone();
        let want = reference::causal_conv1d(
            &x,
            &wv,
            &mut want_state,
            &ConvDesc {
                n_tokens: n,
                channels: c,
                kernel: k,
                silu,
            },
        );

        let mut state = upload_f32(b, &state0);
        let mut got = Vec::new();
        for (start, len) in [(0, first), (first, n - first)] {
            if len == 0 {
                continue;
            }
            let desc = ConvDesc {
                n_tokens: len,
                channels: c,
                kernel: k,
                silu,
            };
            let xs = upload_f32(b, &x[start * c..(start + len) * c]);
            let mut out = b
                .alloc(DType::F32, len * c, BufferUsage::Scratch)
                .expect("alloc");
            b.causal_conv1d(&xs, &w, &mut state, &mut out, &desc)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            got.extend(download(b, &out));
        }
        assert_rel(&what, &got, &want, EXP_RTOL, SMALL_ATOL);
        if k > 1 {
            assert_rel(
                &format!("{what}: state"),
                &download(b, &state),
                &want_state,
                0.0,
                0.0,
            );
        }
    }
}

/// `gated_delta_rule`: one step and many, value heads sharing key heads (1, 2 and 3 per key
/// head), odd head sizes, a non-zero initial state, strong and weak decay, and a sequence
/// split over two calls that must continue from the carried state.
pub fn gated_delta_rule(b: &dyn Backend) {
    if !supported(b, Op::GatedDeltaRule, DType::F32) {
        return;
    }
    let mut rng = Rng::new(0x6764_656c_7461);
    // (tokens, k heads, v heads, k dim, v dim, first call's tokens)
    let cases = [
        (1, 1, 1, 4, 4, 1),
        (6, 2, 4, 16, 16, 6),
        (9, 2, 2, 7, 5, 4),
        (33, 1, 3, 8, 12, 1),
        (3, 4, 8, 32, 32, 2),
        (2, 2, 4, 128, 128, 1),
    ];
    for (n, hk, hv, dk, dv, first) in cases {
        let what = format!("gated_delta_rule tokens={n} heads={hk}/{hv} dims={dk}/{dv}");
        let row = 2 * hk * dk + hv * dv;
        let qkv = rng.vec(n * row, 1.0);
        let beta = rng.vec(n * hv, 3.0);
        let decay = rng.vec(n * hv, 3.0);
        // A = exp(a_log) spans 0.5 ..= 16 as in the models' initialisation.
        let a_log: Vec<f32> = (0..hv)
            .map(|_| (8.25 + 7.75 * rng.uniform()).ln())
            .collect();
        let dt_bias = rng.vec(hv, 1.0);
        let state0 = rng.vec(hv * dk * dv, 0.5);
        let scale = 1.0 / (dk as f32).sqrt();
        let desc = |len| DeltaRuleDesc {
            n_tokens: len,
            n_k_heads: hk,
            n_v_heads: hv,
            k_head_dim: dk,
            v_head_dim: dv,
            l2norm_eps: 1e-6,
            scale,
        };
        let mut want_state = state0.clone();
        let want = reference::gated_delta_rule(
            &qkv,
            &beta,
            &decay,
            &a_log,
            &dt_bias,
            &mut want_state,
            &desc(n),
        );

        let (a_log_b, dt_b) = (upload_f32(b, &a_log), upload_f32(b, &dt_bias));
        let mut state = upload_f32(b, &state0);
        let mut got = Vec::new();
        for (start, len) in [(0, first), (first, n - first)] {
            if len == 0 {
                continue;
            }
            let qkv_b = upload_f32(b, &qkv[start * row..(start + len) * row]);
            let beta_b = upload_f32(b, &beta[start * hv..(start + len) * hv]);
            let decay_b = upload_f32(b, &decay[start * hv..(start + len) * hv]);
            let inputs = DeltaRuleInputs {
                qkv: &qkv_b,
                beta_logits: &beta_b,
                decay_in: &decay_b,
                a_log: &a_log_b,
                dt_bias: &dt_b,
            };
            let mut out = b
                .alloc(DType::F32, len * hv * dv, BufferUsage::Scratch)
                .expect("alloc");
            b.gated_delta_rule(&inputs, &mut state, &mut out, &desc(len))
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            got.extend(download(b, &out));
        }
        assert_rel(&what, &got, &want, DELTA_RULE_RTOL, DELTA_RULE_ATOL);
        assert_rel(
            &format!("{what}: state"),
            &download(b, &state),
            &want_state,
            DELTA_RULE_RTOL,
            DELTA_RULE_ATOL,
        );
    }
}
