"""Qwen3-Next (`qwen3_next`) -> GGUF `qwen3next`, as llama.cpp's convert_hf_to_gguf.py (class
Qwen3NextModel, on Qwen2MoeModel) writes it; gguf_qwen3_5_moe.py adds what Qwen3.5 changes.

* Every `*norm.weight` but the DeltaNet's gated `linear_attn.norm.weight` is stored as `1 + w`
  (llama.cpp multiplies by the weight, the checkpoint by 1 + w); `post_attention_layernorm` is
  `post_attention_norm` (ATTN_POST_NORM, the only second norm these architectures list).
* `A_log` -> `ssm_a = -exp(A_log)` (no `.weight`), `dt_bias` -> `ssm_dt.bias`, `conv1d
  [C, 1, K]` squeezed to `ssm_conv1d [C, K]`, `linear_attn.norm` -> `ssm_norm`, `out_proj` ->
  `ssm_out`: llama-quantize leaves the vectors and the convolution F32.
* `in_proj_qkvz` (per key head `[q dk | k dk | v r·dv | z r·dv]`, r = Hv/Hk) -> `attn_qkv` (all
  q, all k, all v) and `attn_gate` (all z); `in_proj_ba` -> `ssm_ba`, unchanged.
* `q_proj` (query and output gate per head) -> `attn_q` unchanged; routed experts stacked into
  `ffn_{gate,up,down}_exps`, the shared expert as `*_shexp`, its gate `ffn_gate_inp_shexp`.
* Metadata: the common keys, `expert_shared_feed_forward_length`, `ssm.conv_kernel`
  (linear_conv_kernel_dim), `ssm.state_size` (linear_key_head_dim), `ssm.group_count`
  (linear_num_key_heads), `ssm.time_step_rank` (linear_num_value_heads), `ssm.inner_size`
  (linear_value_head_dim · linear_num_value_heads), `full_attention_interval` (4 without one)
  and `rope.dimension_count` = head_dim · partial_rotary_factor (0.25 without one).

The twin holds what the GGUF decodes back to, in the checkpoint's layout: (1 + w) - 1 and
log(exp(A_log)) in f32, matrices as the block type decodes them."""
import numpy as np
from hf_to_gguf import common_metadata
from gguf_deepseek_v3 import rope_params


def reorder_v(x, axis, nk, r, hd):
    """llama.cpp's `_reorder_v_heads`: value heads grouped by key head ([Hk, r]) -> tiled ([r, Hk])."""
    x = np.moveaxis(x, axis, 0)
    shape = x.shape
    x = x.reshape(nk, r, hd, *shape[1:]).swapaxes(0, 1).reshape(shape)
    return np.ascontiguousarray(np.moveaxis(x, 0, axis))


def unreorder_v(x, axis, nk, r, hd):
    """The inverse of `reorder_v`."""
    return reorder_v(x, axis, r, nk, hd)


