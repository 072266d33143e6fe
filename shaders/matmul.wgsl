// out[t, j] = Σₚ x[t, p] · w[j, p] (+ bias[j]). One workgroup per (output row j, block of
// TB tokens): the weight row is read once per block, threads stride over k and a tree
// reduction combines their f32 partial sums.

struct Params {
    n: u32,
    k: u32,
    m: u32,
    x_off: u32,
    w_off: u32,
    b_off: u32,
    o_off: u32,
    has_bias: u32,
    tok_blocks: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<u32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

override WDT: u32 = 0u;
const WG: u32 = 64u;
const TB: u32 = 4u;

var<workgroup> red: array<f32, 256>; // WG × TB

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let g = group_index(wid, nwg);
    if (g >= p.m * p.tok_blocks) {
        return;
    }
    let j = g % p.m;
    let t0 = (g / p.m) * TB;
    let nt = min(TB, p.n - t0);
    var acc = array<f32, 4>(0.0, 0.0, 0.0, 0.0);
    let wrow = p.w_off + j * p.k;
    for (var q = lid; q < p.k; q += WG) {
        let wi = wrow + q;
        let wv = decode(w[word_of(wi, WDT)], wi, WDT);
        for (var t = 0u; t < nt; t++) {
            acc[t] += x[p.x_off + (t0 + t) * p.k + q] * wv;
        }
    }
    for (var t = 0u; t < TB; t++) {
        red[lid * TB + t] = acc[t];
    }
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            for (var t = 0u; t < TB; t++) {
                red[lid * TB + t] += red[(lid + s) * TB + t];
            }
        }
        workgroupBarrier();
    }
    if (lid < nt) {
        var v = red[lid];
        if (p.has_bias != 0u) {
            v += bias[p.b_off + j];
        }
        out[p.o_off + (t0 + lid) * p.m + j] = v;
    }
}
