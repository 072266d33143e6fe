// Element-wise ops (binary, scale) and the row-wise softmax.

struct Params {
    n: u32,
    op: u32,    // binary: 0 add, 1 mul, 2 mul_sigmoid, 3 swiglu, 4 clamped swiglu, 5 limited swiglu
    f0: f32,    // scale factor, or clamped SwiGLU's alpha
    f1: f32,    // clamped SwiGLU's limit
    cols: u32,  // softmax row length
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;

const WG: u32 = 256u;

@compute @workgroup_size(256)
fn binary(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let i = group_index(wid, nwg) * WG + lid;
    if (i >= p.n) {
        return;
    }
    let x = a[i];
    let y = b[i];
    var r: f32;
    switch p.op {
        case 0u: { r = x + y; }
        case 1u: { r = x * y; }
        case 2u: { r = x * sigmoid(y); }
        case 3u: { r = x * sigmoid(x) * y; }
        case 5u: {
            let gl = min(x, p.f1);
            r = gl * sigmoid(gl) * clamp(y, -p.f1, p.f1);
        }
        default: {
            let gg = min(x, p.f1);
            let uu = clamp(y, -p.f1, p.f1);
            r = gg * sigmoid(p.f0 * gg) * (uu + 1.0);
        }
    }
    a[i] = r;
}

@compute @workgroup_size(256)
fn scale(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) lid: u32) {
    let i = group_index(wid, nwg) * WG + lid;
    if (i >= p.n) {
        return;
    }
    a[i] = a[i] * p.f0;
}

var<workgroup> red: array<f32, 256>;

// One workgroup per row (p.n rows of p.cols).
@compute @workgroup_size(256)
fn softmax(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lid: u32) {
    let r = group_index(wid, nwg);
    if (r >= p.n) {
        return;
    }
    let base = r * p.cols;
    var mx = NEG_BIG;
    for (var c = lid; c < p.cols; c += WG) {
        mx = max(mx, a[base + c]);
    }
    red[lid] = mx;
    workgroupBarrier();
    for (var h = WG / 2u; h > 0u; h >>= 1u) {
        if (lid < h) {
            red[lid] = max(red[lid], red[lid + h]);
        }
        workgroupBarrier();
    }
    let row_max = red[0];
    workgroupBarrier();
    var s = 0.0;
    for (var c = lid; c < p.cols; c += WG) {
        s += exp(a[base + c] - row_max);
    }
    red[lid] = s;
    workgroupBarrier();
    for (var h = WG / 2u; h > 0u; h >>= 1u) {
        if (lid < h) {
            red[lid] += red[lid + h];
        }
        workgroupBarrier();
    }
    let inv = 1.0 / red[0];
    for (var c = lid; c < p.cols; c += WG) {
        a[base + c] = exp(a[base + c] - row_max) * inv;
    }
}
