//! The compressors of CSA and HCA layers (and of the lightning indexer): every `rate` tokens
//! become one entry, a softmax-gated sum of their projected rows. CSA windows overlap: entry
//! `w` also weighs the first half of window `w - 1`'s rows. Tokens of a window not yet complete
//! and the previous window's first half are carried in the sequence state between steps.

use super::hyper::rms_rows;
use super::rope::Rotary;
use crate::model::weights::Linear;

/// One compressor's weights and shape.
pub struct Compressor {
    /// `[coff·dim, hidden]` row projection.
    pub kv: Linear,
    /// `[coff·dim, hidden]` gate projection.
    pub gate: Linear,
    /// `[rate, coff·dim]` gate bias per slot of a window (`ape`).
    pub bias: Vec<f32>,
    /// `[dim]` RMSNorm of an entry.
    pub norm: Vec<f32>,
    /// Width of an entry.
    pub dim: usize,
    /// Tokens per entry.
    pub rate: usize,
    /// Windows overlap (CSA): each row holds two series, `coff = 2`.
    pub overlap: bool,
}

/// Floats of carried state a compressor needs: `rate` pending rows of raw `[kv | gate]`
/// (`2·coff·dim` each), then for overlapping windows `rate` rows of the last complete window's
/// first series `[kv | gate + bias]` (`2·dim` each).
pub fn carry_len(rate: usize, dim: usize, overlap: bool) -> usize {
    let coff = if overlap { 2 } else { 1 };
    rate * 2 * coff * dim + if overlap { rate * 2 * dim } else { 0 }
}

/// The carried state of one compressor, as read from the sequence state.
pub struct Carry {
    /// Pending rows, `[n, 2·coff·dim]` each (`n = tokens % rate`).
    pub pending: Vec<f32>,
    /// The previous window's first series, `[rate, 2·dim]`, once a window is complete.
    pub overlap: Option<Vec<f32>>,
}

/// What compressing new tokens produced.
pub struct Compressed {
    /// New entries `[n, dim]`, normalised and rotated.
    pub entries: Vec<f32>,
    /// The carry after these tokens.
    pub carry: Carry,
}

impl Compressor {
    fn coff(&self) -> usize {
        if self.overlap {
            2
        } else {
            1
        }
    }

    /// Offset of the overlap rows in the carry.
    pub fn overlap_offset(&self) -> usize {
        self.rate * 2 * self.coff() * self.dim
    }

    /// Width of a pending row.
    pub fn pending_row(&self) -> usize {
        2 * self.coff() * self.dim
    }

    /// Compresses new rows `kv`, `gate` (`[t, coff·dim]`, projections of the new tokens) after
    /// `past` tokens whose carry is `carry`.
    pub fn compress(&self, carry: Carry, kv: &[f32], gate: &[f32], past: usize, rope: &Rotary, eps: f32) -> Compressed {
        let (d, per, rate) = (self.dim, self.coff() * self.dim, self.rate);
        let mut rows = carry.pending;
        for (k, g) in kv.chunks(per).zip(gate.chunks(per)) {
            rows.extend_from_slice(k);
            rows.extend_from_slice(g);
        }
        let width = 2 * per;
        let total = rows.len() / width;
        let windows = total / rate;
        let first = past / rate;
        let mut overlap = carry.overlap;
        let mut entries = Vec::with_capacity(windows * d);
        for w in 0..windows {
            let row = |i: usize| &rows[(w * rate + i) * width..(w * rate + i + 1) * width];
            // Slots of this entry: `(kv, gate + bias)` per channel.
            let mut slots: Vec<(&[f32], Vec<f32>)> = Vec::with_capacity(2 * rate);
            let biased = |i: usize, from: usize| -> Vec<f32> {
                (0..d).map(|c| row(i)[per + from + c] + self.bias[i * per + from + c]).collect()
            };
            if self.overlap {
                if let Some(prev) = &overlap {
                    for i in 0..rate {
                        let r = &prev[i * 2 * d..(i + 1) * 2 * d];
                        slots.push((&r[..d], r[d..].to_vec()));
                    }
                }
                for i in 0..rate {
                    slots.push((&row(i)[d..2 * d], biased(i, d)));
                }
            } else {
                for i in 0..rate {
                    slots.push((&row(i)[..d], biased(i, 0)));
                }
            }
            let mut entry = vec![0f32; d];
            for (c, e) in entry.iter_mut().enumerate() {
                let max = slots.iter().map(|(_, g)| g[c]).fold(f32::NEG_INFINITY, f32::max);
                let (mut num, mut den) = (0f32, 0f32);
                for (k, g) in &slots {
                    let p = (g[c] - max).exp();
                    num += p * k[c];
                    den += p;
                }
                *e = num / den;
            }
            let mut entry = rms_rows(&entry, &self.norm, eps);
            rope.rotate(&mut entry, (first + w) * rate, 1.0);
            entries.extend(entry);
            if self.overlap {
                let mut next = Vec::with_capacity(rate * 2 * d);
                for i in 0..rate {
                    next.extend_from_slice(&row(i)[..d]);
                    next.extend(biased(i, 0));
                }
                overlap = Some(next);
            }
        }
        let pending = rows[windows * rate * width..].to_vec();
        Compressed { entries, carry: Carry { pending, overlap } }
    }
}
