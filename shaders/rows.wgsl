// Row movement: gather (embedding lookup, decoding narrow tables to f32), scatter-add
// (combining expert outputs into tokens), 16-bit copies at odd element offsets, and f32 values
// stored as f16 or bf16 (new rows of a narrow KV cache).

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
// so unaligned 16-bit writes need no atomics. TDT 0: the source holds 16-bit values (a copy);
// 1 or 2: it holds f32 values, stored as f16 or bf16 (a narrow KV cache's new rows).
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
            var half_v = (src16[se >> 1u] >> ((se & 1u) * 16u)) & 0xffffu;
            if (TDT == 1u) {
                half_v = f32_to_f16_bits(src16[se]);
            } else if (TDT == 2u) {
                half_v = f32_to_bf16_bits(src16[se]);
            }
            let sh = hh * 16u;
            v = (v & ~(0xffffu << sh)) | (half_v << sh);
        }
    }
    dst16[word] = v;
}

// Round to nearest even in integer arithmetic (pack2x16float leaves rounding and overflow to
// the implementation), f16 saturating at ±65504; the same steps as store_f16/store_bf16 in
// kernels/elementwise.cu.
fn f32_to_bf16_bits(b: u32) -> u32 {
    if ((b & 0x7fffffffu) > 0x7f800000u) {
        return (b >> 16u) | 0x40u;
    }
    return (b + 0x7fffu + ((b >> 16u) & 1u)) >> 16u;
}

fn f32_to_f16_bits(b: u32) -> u32 {
    let sign = (b >> 16u) & 0x8000u;
    let a = b & 0x7fffffffu;
    if (a > 0x7f800000u) {
        return sign | 0x7e00u;
    }
    if (a >= 0x477ff000u) {
        return sign | 0x7bffu; // saturate: a cache never holds infinity
    }
    if (a >= 0x38800000u) {
        let r = a - 0x38000000u;
        return sign | ((r + 0x0fffu + ((r >> 13u) & 1u)) >> 13u);
    }
    if (a < 0x33000000u) {
        return sign;
    }
    // A subnormal f16: the value in units of 2^-24, rounded.
    let shift = 126u - (a >> 23u);
    let mant = (a & 0x7fffffu) | 0x800000u;
    var q = mant >> shift;
    let rem = mant & ((1u << shift) - 1u);
    let half_unit = 1u << (shift - 1u);
    if (rem > half_unit || (rem == half_unit && (q & 1u) == 1u)) {
        q = q + 1u;
    }
    return sign | q;
}
