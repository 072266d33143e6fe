//! The token mixers of a decoder layer: softmax attention (full, sliding, gated),
//! multi-head latent attention and Gated DeltaNet. Each runs on the backend against its
//! layer's slot of the [`crate::kv::SequenceState`].

mod attention;
mod delta_net;
mod mla;

use super::forward::scratch;
use super::ModelError;
use ft_backend::{Backend, DeviceBuffer};

/// Greatest common divisor (`gcd(0, b) = b`).
pub(crate) fn gcd(a: usize, b: usize) -> usize {
    if a == 0 {
        b
    } else {
        gcd(b % a, a)
    }
}

/// Rearranges `src` on the device: viewed as rows of `unit` values, row `ids[i]` becomes row
/// `i` of the result. Head splits, interleaves and transposes are all this one gather.
pub(crate) fn gather_units(
    be: &dyn Backend,
    src: &DeviceBuffer,
    ids: impl Iterator<Item = usize>,
    unit: usize,
) -> Result<DeviceBuffer, ModelError> {
    let ids = ids
        .map(|i| u32::try_from(i).map_err(|_| ModelError::Invalid(format!("row index {i} does not fit 32 bits"))))
        .collect::<Result<Vec<u32>, _>>()?;
    let mut out = scratch(be, ids.len() * unit)?;
    be.gather_rows(src, &ids, unit, &mut out)?;
    Ok(out)
}
