//! The orders the int8 kernels that transpose their codes read a token's activations in
//! ([`super::kquants`], [`super::fp4::mxfp4_oct`]): whole 256-value blocks whose groups of
//! four values move together, so that byte `4l + e` of each register the kernel reads meets
//! the code in that byte.

#[cfg(doc)]
use super::{fp4::mxfp4_oct, kquants::{q4_k_blk, q6_k_blk}, q4_0_oct, Dot};

/// The sub-block whose sum lane `l` of [`Dot::q4_k_sums`] holds: the even sub-blocks (low
/// nibbles) in lanes 0..4, the odd ones in 4..8.
pub(super) const Q4K_LANES: [usize; 8] = [0, 2, 4, 6, 1, 3, 5, 7];

/// Where value `v` of a Q4_K block sits in [`q4_k_order`]: the block is read as eight
/// registers `L0, H0, … L3, H3` ([`q4_k_blk`]); byte `4l + b` of `L_i` (`H_i`) is value `4i + b`
/// (`4(i + 4) + b` for `l ≥ 4`) of sub-block `2(l mod 4)` (`2(l mod 4) + 1`).
const fn q4_k_slot(v: usize) -> usize {
    let (j, e) = (v / 32, v % 32);
    let (h, lane_in_half) = (j % 2, j / 2);
    let (i, upper, b) = ((e / 4) % 4, e / 16, e % 4);
    64 * i + 32 * h + 4 * (lane_in_half + 4 * upper) + b
}

/// Where value `v` of eight 32-value blocks (MXFP4, Q4_0: values `j` and `j + 16` in the low and
/// high nibbles of byte `j`) sits in [`blocks8_order`]: they are read as registers `lo_0, hi_0,
/// … lo_3, hi_3` ([`mxfp4_oct`], [`q4_0_oct`]); byte `4l + e` of `lo_i` (`hi_i`) is value
/// `4i + e` (`16 + 4i + e`) of block `l`.
const fn blocks8_slot(v: usize) -> usize {
    let (l, x) = (v / 32, v % 32);
    64 * (x % 16 / 4) + 32 * (x / 16) + 4 * l + x % 4
}

/// [`q4_k_slot`] for the crossed code registers ([`super::Isa::k4_crossed`]): in each 64
/// bytes, `A_i` takes the lower 16 bytes of `L_i` then the upper 16 of `H_i`, `B_i` the upper
/// 16 of `L_i` then the lower 16 of `H_i`.
const fn q4_k_crossed_slot(v: usize) -> usize {
    let slot = q4_k_slot(v);
    // 16-byte pieces `L_lo, L_hi, H_lo, H_hi` become `L_lo, H_hi, L_hi, H_lo`.
    const PIECE: [usize; 4] = [0, 2, 3, 1];
    slot / 64 * 64 + 16 * PIECE[slot % 64 / 16] + slot % 16
}

/// Where value `v` of eight Q8_0 blocks sits in [`q8_0_oct_order`]: byte `4l + e` of register
/// `i` ([`super::q8_0u_oct`]) is value `4i + e` of block `l`.
const fn q8_0_oct_slot(v: usize) -> usize {
    let (l, x) = (v / 32, v % 32);
    32 * (x / 4) + 4 * l + x % 4
}

/// The int8 orders of [`dword_moves`].
#[derive(Clone, Copy)]
enum Order {
    Q4K,
    Q4KCrossed,
    Q6K,
    Q6KZmm,
    Blocks8,
    Q8Oct,
}

/// Per group of four values of a 256-value block (which move together), the group `order`
/// places it at.
const fn dword_moves(order: Order) -> [u8; 64] {
    let mut m = [0u8; 64];
    let mut g = 0;
    while g < 64 {
        let slot = match order {
            Order::Q4K => q4_k_slot(4 * g),
            Order::Q4KCrossed => q4_k_crossed_slot(4 * g),
            Order::Q6K => q6_k_slot(4 * g),
            Order::Q6KZmm => q6_k_zmm_slot(4 * g),
            Order::Blocks8 => blocks8_slot(4 * g),
            Order::Q8Oct => q8_0_oct_slot(4 * g),
        };
        m[g] = (slot / 4) as u8;
        g += 1;
    }
    m
}

