// Row movement: gather (embedding lookup, decoding narrow tables to f32), scatter-add
// (combining expert outputs into tokens) and 16-bit copies at odd element offsets.

struct Params {
    count: u32,    // gather: ids × cols; scatter: cols; copy16: destination words
    cols: u32,
    n_rows: u32,   // scatter: rows of x
    src_base: u32, // element offsets inside the bound windows
    dst_base: u32,
    len: u32,      // copy16: elements
}

@group(0) @binding(0) var<uniform> p: Params;

@group(0) @binding(1) var<storage, read> table: array<u32>;
@group(0) @binding(2) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> gathered: array<f32>;

override TDT: u32 = 0u;
const WG: u32 = 256u;

@compute @workgroup_size(256)
fn gather(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let i = group_index(wid, nwg) * WG + lid;
    if (i >= p.count) {
        return;
    }
    let r = i / p.cols;
    let c = i % p.cols;
    let e = p.src_base + ids[r] * p.cols + c;
    gathered[p.dst_base + i] = decode(table[word_of(e, TDT)], e, TDT);
}

@group(0) @binding(4) var<storage, read_write> acc: array<f32>;
@group(0) @binding(5) var<storage, read> xs: array<f32>;
@group(0) @binding(6) var<storage, read> rows: array<u32>;
@group(0) @binding(7) var<storage, read> scales: array<f32>;

// One thread per column walks the rows in order, so repeated destination rows add up in
// the same order as the reference without atomics.
@compute @workgroup_size(256)
fn scatter_add(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let c = group_index(wid, nwg) * WG + lid;
    if (c >= p.cols) {
        return;
    }
    for (var i = 0u; i < p.n_rows; i++) {
        let d = rows[i] * p.cols + c;
        acc[d] = acc[d] + scales[i] * xs[i * p.cols + c];
    }
}

@group(0) @binding(8) var<storage, read> src16: array<u32>;
@group(0) @binding(9) var<storage, read_write> dst16: array<u32>;

// Each thread owns one destination word and keeps the half that lies outside the range,
// so unaligned 16-bit copies need no atomics.
@compute @workgroup_size(256)
fn copy16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let wi = group_index(wid, nwg) * WG + lid;
    if (wi >= p.count) {
        return;
    }
    let word = (p.dst_base >> 1u) + wi;
    var v = dst16[word];
    for (var hh = 0u; hh < 2u; hh++) {
        let e = word * 2u + hh;
        if (e >= p.dst_base && e < p.dst_base + p.len) {
            let se = p.src_base + (e - p.dst_base);
            let half_v = (src16[se >> 1u] >> ((se & 1u) * 16u)) & 0xffffu;
            let sh = hh * 16u;
            v = (v & ~(0xffffu << sh)) | (half_v << sh);
        }
    }
    dst16[word] = v;
}
