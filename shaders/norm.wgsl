// Row-wise RMSNorm: one workgroup per row; the sum of squares is reduced in f32.

struct Params {
    rows: u32,
    dim: u32,
    eps: f32,
    unit_offset: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

override WDT: u32 = 0u;
const WG: u32 = 64u;

var<workgroup> red: array<f32, 64>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let r = group_index(wid, nwg);
    if (r >= p.rows) {
        return;
    }
    let base = r * p.dim;
    var s = 0.0;
    for (var c = lid; c < p.dim; c += WG) {
        let v = x[base + c];
        s += v * v;
    }
    red[lid] = s;
    workgroupBarrier();
    for (var h = WG / 2u; h > 0u; h >>= 1u) {
        if (lid < h) {
            red[lid] += red[lid + h];
        }
        workgroupBarrier();
    }
    // sqrt then divide: inverseSqrt may be a low-precision estimate on some drivers.
    let inv = 1.0 / sqrt(red[0] / f32(p.dim) + p.eps);
    for (var c = lid; c < p.dim; c += WG) {
        var g = decode(w[word_of(c, WDT)], c, WDT);
        if (p.unit_offset != 0u) {
            g = 1.0 + g;
        }
        out[base + c] = (x[base + c] * inv) * g;
    }
}
