"""Qwen3.5/3.6-MoE (`qwen3_5_moe`) -> GGUF `qwen35moe`, as llama.cpp's convert_hf_to_gguf.py (class
Qwen3_5MoeTextModel: _LinearAttentionVReorderBase on Qwen3NextModel) writes the text model;
everything gguf_qwen3_next.py describes holds, and:

* the settings come from `text_config`, the tensors from `model.language_model.*` (the vision
  tower goes to a separate mmproj file, not written here);
* `in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a` -> `attn_qkv`, `attn_gate`, `ssm_beta`,
  `ssm_alpha`;
* with more value heads than key heads, every per-value-head tensor is reordered from grouped
  heads (key head g's r heads together) to tiled ones (`j·Hk + g`): the v rows of `attn_qkv`
  and of `ssm_conv1d`, the rows of `attn_gate`, `ssm_beta`, `ssm_alpha`, the values of `ssm_a`
  and `ssm_dt.bias`, and the columns of `ssm_out` (in heads of linear_value_head_dim);
* `rope.dimension_sections` = mrope_section padded to four ([11, 11, 10, 0] without one), and
  `nextn_predict_layers` when the checkpoint has MTP layers (none in the fixture)."""
from gguf_qwen3_next import Hybrid


class Qwen35(Hybrid):
    def projections(self, i, a):
        qk = 2 * self.nk * self.dk
        qkv = self.get(a + 'in_proj_qkv.weight')
        stored = qkv.copy()
        stored[qk:] = self.v(qkv[qk:], 0, self.dv)

        def back(d):
            d = d.copy()
            d[qk:] = self.v(d[qk:], 0, self.dv, inverse=True)
            return d
        self.matrix(f'blk.{i}.attn_qkv.weight', a + 'in_proj_qkv.weight', stored, back)
        for g, h, hd in (('attn_gate', 'in_proj_z', self.dv), ('ssm_beta', 'in_proj_b', 1), ('ssm_alpha', 'in_proj_a', 1)):
            self.matrix(f'blk.{i}.{g}.weight', a + f'{h}.weight', self.v(self.get(a + f'{h}.weight'), 0, hd),
                        lambda d, hd=hd: self.v(d, 0, hd, inverse=True))


def convert(c, out, split):
    root = c.cfg
    c.cfg = {**root, **root.get('text_config', {})}
    w = Qwen35(c, 'model.language_model.', tiled=True).run(out, split, 'qwen35moe')
    sections = list(c.cfg.get('rope_parameters', {}).get('mrope_section') or [11, 11, 10])
    w.add_rope_dimension_sections(sections + [0] * max(0, 4 - len(sections)))
    if c.cfg.get('mtp_num_hidden_layers'):
        w.add_nextn_predict_layers(c.cfg['mtp_num_hidden_layers'])
    return w
