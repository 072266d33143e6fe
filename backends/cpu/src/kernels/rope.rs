//! Rotary position embedding, in place.

use super::{need, shape_err};
use ft_backend::{Result, RopeDesc};
use rayon::prelude::*;
use rayon::ThreadPool;

/// Below this many rotated values the calling thread does the work alone.
const PARALLEL_MIN: usize = 1 << 15;

/// Applies [`RopeDesc`] to `x` in place (see [`ft_backend::reference::rope`] for the exact
/// arithmetic, which this matches bit for bit: angles in f64, rotation in f32).
///
/// Tokens run in parallel on `pool` when each token's rotated values lie inside its own
/// `row_stride` and there is enough work.
pub fn rope(pool: &ThreadPool, x: &mut [f32], d: &RopeDesc) -> Result<()> {
    let half = d.rotary_dim / 2;
    if !d.rotary_dim.is_multiple_of(2) {
        return Err(shape_err(format!("rotary_dim {} is odd", d.rotary_dim)));
    }
    if d.positions.len() < d.n_tokens {
        return Err(shape_err(format!(
            "{} positions for {} tokens",
            d.positions.len(),
            d.n_tokens
        )));
    }
    if d.inv_freq.len() < half {
        return Err(shape_err(format!(
            "{} inverse frequencies, need {half}",
            d.inv_freq.len()
        )));
    }
    if d.n_tokens == 0 || d.n_heads == 0 || half == 0 {
        return Ok(());
    }
    // Values touched by one token, counted from the token's first element.
    let span = need(d.n_heads - 1, d.head_stride, "rope head extent")?
        .checked_add(d.rot_offset)
        .and_then(|v| v.checked_add(d.rotary_dim))
        .ok_or_else(|| shape_err("rope head extent overflows"))?;
    let extent = need(d.n_tokens - 1, d.row_stride, "rope row extent")?.checked_add(span);
    if extent.is_none_or(|e| e > x.len()) {
        return Err(shape_err(format!(
            "rope over {} tokens × {} heads (row stride {}, head stride {}, offset {}, dim {}) exceeds {} values",
            d.n_tokens,
            d.n_heads,
            d.row_stride,
            d.head_stride,
            d.rot_offset,
            d.rotary_dim,
            x.len()
        )));
    }
    let work = d.n_tokens * d.n_heads * d.rotary_dim;
    if d.n_tokens > 1
        && span <= d.row_stride
        && work >= PARALLEL_MIN
        && pool.current_num_threads() > 1
    {
        let x = &mut x[..(d.n_tokens - 1) * d.row_stride + span];
        pool.install(|| {
            x.par_chunks_mut(d.row_stride).enumerate().for_each_init(
                || (vec![0f32; half], vec![0f32; half]),
                |(cos, sin), (t, row)| rotate_token(row, d, t, cos, sin),
            )
        });
    } else {
        let (mut cos, mut sin) = (vec![0f32; half], vec![0f32; half]);
        for t in 0..d.n_tokens {
            rotate_token(&mut x[t * d.row_stride..], d, t, &mut cos, &mut sin);
        }
    }
    Ok(())
}

/// Rotates every head of token `t`, whose first element is `row[0]`.
fn rotate_token(row: &mut [f32], d: &RopeDesc, t: usize, cos: &mut [f32], sin: &mut [f32]) {
    let half = cos.len();
    let pos = d.positions[t] as f64;
    for i in 0..half {
        let angle = pos * d.inv_freq[i] as f64;
        cos[i] = (angle.cos() as f32) * d.scaling;
        sin[i] = (angle.sin() as f32) * d.scaling;
    }
    for h in 0..d.n_heads {
        let seg = &mut row[h * d.head_stride + d.rot_offset..][..d.rotary_dim];
        if d.interleaved {
            for (p, (c, s)) in seg.chunks_exact_mut(2).zip(cos.iter().zip(sin.iter())) {
                let (a, b) = (p[0], p[1]);
                p[0] = a * c - b * s;
                p[1] = b * c + a * s;
            }
        } else {
            let (lo, hi) = seg.split_at_mut(half);
            for ((a, b), (c, s)) in lo
                .iter_mut()
                .zip(hi.iter_mut())
                .zip(cos.iter().zip(sin.iter()))
            {
                let (va, vb) = (*a, *b);
                *a = va * c - vb * s;
                *b = vb * c + va * s;
            }
        }
    }
}
