"""GLM-4.5 MoE (`glm4_moe`) -> GGUF `glm4moe`, as llama.cpp's convert_hf_to_gguf.py
(class Glm4MoeModel) writes it:

* block_count = num_hidden_layers + num_nextn_predict_layers: the MTP (NextN) layers are stored
  as ordinary blocks after the decoder layers, their extra tensors as blk.N.nextn.*; llama.cpp
  loads but never runs them (`nextn_predict_layers` says how many).
* `post_attention_layernorm` -> post_attention_norm (not ffn_norm), q/k/v biases, optional
  attn_q_norm/attn_k_norm, shared experts as *_shexp, `e_score_correction_bias` ->
  exp_probs_b.bias.
* rope.dimension_count = head_dim * partial_rotary_factor (0.5 when the config has none at the
  top level), expert_gating_func sigmoid, expert_weights_norm whenever the config has
  norm_topk_prob (true or false), expert_group_count/expert_group_used_count from n_group/topk_group.
"""
import gguf
from hf_to_gguf import common_metadata
from gguf_deepseek_v3 import moe_layer, dense_layer, write_rope, rope_params

# HF names of the NextN tensors of an MTP layer and their GGUF names (under blk.N.).
NEXTN = (('eh_proj', 'nextn.eh_proj'), ('enorm', 'nextn.enorm'), ('hnorm', 'nextn.hnorm'),
         ('embed_tokens', 'nextn.embed_tokens'), ('shared_head.head', 'nextn.shared_head_head'),
         ('shared_head.norm', 'nextn.shared_head_norm'))


def convert(c, out, split):
    cfg, hf = c.cfg, c.hf
    layers = cfg['num_hidden_layers']
    nextn = cfg.get('num_nextn_predict_layers') or 0
    first_dense = cfg.get('first_k_dense_replace', 0)
    w = c.write(out, 'glm4moe', split)

    c.weight('token_embd.weight', 'model.embed_tokens.weight')
    for i in range(layers + nextn):
        p = f'model.layers.{i}.'
        if p + 'input_layernorm.weight' not in hf:
            continue
        a = p + 'self_attn.'
        c.plain(f'blk.{i}.attn_norm.weight', p + 'input_layernorm.weight')
        c.plain(f'blk.{i}.post_attention_norm.weight', p + 'post_attention_layernorm.weight')
        for g, h in (('q', 'q'), ('k', 'k'), ('v', 'v'), ('output', 'o')):
            c.weight(f'blk.{i}.attn_{g}.weight', a + f'{h}_proj.weight')
            if a + f'{h}_proj.bias' in hf:
                c.plain(f'blk.{i}.attn_{g}.bias', a + f'{h}_proj.bias')
        for g in ('q', 'k'):
            if a + f'{g}_norm.weight' in hf:
                c.plain(f'blk.{i}.attn_{g}_norm.weight', a + f'{g}_norm.weight')
        if i < first_dense:
            dense_layer(c, i, p)
        else:
            moe_layer(c, i, p)
        for h, g in NEXTN:
            if p + h + '.weight' in hf:
                if hf[p + h + '.weight'].ndim == 1:
                    c.plain(f'blk.{i}.{g}.weight', p + h + '.weight')
                else:
                    c.weight(f'blk.{i}.{g}.weight', p + h + '.weight')
    c.plain('output_norm.weight', 'model.norm.weight')
    if not cfg.get('tie_word_embeddings', False) and 'lm_head.weight' in hf:
        c.weight('output.weight', 'lm_head.weight')

    common_metadata(w, cfg)
    w.add_block_count(layers + nextn)
    if cfg.get('n_group') is not None:
        w.add_expert_group_count(cfg['n_group'])
    if cfg.get('topk_group') is not None:
        w.add_expert_group_used_count(cfg['topk_group'])
    head_dim = cfg.get('head_dim') or cfg['hidden_size'] // cfg['num_attention_heads']
    # The converter reads hparams['partial_rotary_factor'] (default 0.5); transformers 5
    # configs keep it in rope_parameters.
    factor = cfg.get('partial_rotary_factor', rope_params(cfg).get('partial_rotary_factor', 0.5))
    w.add_rope_dimension_count(int(head_dim * factor))
    write_rope(w, cfg)
    w.add_expert_count(cfg['n_routed_experts'])
    w.add_expert_feed_forward_length(cfg['moe_intermediate_size'])
    if cfg.get('n_shared_experts') is not None:
        w.add_expert_shared_count(cfg['n_shared_experts'])
    if cfg.get('first_k_dense_replace') is not None:
        w.add_leading_dense_block_count(first_dense)
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    if cfg.get('routed_scaling_factor') is not None:
        w.add_expert_weights_scale(cfg['routed_scaling_factor'])
    if cfg.get('norm_topk_prob') is not None:
        w.add_expert_weights_norm(cfg['norm_topk_prob'])
    if cfg.get('num_nextn_predict_layers') is not None:
        w.add_nextn_predict_layers(nextn)
    return w