class Hybrid:
    """One conversion of either family: `prefix` is where the text model's tensors are, `tiled`
    whether value heads are reordered (Qwen3.5 with Hv != Hk)."""

    def __init__(self, c, prefix, tiled):
        self.c, self.cfg, self.hf, self.prefix = c, c.cfg, c.hf, prefix
        cfg = self.cfg
        self.nk, self.nv = cfg['linear_num_key_heads'], cfg['linear_num_value_heads']
        self.dk, self.dv = cfg['linear_key_head_dim'], cfg['linear_value_head_dim']
        self.r = self.nv // self.nk
        self.tiled = tiled and self.nk != self.nv

    def v(self, x, axis, hd, inverse=False):
        if not self.tiled:
            return x
        return (unreorder_v if inverse else reorder_v)(x, axis, self.nk, self.r, hd)

    def get(self, name):
        return self.hf[self.prefix + name].astype(np.float32)

    def offset_norm(self, gname, name):
        """A `(1 + w)` norm: stored as 1 + w, read back as (1 + w) - 1."""
        stored = self.get(name) + np.float32(1)
        self.c.emit(gname, np.ascontiguousarray(stored), None)
        self.c.keep(self.prefix + name, stored - np.float32(1))

    def matrix(self, gname, name, x=None, back=None):
        """`x` (the checkpoint's tensor `name` by default) in the file's type; `back` turns the
        decoded values into the checkpoint's layout for the twin."""
        x = self.get(name) if x is None else x
        deq = self.c.stored(gname, np.ascontiguousarray(x))
        self.c.keep(self.prefix + name, deq if back is None else back(deq))

    def attention(self, i, p):
        c = self.c
        for g, h in (('q', 'q'), ('k', 'k'), ('v', 'v'), ('output', 'o')):
            self.matrix(f'blk.{i}.attn_{g}.weight', p + f'self_attn.{h}_proj.weight')
        for g in ('q', 'k'):
            self.offset_norm(f'blk.{i}.attn_{g}_norm.weight', p + f'self_attn.{g}_norm.weight')

    def delta_net(self, i, p):
        """Qwen3-Next's grouped projections; Qwen3.5 overrides `projections`."""
        a = p + 'linear_attn.'
        self.projections(i, a)
        hv_dim = self.nk * self.dk * 2
        A = self.v(self.get(a + 'A_log'), 0, 1)
        ssm_a = -np.exp(A)
        self.c.emit(f'blk.{i}.ssm_a', ssm_a, None)
        self.c.keep(self.prefix + a + 'A_log', self.v(np.log(-ssm_a), 0, 1, inverse=True))
        self.c.emit(f'blk.{i}.ssm_dt.bias', self.v(self.get(a + 'dt_bias'), 0, 1), None)
        self.c.keep(self.prefix + a + 'dt_bias', self.get(a + 'dt_bias'))
        conv = self.get(a + 'conv1d.weight')
        sq = conv.reshape(conv.shape[0], conv.shape[-1])
        sq = np.concatenate([sq[:hv_dim], self.v(sq[hv_dim:], 0, self.dv)])
        self.c.emit(f'blk.{i}.ssm_conv1d.weight', np.ascontiguousarray(sq), None)
        self.c.keep(self.prefix + a + 'conv1d.weight', conv)
        self.c.emit(f'blk.{i}.ssm_norm.weight', self.get(a + 'norm.weight'), None)
        self.c.keep(self.prefix + a + 'norm.weight', self.get(a + 'norm.weight'))
        self.matrix(f'blk.{i}.ssm_out.weight', a + 'out_proj.weight', self.v(self.get(a + 'out_proj.weight'), 1, self.dv),
                    lambda d: self.v(d, 1, self.dv, inverse=True))

    def projections(self, i, a):
        nk, dk, r, dv = self.nk, self.dk, self.r, self.dv
        w = self.get(a + 'in_proj_qkvz.weight')
        parts = w.reshape(nk, 2 * dk + 2 * r * dv, -1)
        sizes = np.cumsum([dk, dk, r * dv])
        q, k, v, z = np.split(parts, sizes, axis=1)
        qkv = np.concatenate([q.reshape(nk * dk, -1), k.reshape(nk * dk, -1), v.reshape(nk * r * dv, -1)])
        dq = self.c.stored(f'blk.{i}.attn_qkv.weight', np.ascontiguousarray(qkv))
        dz = self.c.stored(f'blk.{i}.attn_gate.weight', np.ascontiguousarray(z.reshape(nk * r * dv, -1)))
        # Back to the per-key-head grouping of in_proj_qkvz.
        dq, dk_, dv_ = np.split(dq, np.cumsum([nk * dk, nk * dk]))
        back = np.concatenate([dq.reshape(nk, dk, -1), dk_.reshape(nk, dk, -1), dv_.reshape(nk, r * dv, -1), dz.reshape(nk, r * dv, -1)], axis=1)
        self.c.keep(self.prefix + a + 'in_proj_qkvz.weight', back.reshape(w.shape))
        self.matrix(f'blk.{i}.ssm_ba.weight', a + 'in_proj_ba.weight')

    def moe(self, i, p):
        c, E = self.c, self.cfg['num_experts']
        c.plain(f'blk.{i}.ffn_gate_inp.weight', self.get(p + 'mlp.gate.weight'), self.prefix + p + 'mlp.gate.weight')
        for g in ('gate', 'up', 'down'):
            names = [self.prefix + p + f'mlp.experts.{e}.{g}_proj.weight' for e in range(E)]
            c.experts(f'blk.{i}.ffn_{g}_exps.weight', names)
        c.plain(f'blk.{i}.ffn_gate_inp_shexp.weight', self.get(p + 'mlp.shared_expert_gate.weight'), self.prefix + p + 'mlp.shared_expert_gate.weight')
        for g in ('gate', 'up', 'down'):
            self.matrix(f'blk.{i}.ffn_{g}_shexp.weight', p + f'mlp.shared_expert.{g}_proj.weight')

    def run(self, out, split, arch):
        c, cfg = self.c, self.cfg
        w = c.write(out, arch, split)
        self.matrix('token_embd.weight', 'embed_tokens.weight')
        interval = cfg.get('full_attention_interval', 4)
        types = cfg.get('layer_types') or ['full_attention' if (i + 1) % interval == 0 else 'linear_attention' for i in range(cfg['num_hidden_layers'])]
        for i in range(cfg['num_hidden_layers']):
            p = f'layers.{i}.'
            self.offset_norm(f'blk.{i}.attn_norm.weight', p + 'input_layernorm.weight')
            self.offset_norm(f'blk.{i}.post_attention_norm.weight', p + 'post_attention_layernorm.weight')
            if types[i] == 'linear_attention':
                self.delta_net(i, p)
            else:
                self.attention(i, p)
            self.moe(i, p)
        self.offset_norm('output_norm.weight', 'norm.weight')
        if not cfg.get('tie_word_embeddings', False) and 'lm_head.weight' in self.hf:
            c.weight('output.weight', 'lm_head.weight')

        rope = rope_params(cfg)
        meta_cfg = dict(cfg)
        meta_cfg['rope_theta'] = rope.get('rope_theta', 10000.0)
        common_metadata(w, meta_cfg)
        w.add_expert_shared_feed_forward_length(cfg['shared_expert_intermediate_size'])
        w.add_ssm_conv_kernel(cfg['linear_conv_kernel_dim'])
        w.add_ssm_state_size(cfg['linear_key_head_dim'])
        w.add_ssm_group_count(cfg['linear_num_key_heads'])
        w.add_ssm_time_step_rank(cfg['linear_num_value_heads'])
        w.add_ssm_inner_size(cfg['linear_value_head_dim'] * cfg['linear_num_value_heads'])
        w.add_full_attention_interval(interval)
        head_dim = cfg.get('head_dim') or cfg['hidden_size'] // cfg['num_attention_heads']
        factor = cfg.get('partial_rotary_factor', rope.get('partial_rotary_factor', 0.25))
        w.add_rope_dimension_count(int(head_dim * factor))
        return w


def convert(c, out, split):
    return Hybrid(c, 'model.', tiled=False).run(out, split, 'qwen3next')
