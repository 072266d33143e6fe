// Rotary embedding in place. cos/sin come from a host table computed in f64 (one (cos, sin)
// pair per token and frequency), because f32 sin/cos of large angles (position 4095 and
// beyond) are far less accurate than the 1e-5 the model needs.

struct Params {
    n_tokens: u32,
    n_heads: u32,
    head_stride: u32,
    row_stride: u32,
    rot_offset: u32,
    half_dim: u32,
    interleaved: u32,
    total: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read> cs: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let idx = group_index(wid, nwg) * 64u + lid;
    if (idx >= p.total) {
        return;
    }
    let i = idx % p.half_dim;
    let h = (idx / p.half_dim) % p.n_heads;
    let t = idx / (p.half_dim * p.n_heads);
    let base = t * p.row_stride + h * p.head_stride + p.rot_offset;
    var ia = base + i;
    var ib = base + i + p.half_dim;
    if (p.interleaved != 0u) {
        ia = base + 2u * i;
        ib = ia + 1u;
    }
    let c = cs[(t * p.half_dim + i) * 2u];
    let s = cs[(t * p.half_dim + i) * 2u + 1u];
    let a = x[ia];
    let b = x[ib];
    x[ia] = a * c - b * s;
    x[ib] = b * c + a * s;
}
