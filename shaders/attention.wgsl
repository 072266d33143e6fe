// Causal attention against a KV cache: one workgroup per (query token, head). Keys are
// visited in chunks of WG with an online softmax (running max and denominator), so any
// kv_len works with fixed workgroup memory; a sink starts the running state as one extra
// logit with no value. A paged cache (page_rows > 0) is a pool: the sequence's row j lives at
// pool row pages[j / page_rows] * page_rows + j % page_rows.

struct Params {
    n_tokens: u32,
    n_heads: u32,
    n_kv_heads: u32,
    head_dim: u32,
    v_head_dim: u32,
    kv_len: u32,
    scale: f32,
    window: u32, // 0: none
    has_sinks: u32,
    k_base: u32,
    v_base: u32,
    page_rows: u32, // 0: contiguous
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> kc: array<u32>;
@group(0) @binding(3) var<storage, read> vc: array<u32>;
@group(0) @binding(4) var<storage, read> sinks: array<f32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;
@group(0) @binding(6) var<storage, read> pages: array<u32>;

override KDT: u32 = 0u;
override VDT: u32 = 0u;
const WG: u32 = 64u;
// Per-thread value accumulators: v_head_dim <= WG * VPT (checked on the host).
const VPT: u32 = 16u;

// head_dim <= 1024 (checked on the host).
var<workgroup> qs: array<f32, 1024>;
var<workgroup> pj: array<f32, 64>;
var<workgroup> red: array<f32, 64>;

fn load_k(i: u32) -> f32 {
    return decode(kc[word_of(i, KDT)], i, KDT);
}

fn load_v(i: u32) -> f32 {
    return decode(vc[word_of(i, VDT)], i, VDT);
}

// The cache row of the sequence's row j.
fn row(j: u32) -> u32 {
    if (p.page_rows == 0u) {
        return j;
    }
    return pages[j / p.page_rows] * p.page_rows + j % p.page_rows;
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let g = group_index(wid, nwg);
    if (g >= p.n_tokens * p.n_heads) {
        return;
    }
    let t = g / p.n_heads;
    let h = g % p.n_heads;
    let kvh = h / (p.n_heads / p.n_kv_heads);
    let pos = p.kv_len - p.n_tokens + t;
    var start = 0u;
    if (p.window > 0u) {
        start = pos + 1u - min(p.window, pos + 1u);
    }
    for (var d = lid; d < p.head_dim; d += WG) {
        qs[d] = q[g * p.head_dim + d];
    }
    workgroupBarrier();

    var m = NEG_BIG;
    var l = 0.0;
    if (p.has_sinks != 0u) {
        m = sinks[h];
        l = 1.0;
    }
    var acc: array<f32, 16>;
    for (var u = 0u; u < VPT; u++) {
        acc[u] = 0.0;
    }
    for (var c0 = start; c0 <= pos; c0 += WG) {
        let j = c0 + lid;
        var s = NEG_BIG;
        if (j <= pos) {
            let kb = p.k_base + (row(j) * p.n_kv_heads + kvh) * p.head_dim;
            var dot = 0.0;
            for (var d = 0u; d < p.head_dim; d++) {
                dot += qs[d] * load_k(kb + d);
            }
            s = dot * p.scale;
        }
        red[lid] = s;
        workgroupBarrier();
        for (var hh = WG / 2u; hh > 0u; hh >>= 1u) {
            if (lid < hh) {
                red[lid] = max(red[lid], red[lid + hh]);
            }
            workgroupBarrier();
        }
        let new_m = max(m, red[0]);
        workgroupBarrier();
        var e = 0.0;
        if (j <= pos) {
            e = exp(s - new_m);
        }
        pj[lid] = e;
        red[lid] = e;
        workgroupBarrier();
        for (var hh = WG / 2u; hh > 0u; hh >>= 1u) {
            if (lid < hh) {
                red[lid] += red[lid + hh];
            }
            workgroupBarrier();
        }
        let alpha = exp(m - new_m);
        l = l * alpha + red[0];
        m = new_m;
        let nj = min(WG, pos + 1u - c0);
        for (var u = 0u; u < VPT; u++) {
            let c = lid + u * WG;
            if (c < p.v_head_dim) {
                var a = acc[u] * alpha;
                for (var jj = 0u; jj < nj; jj++) {
                    a += pj[jj] * load_v(p.v_base + (row(c0 + jj) * p.n_kv_heads + kvh) * p.v_head_dim + c);
                }
                acc[u] = a;
            }
        }
        workgroupBarrier();
    }
    let inv = 1.0 / l;
    for (var u = 0u; u < VPT; u++) {
        let c = lid + u * WG;
        if (c < p.v_head_dim) {
            out[g * p.v_head_dim + c] = acc[u] * inv;
        }
    }
}
