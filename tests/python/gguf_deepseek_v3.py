"""DeepSeek-V3 (`deepseek_v3`) -> GGUF `deepseek2`, as llama.cpp's convert_hf_to_gguf.py
(class DeepseekV2Model) writes it:

* MLA: `q_a_proj`/`q_a_layernorm`/`q_b_proj` -> attn_q_a/attn_q_a_norm/attn_q_b,
  `kv_a_proj_with_mqa`/`kv_a_layernorm` -> attn_kv_a_mqa/attn_kv_a_norm, and `kv_b_proj`
  [H*(nope+v), lora] split per head into attn_k_b [H, lora, nope] (transposed for the absorbed
  attention) and attn_v_b [H, v, lora]; no attn_kv_b is written. With
  FT_GGUF_DEEPSEEK_KV_B=1 the file has attn_kv_b instead, as converters before the split wrote.
* metadata: head_count_kv 1 (llama.cpp treats absorbed MLA as MQA), key_length
  kv_lora_rank + rope and value_length kv_lora_rank (the latent), the per-head sizes in
  key_length_mla/value_length_mla, rope.dimension_count = qk_rope_head_dim, q_lora_rank,
  kv_lora_rank, leading_dense_block_count, expert_shared_count, expert_weights_scale,
  expert_weights_norm only when true, expert_group_count/expert_group_used_count,
  expert_gating_func from `scoring_func`, YaRN with yarn_log_multiplier = 0.1 * mscale_all_dim.
* `e_score_correction_bias` -> exp_probs_b.bias; layers past num_hidden_layers (MTP) skipped.
"""
import os
import numpy as np
import gguf
from hf_to_gguf import common_metadata


def rope_params(cfg):
    """transformers 5 keeps RoPE under `rope_parameters`, older configs at the top level."""
    p = dict(cfg.get('rope_parameters') or {})
    p.update(cfg.get('rope_scaling') or {})
    if 'rope_theta' not in p and 'rope_theta' in cfg:
        p['rope_theta'] = cfg['rope_theta']
    return p


def write_rope(w, cfg):
    """TextModel's generic RoPE keys (theta, YaRN type/factor/context/betas)."""
    p = rope_params(cfg)
    w.add_rope_freq_base(p.get('rope_theta', 10000.0))
    kind = p.get('rope_type', p.get('type'))
    if kind == 'yarn' and p.get('factor') is not None:
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(p['factor'])
        w.add_rope_scaling_orig_ctx_len(p['original_max_position_embeddings'])
        if (a := p.get('attention_factor', p.get('attn_factor'))) is not None:
            w.add_rope_scaling_yarn_attn_factor(a)
        if p.get('beta_fast') is not None:
            w.add_rope_scaling_yarn_beta_fast(p['beta_fast'])
        if p.get('beta_slow') is not None:
            w.add_rope_scaling_yarn_beta_slow(p['beta_slow'])
    elif kind == 'linear' and p.get('factor') is not None:
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(p['factor'])
    return p


def gating_func(cfg, default):
    """`scoring_func` as TextModel writes it (sigmoid 2, softmax 1)."""
    score = cfg.get('scoring_func', default)
    if score == 'sigmoid':
        return gguf.ExpertGatingFuncType.SIGMOID
    if score == 'softmax':
        return gguf.ExpertGatingFuncType.SOFTMAX
    raise SystemExit(f'unsupported scoring_func {score!r}')


def moe_layer(c, i, p):
    """Router, correction bias, stacked routed experts and the shared experts (DeepSeek/GLM)."""
    cfg = c.cfg
    E = cfg['n_routed_experts']
    c.plain(f'blk.{i}.ffn_gate_inp.weight', p + 'mlp.gate.weight')
    c.plain(f'blk.{i}.exp_probs_b.bias', p + 'mlp.gate.e_score_correction_bias')
    for g in ('gate', 'up', 'down'):
        c.experts(f'blk.{i}.ffn_{g}_exps.weight', [p + f'mlp.experts.{e}.{g}_proj.weight' for e in range(E)])
    if cfg.get('n_shared_experts'):
        for g in ('gate', 'up', 'down'):
            c.weight(f'blk.{i}.ffn_{g}_shexp.weight', p + f'mlp.shared_experts.{g}_proj.weight')


def dense_layer(c, i, p):
    for g in ('gate', 'up', 'down'):
        c.weight(f'blk.{i}.ffn_{g}.weight', p + f'mlp.{g}_proj.weight')


