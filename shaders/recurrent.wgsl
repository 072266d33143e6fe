// Recurrent (Gated DeltaNet) layers: the short causal convolution and the gated delta rule.

struct Params {
    n_tokens: u32,
    channels: u32, // conv: channels; delta rule: value heads
    kernel: u32,   // conv: filter taps; delta rule: key heads
    silu: u32,
    dk: u32,
    dv: u32,
    l2_eps: f32,
    scale: f32,
}

@group(0) @binding(0) var<uniform> p: Params;

@group(0) @binding(1) var<storage, read> cx: array<f32>;
@group(0) @binding(2) var<storage, read> cw: array<u32>;
@group(0) @binding(3) var<storage, read_write> cstate: array<f32>;
@group(0) @binding(4) var<storage, read_write> cout: array<f32>;

override WDT: u32 = 0u;

// Row r of u = state rows followed by x rows, channel c.
fn conv_u(r: u32, c: u32) -> f32 {
    let hist = p.kernel - 1u;
    if (r < hist) {
        return cstate[r * p.channels + c];
    }
    return cx[(r - hist) * p.channels + c];
}

// One thread per channel walks the tokens; the channel's state is its own, so it is
// rewritten in place afterwards (row r takes row n + r, which lies later: ascending order
// never reads a row it already overwrote).
@compute @workgroup_size(64)
fn conv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let c = group_index(wid, nwg) * 64u + lid;
    if (c >= p.channels) {
        return;
    }
    for (var t = 0u; t < p.n_tokens; t++) {
        // Error-free products and sums (TwoProd/TwoSum): the reference sums in f64, and a
        // plain f32 sum of cancelling taps can miss its 1e-5 relative bound.
        var hi = 0.0;
        var lo = 0.0;
        for (var j = 0u; j < p.kernel; j++) {
            let wi = c * p.kernel + j;
            let a = decode(cw[word_of(wi, WDT)], wi, WDT);
            let b = conv_u(t + j, c);
            let prod = a * b;
            let perr = fma(a, b, -prod);
            let s = hi + prod;
            let bb = s - hi;
            let serr = (hi - (s - bb)) + (prod - bb);
            hi = s;
            lo += serr + perr;
        }
        let y = hi + lo;
        var r = y;
        if (p.silu != 0u) {
            r = y * sigmoid(y);
        }
        cout[t * p.channels + c] = r;
    }
    let hist = p.kernel - 1u;
    for (var r = 0u; r < hist; r++) {
        cstate[r * p.channels + c] = conv_u(p.n_tokens + r, c);
    }
}

@group(0) @binding(5) var<storage, read> qkv: array<f32>;
@group(0) @binding(6) var<storage, read> beta_in: array<f32>;
@group(0) @binding(7) var<storage, read> decay_in: array<f32>;
@group(0) @binding(8) var<storage, read> a_log: array<f32>;
@group(0) @binding(9) var<storage, read> dt_bias: array<f32>;
@group(0) @binding(10) var<storage, read_write> dstate: array<f32>;
@group(0) @binding(11) var<storage, read_write> dout: array<f32>;

const WG: u32 = 64u;
// k_head_dim <= 256 (checked on the host).
var<workgroup> qn: array<f32, 256>;
var<workgroup> kn: array<f32, 256>;
var<workgroup> red_q: array<f32, 64>;
var<workgroup> red_k: array<f32, 64>;

fn softplus(x: f32) -> f32 {
    if (x > 20.0) {
        return x;
    }
    return log(1.0 + exp(x));
}

// One workgroup per value head; each thread owns state columns j (all dk rows of them), so
// the recurrence needs barriers only around the shared, normalised q and k of each step.
@compute @workgroup_size(64)
fn delta_rule(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let h = group_index(wid, nwg);
    let hv = p.channels;
    let hk = p.kernel;
    if (h >= hv) {
        return;
    }
    let kh = h / (hv / hk);
    let row = 2u * hk * p.dk + hv * p.dv;
    let sbase = h * p.dk * p.dv;
    let neg_a = -exp(a_log[h]);
    for (var t = 0u; t < p.n_tokens; t++) {
        let r0 = t * row;
        var sq = 0.0;
        var sk = 0.0;
        for (var i = lid; i < p.dk; i += WG) {
            let qv = qkv[r0 + kh * p.dk + i];
            let kv = qkv[r0 + hk * p.dk + kh * p.dk + i];
            qn[i] = qv;
            kn[i] = kv;
            sq += qv * qv;
            sk += kv * kv;
        }
        red_q[lid] = sq;
        red_k[lid] = sk;
        workgroupBarrier();
        for (var s = WG / 2u; s > 0u; s >>= 1u) {
            if (lid < s) {
                red_q[lid] += red_q[lid + s];
                red_k[lid] += red_k[lid + s];
            }
            workgroupBarrier();
        }
        let inv_q = 1.0 / sqrt(red_q[0] + p.l2_eps) * p.scale;
        let inv_k = 1.0 / sqrt(red_k[0] + p.l2_eps);
        workgroupBarrier();
        for (var i = lid; i < p.dk; i += WG) {
            qn[i] = qn[i] * inv_q;
            kn[i] = kn[i] * inv_k;
        }
        workgroupBarrier();
        let beta = sigmoid(beta_in[t * hv + h]);
        let decay = exp(neg_a * softplus(decay_in[t * hv + h] + dt_bias[h]));
        for (var j = lid; j < p.dv; j += WG) {
            var mem = 0.0;
            for (var i = 0u; i < p.dk; i++) {
                let s = dstate[sbase + i * p.dv + j] * decay;
                dstate[sbase + i * p.dv + j] = s;
                mem += kn[i] * s;
            }
            let delta = (qkv[r0 + 2u * hk * p.dk + h * p.dv + j] - mem) * beta;
            var acc = 0.0;
            for (var i = 0u; i < p.dk; i++) {
                let s = dstate[sbase + i * p.dv + j] + kn[i] * delta;
                dstate[sbase + i * p.dv + j] = s;
                acc += qn[i] * s;
            }
            dout[(t * hv + h) * p.dv + j] = acc;
        }
        workgroupBarrier();
    }
}
