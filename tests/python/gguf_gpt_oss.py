"""gpt_oss -> GGUF `gpt-oss`, laid out as llama.cpp's converter (conversion/gpt_oss.py,
GptOssModel) and llama-quantize write it, from a checkpoint with unquantized fused experts:

- `mlp.experts.gate_up_proj [E, H, 2I]` (input-major, gate and up interleaved on the last axis)
  is transposed to `[E, 2I, H]` and split by row parity into `ffn_gate_exps` (even rows) and
  `ffn_up_exps` (odd rows), `[E, I, H]` each; `down_proj [E, I, H]` is transposed to
  `ffn_down_exps [E, H, I]`.
- `gate_up_proj_bias [E, 2I]` is split the same way into `ffn_gate_exps.bias`/`ffn_up_exps.bias`,
  `down_proj_bias` becomes `ffn_down_exps.bias`; biases stay F32 (names not ending in `.weight`).
- `self_attn.sinks` gets `.weight` appended and becomes `attn_sinks.weight`; the second norm is
  `post_attention_norm` (ATTN_POST_NORM), the router `ffn_gate_inp` (+ `.bias`), both F32.
- Metadata: the common keys, `attention.sliding_window`, `expert_feed_forward_length` =
  intermediate_size, and the YaRN keys of TextModel (type, factor, original context, beta_fast,
  beta_slow). No sliding-window pattern (llama.cpp hard-codes period 2), no SwiGLU clamp (hard
  coded 7.0 / 1.702), no `truncate` (llama.cpp always rounds the YaRN correction range).

TYPE mxfp4 is llama-quantize's MXFP4_MOE: 3-D (expert) tensors MXFP4, other matrices Q8_0.
Other types as the Converter does. The twin holds the decoded values in the checkpoint's
fused layout."""
import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q
from hf_to_gguf import common_metadata


def convert(c, out, split):
    cfg, hf = c.cfg, c.hf
    nl = cfg['num_hidden_layers']
    if c.kind == 'mxfp4':
        # llama-quantize MXFP4_MOE: `ne[2] > 1` -> MXFP4, every other quantized tensor Q8_0.
        base = c.weight_type
        c.weight_type = lambda gname, cols: base(gname, cols) if '_exps.' in gname else (Q.Q8_0 if cols % 32 == 0 else Q.F16)
    rope = dict(cfg.get('rope_scaling') or {})
    rope.update(cfg.get('rope_parameters') or {})
    meta_cfg = dict(cfg)
    meta_cfg['rope_theta'] = rope.get('rope_theta', cfg.get('rope_theta', 10000.0))
    w = c.write(out, 'gpt-oss', split)

    c.weight('token_embd.weight', 'model.embed_tokens.weight')
    for i in range(nl):
        p = f'model.layers.{i}.'
        c.plain(f'blk.{i}.attn_norm.weight', p + 'input_layernorm.weight')
        c.plain(f'blk.{i}.post_attention_norm.weight', p + 'post_attention_layernorm.weight')
        for g, h in (('q', 'q'), ('k', 'k'), ('v', 'v'), ('output', 'o')):
            c.weight(f'blk.{i}.attn_{g}.weight', p + f'self_attn.{h}_proj.weight')
            if p + f'self_attn.{h}_proj.bias' in hf:
                c.plain(f'blk.{i}.attn_{g}.bias', p + f'self_attn.{h}_proj.bias')
        c.plain(f'blk.{i}.attn_sinks.weight', p + 'self_attn.sinks')
        c.plain(f'blk.{i}.ffn_gate_inp.weight', p + 'mlp.router.weight')
        c.plain(f'blk.{i}.ffn_gate_inp.bias', p + 'mlp.router.bias')

        e = p + 'mlp.experts.'
        gu = hf[e + 'gate_up_proj'].astype(np.float32).transpose(0, 2, 1)  # [E, 2I, H]
        gate = c.stored(f'blk.{i}.ffn_gate_exps.weight', np.ascontiguousarray(gu[:, ::2, :]))
        up = c.stored(f'blk.{i}.ffn_up_exps.weight', np.ascontiguousarray(gu[:, 1::2, :]))
        down = c.stored(f'blk.{i}.ffn_down_exps.weight', np.ascontiguousarray(hf[e + 'down_proj'].astype(np.float32).transpose(0, 2, 1)))
        fused = np.empty_like(gu)
        fused[:, ::2, :], fused[:, 1::2, :] = gate, up
        c.keep(e + 'gate_up_proj', fused.transpose(0, 2, 1))
        c.keep(e + 'down_proj', down.transpose(0, 2, 1))

        b = hf[e + 'gate_up_proj_bias'].astype(np.float32)
        c.emit(f'blk.{i}.ffn_gate_exps.bias', np.ascontiguousarray(b[:, ::2]), None)
        c.emit(f'blk.{i}.ffn_up_exps.bias', np.ascontiguousarray(b[:, 1::2]), None)
        c.keep(e + 'gate_up_proj_bias', b)
        c.plain(f'blk.{i}.ffn_down_exps.bias', e + 'down_proj_bias')
    c.plain('output_norm.weight', 'model.norm.weight')
    if 'lm_head.weight' in hf:
        c.weight('output.weight', 'lm_head.weight')

    common_metadata(w, meta_cfg)
    w.add_sliding_window(cfg['sliding_window'])
    w.add_expert_feed_forward_length(cfg['intermediate_size'])
    kind = rope.get('rope_type', rope.get('type'))
    if kind == 'yarn' and rope.get('factor') is not None:
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rope['factor'])
        w.add_rope_scaling_orig_ctx_len(rope['original_max_position_embeddings'])
        if rope.get('extrapolation_factor') is not None:
            w.add_rope_scaling_yarn_ext_factor(rope['extrapolation_factor'])
        attn = rope.get('attention_factor', rope.get('attn_factor'))
        if attn is not None:
            w.add_rope_scaling_yarn_attn_factor(attn)
        if rope.get('beta_fast') is not None:
            w.add_rope_scaling_yarn_beta_fast(rope['beta_fast'])
        if rope.get('beta_slow') is not None:
            w.add_rope_scaling_yarn_beta_slow(rope['beta_slow'])
    return w