def convert(c, out, split):
    cfg, hf = c.cfg, c.hf
    nh = cfg['num_attention_heads']
    nope, rope, vd = cfg['qk_nope_head_dim'], cfg['qk_rope_head_dim'], cfg['v_head_dim']
    lora = cfg.get('kv_lora_rank', 512)
    layers = cfg['num_hidden_layers']
    first_dense = cfg.get('first_k_dense_replace', 0)
    legacy_kv_b = os.environ.get('FT_GGUF_DEEPSEEK_KV_B') == '1'
    w = c.write(out, 'deepseek2', split)

    c.weight('token_embd.weight', 'model.embed_tokens.weight')
    for i in range(layers):
        p = f'model.layers.{i}.'
        a = p + 'self_attn.'
        c.plain(f'blk.{i}.attn_norm.weight', p + 'input_layernorm.weight')
        c.plain(f'blk.{i}.ffn_norm.weight', p + 'post_attention_layernorm.weight')
        if cfg.get('q_lora_rank'):
            c.weight(f'blk.{i}.attn_q_a.weight', a + 'q_a_proj.weight')
            c.plain(f'blk.{i}.attn_q_a_norm.weight', a + 'q_a_layernorm.weight')
            c.weight(f'blk.{i}.attn_q_b.weight', a + 'q_b_proj.weight')
        else:
            c.weight(f'blk.{i}.attn_q.weight', a + 'q_proj.weight')
        c.weight(f'blk.{i}.attn_kv_a_mqa.weight', a + 'kv_a_proj_with_mqa.weight')
        c.plain(f'blk.{i}.attn_kv_a_norm.weight', a + 'kv_a_layernorm.weight')
        if legacy_kv_b:
            c.weight(f'blk.{i}.attn_kv_b.weight', a + 'kv_b_proj.weight')
        else:
            kv_b = hf[a + 'kv_b_proj.weight'].astype(np.float32)
            assert kv_b.shape == (nh * (nope + vd), lora), kv_b.shape
            kv_b = kv_b.reshape(nh, nope + vd, lora)
            k_b = np.ascontiguousarray(kv_b[:, :nope, :].transpose(0, 2, 1))  # [H, lora, nope]
            v_b = np.ascontiguousarray(kv_b[:, nope:, :])  # [H, v, lora]
            dk = c.stored(f'blk.{i}.attn_k_b.weight', k_b)
            dv = c.stored(f'blk.{i}.attn_v_b.weight', v_b)
            twin = np.concatenate([dk.reshape(nh, lora, nope).transpose(0, 2, 1), dv.reshape(nh, vd, lora)], axis=1)
            c.keep(a + 'kv_b_proj.weight', twin.reshape(nh * (nope + vd), lora))
        c.weight(f'blk.{i}.attn_output.weight', a + 'o_proj.weight')
        if i < first_dense:
            dense_layer(c, i, p)
        else:
            moe_layer(c, i, p)
    c.plain('output_norm.weight', 'model.norm.weight')
    if not cfg.get('tie_word_embeddings', False) and 'lm_head.weight' in hf:
        c.weight('output.weight', 'lm_head.weight')

    common_metadata(w, cfg)
    # Absorbed MLA is MQA over the latent to llama.cpp.
    w.add_head_count_kv(1)
    w.add_expert_count(cfg['n_routed_experts'])
    if cfg.get('n_group') is not None:
        w.add_expert_group_count(cfg['n_group'])
    if cfg.get('topk_group') is not None:
        w.add_expert_group_used_count(cfg['topk_group'])
    # DeepSeek-V3's hub config says `"scoring_func": "sigmoid"`; transformers 5 does not save the
    # key (its DeepseekV3 is always sigmoid).
    w.add_expert_gating_func(gating_func(cfg, 'sigmoid'))
    w.add_leading_dense_block_count(first_dense)
    if cfg.get('q_lora_rank'):
        w.add_q_lora_rank(cfg['q_lora_rank'])
    w.add_kv_lora_rank(lora)
    w.add_key_length(lora + rope)
    w.add_value_length(lora)
    w.add_key_length_mla(nope + rope)
    w.add_value_length_mla(vd)
    w.add_expert_feed_forward_length(cfg['moe_intermediate_size'])
    w.add_expert_shared_count(cfg.get('n_shared_experts', 0))
    if cfg.get('routed_scaling_factor') is not None:
        w.add_expert_weights_scale(cfg['routed_scaling_factor'])
    if cfg.get('norm_topk_prob'):
        w.add_expert_weights_norm(True)
    w.add_rope_dimension_count(rope)
    p = write_rope(w, cfg)
    if p.get('mscale_all_dim') is not None:
        # [TAG_DEEPSEEK2_YARN_LOG_MUL_FIX] in llama.cpp: 0.1 * mscale_all_dim, for legacy reasons.
        w.add_rope_scaling_yarn_log_mul(0.1 * p['mscale_all_dim'])
    return w