/// Moves each 256-value block's groups of four codes as `moves` says.
fn move_dwords(q: &mut [i8], moves: &[u8; 64]) {
    let mut tmp = [0u32; 64];
    for c in q.chunks_exact_mut(256) {
        for (g, &to) in moves.iter().enumerate() {
            tmp[to as usize] = u32::from_ne_bytes([c[4 * g], c[4 * g + 1], c[4 * g + 2], c[4 * g + 3]].map(|v| v as u8));
        }
        for (o, v) in c.chunks_exact_mut(4).zip(&tmp) {
            o.copy_from_slice(&v.to_ne_bytes().map(|b| b as i8));
        }
    }
}

/// Puts one token's int8 codes `q` in the order [`mxfp4_oct`] and [`q4_0_oct`] read: each whole
/// run of eight blocks as [`blocks8_slot`] places it, the blocks after the last run as they are.
pub(crate) fn blocks8_order(q: &mut [i8]) {
    const MOVES: [u8; 64] = dword_moves(Order::Blocks8);
    let whole = q.len() / 256 * 256;
    move_dwords(&mut q[..whole], &MOVES);
}

/// Puts one token's int8 codes `q` in the order [`super::q8_0u_oct`] reads: each whole run of
/// eight blocks as [`q8_0_oct_slot`] places it, the blocks after the last run as they are (for
/// [`super::q8_0u_blk`]).
pub(crate) fn q8_0_oct_order(q: &mut [i8]) {
    const MOVES: [u8; 64] = dword_moves(Order::Q8Oct);
    let whole = q.len() / 256 * 256;
    move_dwords(&mut q[..whole], &MOVES);
}

/// Puts each token's int8 codes `q` and scales `d` (one per 32 values) in the order
/// [`q4_k_blk`] reads: per 256-value block the codes as [`q4_k_slot`] places them (where
/// `crossed`, [`q4_k_crossed_slot`]: [`super::Isa::k4_crossed`]) and the eight scales in the
/// lane order of the sums ([`Q4K_LANES`]).
pub(crate) fn q4_k_order(q: &mut [i8], d: &mut [f32], crossed: bool) {
    const MOVES: [u8; 64] = dword_moves(Order::Q4K);
    const CROSSED: [u8; 64] = dword_moves(Order::Q4KCrossed);
    move_dwords(q, if crossed { &CROSSED } else { &MOVES });
    for g in d.chunks_exact_mut(8) {
        let natural = [g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7]];
        for (o, &j) in g.iter_mut().zip(&Q4K_LANES) {
            *o = natural[j];
        }
    }
}

/// Where value `v` of a Q6_K block sits in [`q6_k_order`]: each half of 128 values is read as
/// four registers `Z_0..Z_4` ([`q6_k_blk`]); byte `4l + b` of `Z_i` is value `4i + b` of the
/// half's sub-block [`Q4K_LANES`]`[l]`.
const fn q6_k_slot(v: usize) -> usize {
    let (half, sub, e) = (v / 128, v % 128 / 16, v % 16);
    let lane = sub / 2 + 4 * (sub % 2);
    128 * half + 32 * (e / 4) + 4 * lane + e % 4
}

/// Puts each token's int8 codes `q` in the order [`q6_k_blk`] reads ([`q6_k_slot`] per
/// 256-value block); the scales keep theirs.
pub(crate) fn q6_k_order(q: &mut [i8]) {
    const MOVES: [u8; 64] = dword_moves(Order::Q6K);
    move_dwords(q, &MOVES);
}

/// Where value `v` of a Q6_K block sits in [`q6_k_zmm_order`]: the block is read as four
/// 512-bit registers `Z_0..Z_3` ([`super::q6_k_zmm`]); byte `4l + b` of `Z_k` is value
/// `4k + b` of sub-block [`super::q6_k_zmm::SUB_OF_LANE`]`[l]` (lane `4c + r`: sub-block
/// `4r + c`).
const fn q6_k_zmm_slot(v: usize) -> usize {
    let (sub, k, b) = (v / 16, v % 16 / 4, v % 4);
    let (r, c) = (sub / 4, sub % 4);
    64 * k + 4 * (4 * c + r) + b
}

/// Puts each token's int8 codes `q` in the order [`super::q6_k_zmm`] reads
/// ([`q6_k_zmm_slot`] per 256-value block).
pub(crate) fn q6_k_zmm_order(q: &mut [i8]) {
    const MOVES: [u8; 64] = dword_moves(Order::Q6KZmm);
    move_dwords(q, &MOVES);
}
