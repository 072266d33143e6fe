"""Converts a Hugging Face MoE checkpoint (the test fixtures, or `ft-actor synth` output) to GGUF
the way llama.cpp's convert_hf_to_gguf.py + llama-quantize lay it out, and writes its
dequantized f32 twin: a folder with the same config and tokenizer whose tensors are exactly the
values the GGUF decodes to (decoded by gguf-py's numpy reference, not by the engine).

usage: hf_to_gguf.py HF_DIR OUT.gguf TWIN_DIR TYPE [--split N] [--no-twin] [--fuse-gate-up] [--fuse-qkv]
TYPE: f32 f16 bf16 q8_0 q4_0 q4_k q5_k q6_k mxfp4, or q4_k_m (Q4_K with Q6_K for attn_v,
ffn_down and output, as llama.cpp's Q4_K_M mix). A weight whose rows are not whole blocks of
TYPE falls back to Q8_0 (or F16), as llama-quantize does. Only gguf-py and numpy are needed."""
import json, os, re, shutil, struct, sys
import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q

# --- safetensors reading (no torch) ---------------------------------------------------------

class LazyTensors:
    """Tensors of a safetensors folder, decoded to f32 only when read (a 16 GB bf16 checkpoint
    would not fit in memory as f32)."""

    def __init__(self, folder):
        self.index = {}
        for f in sorted(os.listdir(folder)):
            if not f.endswith('.safetensors'):
                continue
            p = os.path.join(folder, f)
            raw = np.memmap(p, dtype=np.uint8, mode='r')
            n = struct.unpack('<Q', bytes(raw[:8]))[0]
            hdr = json.loads(bytes(raw[8:8 + n]))
            for k, v in hdr.items():
                if k != '__metadata__':
                    a, b = v['data_offsets']
                    self.index[k] = (raw[8 + n + a:8 + n + b], v['dtype'], v['shape'])

    def __contains__(self, name):
        return name in self.index

    def __getitem__(self, name):
        buf, dt, shape = self.index[name]
        if dt == 'BF16':
            x = (np.frombuffer(buf, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif dt == 'F16':
            x = np.frombuffer(buf, dtype=np.float16).astype(np.float32)
        elif dt == 'F32':
            x = np.frombuffer(buf, dtype=np.float32).copy()
        else:
            raise SystemExit(f'{name}: dtype {dt} not handled')
        return x.reshape(shape)


def read_safetensors(folder):
    return LazyTensors(folder)


def write_safetensors(path, tensors):
    hdr, off, blobs = {}, 0, []
    for k in sorted(tensors):
        b = np.ascontiguousarray(tensors[k], dtype=np.float32).tobytes()
        hdr[k] = {'dtype': 'F32', 'shape': list(tensors[k].shape), 'data_offsets': [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(hdr).encode()
    h += b' ' * (-len(h) % 8)
    with open(path, 'wb') as f:
        f.write(struct.pack('<Q', len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)

# --- K-quant encoders (gguf-py decodes K-quants but cannot encode them) ------------------------

def f16(x):
    return np.asarray(x, dtype=np.float16)

def pack_scales_k4(sc, m):
    """8 six-bit scales and mins per block -> ggml's 12-byte packing (get_scale_min_k4)."""
    n = sc.shape[0]
    q = np.zeros((n, 12), dtype=np.uint8)
    for j in range(4):
        q[:, j] = (sc[:, j] & 63) | ((sc[:, j + 4] >> 4) << 6)
        q[:, j + 4] = (m[:, j] & 63) | ((m[:, j + 4] >> 4) << 6)
        q[:, j + 8] = (sc[:, j + 4] & 15) | ((m[:, j + 4] & 15) << 4)
    return q

def scale_min_blocks(x, qmax):
    """x [n, 256] -> per-32 scales/mins as 6-bit codes under f16 super-scales, and codes q."""
    xs = x.reshape(-1, 8, 32)
    lo = np.minimum(xs.min(axis=2), 0.0)
    hi = xs.max(axis=2)
    scale = (hi - lo) / qmax
    mins = -lo
    d = f16(scale.max(axis=1) / 63.0).astype(np.float32)
    dmin = f16(mins.max(axis=1) / 63.0).astype(np.float32)
    with np.errstate(divide='ignore', invalid='ignore'):
        sc = np.where(d[:, None] > 0, np.clip(np.round(scale / d[:, None]), 0, 63), 0).astype(np.uint8)
        mc = np.where(dmin[:, None] > 0, np.clip(np.round(mins / dmin[:, None]), 0, 63), 0).astype(np.uint8)
        step = d[:, None] * sc
        off = dmin[:, None] * mc
        q = np.where(step[:, :, None] > 0, np.round((xs + off[:, :, None]) / step[:, :, None]), 0)
    q = np.clip(q, 0, qmax).astype(np.uint8).reshape(-1, 256)
    return d, dmin, sc, mc, q

def quant_q4_k(x):
    d, dmin, sc, mc, q = scale_min_blocks(x, 15)
    qs = np.zeros((x.shape[0], 128), dtype=np.uint8)
    for c in range(4):
        qs[:, c * 32:(c + 1) * 32] = q[:, c * 64:c * 64 + 32] | (q[:, c * 64 + 32:c * 64 + 64] << 4)
    return np.concatenate([f16(d)[:, None].view(np.uint8), f16(dmin)[:, None].view(np.uint8), pack_scales_k4(sc, mc), qs], axis=1)

def quant_q5_k(x):
    d, dmin, sc, mc, q = scale_min_blocks(x, 31)
    qs = np.zeros((x.shape[0], 128), dtype=np.uint8)
    qh = np.zeros((x.shape[0], 32), dtype=np.uint8)
    for c in range(4):
        a, b = q[:, c * 64:c * 64 + 32], q[:, c * 64 + 32:c * 64 + 64]
        qs[:, c * 32:(c + 1) * 32] = (a & 15) | ((b & 15) << 4)
        qh |= ((a >> 4) << (2 * c)) | ((b >> 4) << (2 * c + 1))
    return np.concatenate([f16(d)[:, None].view(np.uint8), f16(dmin)[:, None].view(np.uint8), pack_scales_k4(sc, mc), qh, qs], axis=1)

def quant_q6_k(x):
    n = x.shape[0]
    xs = x.reshape(n, 16, 16)
    amax = np.abs(xs).max(axis=2)
    scale = amax / 31.0
    d = f16(scale.max(axis=1) / 127.0).astype(np.float32)
    with np.errstate(divide='ignore', invalid='ignore'):
        sc = np.where(d[:, None] > 0, np.clip(np.round(scale / d[:, None]), -128, 127), 0).astype(np.int8)
        step = d[:, None] * sc.astype(np.float32)
        q = np.where(step[:, :, None] != 0, np.round(xs / step[:, :, None]), 0)
    q = (np.clip(q, -32, 31) + 32).astype(np.uint8).reshape(n, 256)
    ql = np.zeros((n, 128), dtype=np.uint8)
    qh = np.zeros((n, 64), dtype=np.uint8)
    for h in range(2):
        v = q[:, h * 128:(h + 1) * 128]
        q1, q2, q3, q4 = v[:, 0:32], v[:, 32:64], v[:, 64:96], v[:, 96:128]
        ql[:, h * 64:h * 64 + 32] = (q1 & 15) | ((q3 & 15) << 4)
        ql[:, h * 64 + 32:h * 64 + 64] = (q2 & 15) | ((q4 & 15) << 4)
        qh[:, h * 32:(h + 1) * 32] = (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6)
    return np.concatenate([ql, qh, sc.view(np.uint8), f16(d)[:, None].view(np.uint8)], axis=1)

K_ENCODERS = {Q.Q4_K: quant_q4_k, Q.Q5_K: quant_q5_k, Q.Q6_K: quant_q6_k}

def quantize(x, qtype):
    """x [.., cols] f32 -> (bytes array as gguf-py stores it, dequantized twin)."""
    if qtype == Q.F32:
        return x.astype(np.float32), x.astype(np.float32)
    if qtype == Q.F16:
        h = x.astype(np.float16)
        return h, h.astype(np.float32)
    if qtype in K_ENCODERS:
        blocks = K_ENCODERS[qtype](x.reshape(-1, 256).astype(np.float32))
        data = blocks.reshape(*x.shape[:-1], x.shape[-1] // 256 * blocks.shape[1])
    else:
        data = gguf.quants.quantize(x.astype(np.float32), qtype)
    return data, gguf.quants.dequantize(data, qtype).reshape(x.shape).astype(np.float32)

# --- the architectures --------------------------------------------------------------------

TYPES = {'f32': Q.F32, 'f16': Q.F16, 'bf16': Q.BF16, 'q8_0': Q.Q8_0, 'q4_0': Q.Q4_0, 'q4_k': Q.Q4_K,
         'q5_k': Q.Q5_K, 'q6_k': Q.Q6_K, 'mxfp4': Q.MXFP4, 'q4_1': Q.Q4_1}

class Converter:
    """One conversion: the HF tensors, the GGUF tensors being written and the twin's values."""

    def __init__(self, src, kind):
        self.src, self.kind = src, kind
        self.cfg = json.load(open(os.path.join(src, 'config.json')))
        self.hf = read_safetensors(src)
        self.tensors = []  # (gguf name, data, raw qtype or None), until written
        self.twin = {}
        self.keep_twin = True
        self.fuse_gate_up = False
        self.fuse_qkv = False
        self.qkv_parts = {}
        self.w = None  # the writer, once `write` has opened it

    def emit(self, gname, data, raw):
        """Queues a tensor; without a twin (big benchmark files) it goes to the writer's temporary
        file at once, so memory holds one tensor at a time."""
        if self.w is not None and not self.keep_twin:
            self.w.add_tensor(gname, data, raw_dtype=raw)
        else:
            self.tensors.append((gname, data, raw))

    def keep(self, name, values):
        """Records the values the file decodes to for the twin (not kept with --no-twin)."""
        if self.keep_twin:
            self.twin[name] = values

    def weight_type(self, gname, cols):
        kind = self.kind
        if kind == 'q4_k_m':
            t = Q.Q6_K if gname == 'output.weight' or (any(s in gname for s in ('attn_v.', 'ffn_down')) and self.more_bits(gname)) else Q.Q4_K
        elif kind == 'bf16':
            t = Q.BF16
        else:
            t = TYPES[kind]
        bs = gguf.GGML_QUANT_SIZES[t][0]
        if cols % bs:
            t = Q.Q8_0 if cols % 32 == 0 else Q.F16
        return t

    def more_bits(self, gname):
        """llama-quantize's `use_more_bits`: Q4_K_M gives these layers' attn_v/ffn_down Q6_K."""
        n = self.cfg['num_hidden_layers']
        i = int(gname.split('.')[1])
        return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2

    def plain(self, gname, hname_or_array, twin_name=None):
        """An unquantized F32 tensor (norms, biases, routers: llama-quantize leaves them)."""
        x = self.hf[hname_or_array] if isinstance(hname_or_array, str) else hname_or_array
        x = np.ascontiguousarray(x, dtype=np.float32)
        if self.fused_qkv_part(gname, x, twin_name or hname_or_array, None):
            return
        self.emit(gname, x, None)
        self.keep(twin_name or hname_or_array, x)

    def fused_qkv_part(self, gname, x, hname, permute_heads):
        """With `fuse_qkv` (llama.cpp's --fuse-qkv), buffers a layer's attn_q/k/v weight or bias
        and, once all three are there, writes them as one `attn_qkv` (rows q, k, v; llama's q/k
        already permuted) and keeps each part's decoded values for the twin. True if buffered."""
        m = re.match(r'blk\.(\d+)\.attn_([qkv])\.(weight|bias)$', gname) if self.fuse_qkv else None
        if not m:
            return False
        key = (m.group(1), m.group(3))
        parts = self.qkv_parts.setdefault(key, {})
        parts[m.group(2)] = (x, hname, permute_heads)
        if len(parts) < 3:
            return True
        del self.qkv_parts[key]
        xs = [parts[p][0] for p in 'qkv']
        fused = np.concatenate(xs, axis=0)
        name = f'blk.{key[0]}.attn_qkv.{key[1]}'
        if key[1] == 'bias':
            self.emit(name, fused, None)
            deq = fused
        else:
            deq = self.stored(name, fused)
        at = 0
        for p, xp in zip('qkv', xs):
            part = deq[at:at + xp.shape[0]]
            at += xp.shape[0]
            _, hn, heads = parts[p]
            if heads:
                r, c = part.shape
                part = part.reshape(heads, r // heads // 2, 2, c).swapaxes(1, 2).reshape(r, c)
            self.keep(hn, part)
        return True

    def stored(self, gname, x):
        """Quantizes `x` as the file's type for `gname`; returns the values the file decodes to."""
        t = self.weight_type(gname, x.shape[-1])
        if t == Q.BF16:
            data = (np.ascontiguousarray(x, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)
            self.emit(gname, data, Q.BF16)
            return (data.astype(np.uint32) << 16).view(np.float32)
        data, deq = quantize(x, t)
        self.emit(gname, data, t if t not in (Q.F32, Q.F16) else None)
        return deq

    def weight(self, gname, hname, permute_heads=None):
        """A weight matrix; with `permute_heads`, rows reordered as llama.cpp does for llama q/k."""
        x = self.hf[hname].astype(np.float32)
        if permute_heads:
            r, c = x.shape
            x = x.reshape(permute_heads, 2, r // permute_heads // 2, c).swapaxes(1, 2).reshape(r, c)
        if self.fused_qkv_part(gname, x, hname, permute_heads):
            return
        deq = self.stored(gname, x)
        if permute_heads:
            r, c = deq.shape
            deq = deq.reshape(permute_heads, r // permute_heads // 2, 2, c).swapaxes(1, 2).reshape(r, c)
        self.keep(hname, deq)

    def experts(self, gname, hnames):
        """Per-expert HF matrices stacked into one `[E, rows, cols]` GGUF tensor. With
        `fuse_gate_up` (llama.cpp's --fuse-gate-up-exps), a layer's gate and up experts become one
        `ffn_gate_up_exps [E, 2I, H]`, each expert's gate rows then its up rows."""
        x = np.stack([self.hf[n].astype(np.float32) for n in hnames])
        if self.fuse_gate_up and gname.endswith('ffn_gate_exps.weight'):
            self.pending_gate = (gname, hnames, x)
            return
        if self.fuse_gate_up and gname.endswith('ffn_up_exps.weight'):
            ggname, ghnames, gx = self.pending_gate
            assert ggname == gname.replace('_up_', '_gate_'), (ggname, gname)
            deq = self.stored(gname.replace('ffn_up_exps', 'ffn_gate_up_exps'), np.concatenate([gx, x], axis=1))
            rows = gx.shape[1]
            for e, n in enumerate(ghnames):
                self.keep(n, deq[e, :rows])
            for e, n in enumerate(hnames):
                self.keep(n, deq[e, rows:])
            return
        deq = self.stored(gname, x)
        for e, n in enumerate(hnames):
            self.keep(n, deq[e])

    def write(self, out, arch, split):
        """Opens the writer (before or after the tensors are queued)."""
        self.split = split
        w = gguf.GGUFWriter(out, arch, use_temp_file=not self.keep_twin)
        w.add_name(os.path.basename(os.path.normpath(self.src)))
        self.w = w
        return w

    def finish(self, w, twin_dir):
        write_tokenizer(w, self.src, self.cfg)
        if self.split > 1:
            w.split_max_tensors = (len(self.tensors) + self.split - 1) // self.split
        for gname, data, raw in self.tensors:
            w.add_tensor(gname, data, raw_dtype=raw)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        if not self.keep_twin:
            return
        os.makedirs(twin_dir, exist_ok=True)
        for f in os.listdir(self.src):
            if not f.endswith('.safetensors') and f != 'model.safetensors.index.json':
                shutil.copyfile(os.path.join(self.src, f), os.path.join(twin_dir, f))
        write_safetensors(os.path.join(twin_dir, 'model.safetensors'), self.twin)


def common_metadata(w, cfg):
    """The keys llama.cpp's TextModel.set_gguf_parameters writes for every family."""
    nh = cfg['num_attention_heads']
    w.add_block_count(cfg['num_hidden_layers'])
    w.add_context_length(cfg.get('max_position_embeddings', 4096))
    w.add_embedding_length(cfg['hidden_size'])
    w.add_feed_forward_length(cfg.get('intermediate_size', 0))
    w.add_head_count(nh)
    w.add_head_count_kv(cfg.get('num_key_value_heads', nh))
    if cfg.get('head_dim'):
        w.add_key_length(cfg['head_dim'])
        w.add_value_length(cfg['head_dim'])
    w.add_rope_freq_base(cfg.get('rope_theta', 10000.0))
    w.add_layer_norm_rms_eps(cfg.get('rms_norm_eps', 1e-6))
    w.add_expert_count(cfg.get('num_experts') or cfg.get('num_local_experts') or cfg.get('n_routed_experts'))
    w.add_expert_used_count(cfg['num_experts_per_tok'])
    if cfg.get('moe_intermediate_size'):
        w.add_expert_feed_forward_length(cfg['moe_intermediate_size'])
    w.add_vocab_size(cfg['vocab_size'])


def convert_qwen_or_mixtral(c, out, split):
    """qwen3_moe -> qwen3moe, qwen2_moe -> qwen2moe, mixtral -> llama (q/k rows permuted)."""
    cfg, hf = c.cfg, c.hf
    arch = {'qwen3_moe': 'qwen3moe', 'qwen2_moe': 'qwen2moe', 'mixtral': 'llama'}[cfg['model_type']]
    nh = cfg['num_attention_heads']
    nkv = cfg.get('num_key_value_heads', nh)
    E = cfg.get('num_experts') or cfg.get('num_local_experts')
    w = c.write(out, arch, split)
    c.weight('token_embd.weight', 'model.embed_tokens.weight')
    for i in range(cfg['num_hidden_layers']):
        p = f'model.layers.{i}.'
        c.plain(f'blk.{i}.attn_norm.weight', p + 'input_layernorm.weight')
        c.plain(f'blk.{i}.ffn_norm.weight', p + 'post_attention_layernorm.weight')
        for g, h in (('q', 'q'), ('k', 'k'), ('v', 'v'), ('output', 'o')):
            heads = {'q': nh, 'k': nkv}.get(g) if arch == 'llama' else None
            c.weight(f'blk.{i}.attn_{g}.weight', p + f'self_attn.{h}_proj.weight', permute_heads=heads)
            if p + f'self_attn.{h}_proj.bias' in hf:
                c.plain(f'blk.{i}.attn_{g}.bias', p + f'self_attn.{h}_proj.bias')
        for g in ('q', 'k'):
            if p + f'self_attn.{g}_norm.weight' in hf:
                c.plain(f'blk.{i}.attn_{g}_norm.weight', p + f'self_attn.{g}_norm.weight')
        moe = 'block_sparse_moe.' if arch == 'llama' else 'mlp.'
        if p + moe + 'gate.weight' in hf:
            c.plain(f'blk.{i}.ffn_gate_inp.weight', p + moe + 'gate.weight')
            names = (('gate', 'w1'), ('up', 'w3'), ('down', 'w2')) if arch == 'llama' else (('gate', 'gate_proj'), ('up', 'up_proj'), ('down', 'down_proj'))
            for g, h in names:
                c.experts(f'blk.{i}.ffn_{g}_exps.weight', [p + moe + f'experts.{e}.{h}.weight' for e in range(E)])
            if p + 'mlp.shared_expert_gate.weight' in hf:
                c.plain(f'blk.{i}.ffn_gate_inp_shexp.weight', p + 'mlp.shared_expert_gate.weight')
                for g in ('gate', 'up', 'down'):
                    c.weight(f'blk.{i}.ffn_{g}_shexp.weight', p + f'mlp.shared_expert.{g}_proj.weight')
        else:
            for g in ('gate', 'up', 'down'):
                c.weight(f'blk.{i}.ffn_{g}.weight', p + f'mlp.{g}_proj.weight')
    c.plain('output_norm.weight', 'model.norm.weight')
    if 'lm_head.weight' in hf:
        c.weight('output.weight', 'lm_head.weight')
    common_metadata(w, cfg)
    if cfg.get('shared_expert_intermediate_size'):
        w.add_expert_shared_feed_forward_length(cfg['shared_expert_intermediate_size'])
    return w


# model_type -> converter; other families live in gguf_<model_type>.py beside this file and
# export `convert(converter, out, split) -> GGUFWriter` (with metadata written, tensors queued).
CONVERTERS = {'qwen3_moe': convert_qwen_or_mixtral, 'qwen2_moe': convert_qwen_or_mixtral, 'mixtral': convert_qwen_or_mixtral}


def main():
    args = sys.argv[1:]
    split = 0
    if '--split' in args:
        i = args.index('--split')
        split = int(args[i + 1])
        del args[i:i + 2]
    no_twin = '--no-twin' in args
    if no_twin:
        args.remove('--no-twin')
    fuse = '--fuse-gate-up' in args
    if fuse:
        args.remove('--fuse-gate-up')
    fuse_qkv = '--fuse-qkv' in args
    if fuse_qkv:
        args.remove('--fuse-qkv')
    src, out, twin_dir, kind = args
    c = Converter(src, kind)
    c.keep_twin = not no_twin
    c.fuse_gate_up = fuse
    c.fuse_qkv = fuse_qkv
    mt = c.cfg['model_type']
    convert = CONVERTERS.get(mt)
    if convert is None:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        convert = __import__(f'gguf_{mt}').convert
    w = convert(c, out, split)
    c.finish(w, twin_dir)


def write_tokenizer(w, src, cfg):
    tok = json.load(open(os.path.join(src, 'tokenizer.json')))
    tcfg_path = os.path.join(src, 'tokenizer_config.json')
    tcfg = json.load(open(tcfg_path)) if os.path.exists(tcfg_path) else {}
    vocab = dict(tok['model']['vocab'])
    special = {}
    for a in tok.get('added_tokens', []):
        vocab[a['content']] = a['id']
        special[a['id']] = a.get('special', False)
    V = cfg['vocab_size']
    tokens = [f'[PAD{i}]' for i in range(V)]
    types = [gguf.TokenType.USER_DEFINED] * V
    for t, i in vocab.items():
        if i < V:
            tokens[i] = t
            types[i] = (gguf.TokenType.CONTROL if special[i] else gguf.TokenType.USER_DEFINED) if i in special else gguf.TokenType.NORMAL
    merges = [m if isinstance(m, str) else ' '.join(m) for m in tok['model'].get('merges', [])]
    w.add_tokenizer_model('gpt2')
    w.add_tokenizer_pre('qwen2')
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    if cfg.get('eos_token_id') is not None:
        w.add_eos_token_id(cfg['eos_token_id'] if isinstance(cfg['eos_token_id'], int) else cfg['eos_token_id'][0])
    if cfg.get('bos_token_id') is not None:
        w.add_bos_token_id(cfg['bos_token_id'])
    w.add_add_bos_token(bool(tcfg.get('add_bos_token', False)))
    template = tcfg.get('chat_template')
    jinja = os.path.join(src, 'chat_template.jinja')
    if os.path.exists(jinja):
        template = open(jinja).read()
    if template:
        w.add_chat_template(template)

if __name__ == '__main__':
    main()
