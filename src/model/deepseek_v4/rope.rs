//! DeepSeek-V4's rotary embedding: pairs `(2i, 2i+1)` of the last `rotary_dim` channels of a
//! head rotate; the leading channels carry no position.

use crate::model::config::RopeConfig;

/// Inverse frequencies of one RoPE setting (`main` or `compress`).
pub struct Rotary {
    inv_freq: Vec<f32>,
    scaling: f32,
}

impl Rotary {
    /// The rotation of `rope` over heads of `head_dim` (the rotated width is
    /// `head_dim · partial_rotary_factor`, as transformers derives it from the config's head size).
    pub fn new(rope: &RopeConfig, head_dim: usize) -> Rotary {
        let dim = ((head_dim as f32 * rope.partial_rotary_factor) as usize) & !1;
        let (inv_freq, scaling) = crate::model::rope::inv_freq(rope, dim);
        Rotary { inv_freq, scaling }
    }

    /// Rotates one head in place at position `pos`; `sign` −1 undoes the rotation.
    pub fn rotate(&self, head: &mut [f32], pos: usize, sign: f32) {
        let n = self.inv_freq.len();
        let start = head.len() - 2 * n;
        for (i, f) in self.inv_freq.iter().enumerate() {
            // transformers computes the angle in f32.
            let angle = pos as f32 * f;
            let (c, s) = (angle.cos() * self.scaling, sign * angle.sin() * self.scaling);
            let (a, b) = (head[start + 2 * i], head[start + 2 * i + 1]);
            head[start + 2 * i] = a * c - b * s;
            head[start + 2 * i + 1] = b * c + a * s;
        }
    }

    /// Rotates each of the `head_dim`-wide heads of `x`.
    pub fn rotate_heads(&self, x: &mut [f32], head_dim: usize, pos: usize, sign: f32) {
        x.chunks_mut(head_dim).for_each(|h| self.rotate(h, pos, sign));
    }
}
