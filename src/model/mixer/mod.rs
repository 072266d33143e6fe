//! The token mixers of a decoder layer: softmax attention (full, sliding, gated),
//! multi-head latent attention and Gated DeltaNet. Each runs on the backend against its
//! layer's slot of the [`crate::kv::SequenceState`].
//!
//! A mixer takes every sequence of a batched step at once: its projections run over all the
//! step's tokens (one weight read however many sequences there are), and only the part that
//! reads a sequence's own state (cache writes and attention, the convolution and delta rule)
//! runs per sequence, on that sequence's rows.

mod attention;
mod delta_net;
mod mla;

use super::forward::scratch;
use super::ModelError;
use crate::kv::{LayerState, SeqPages};
use ft_backend::{Backend, CopyDesc, DeviceBuffer, KvPages, StreamId};

/// One sequence's part of a batched mixer call: rows `offset..offset + len` of the step's
/// tokens, continuing after the `past` tokens its layer state already holds.
pub(crate) struct Span<'a> {
    /// The layer.
    pub layer: usize,
    /// The sequence's state for this layer.
    pub state: &'a mut LayerState,
    /// The sequence's pages (attention and latent rows).
    pub pages: Option<&'a SeqPages>,
    /// Tokens already in that state.
    pub past: usize,
    /// Its first row in the batch.
    pub offset: usize,
    /// Its rows in the batch.
    pub len: usize,
}

/// Rows `offset..offset + len` of a `[rows, width]` buffer, as a buffer of their own.
pub(crate) fn take_rows(be: &dyn Backend, src: &DeviceBuffer, offset: usize, len: usize, width: usize) -> Result<DeviceBuffer, ModelError> {
    let mut out = scratch(be, len * width)?;
    be.copy(StreamId::COMPUTE, src, &mut out, &CopyDesc { src_offset: offset * width, dst_offset: 0, len: len * width })?;
    Ok(out)
}

/// Writes `src` (`[len, width]`) into rows `offset..` of `dst`.
pub(crate) fn put_rows(be: &dyn Backend, src: &DeviceBuffer, dst: &mut DeviceBuffer, offset: usize, len: usize, width: usize) -> Result<(), ModelError> {
    be.copy(StreamId::COMPUTE, src, dst, &CopyDesc { src_offset: 0, dst_offset: offset * width, len: len * width })?;
    Ok(())
}

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

impl Span<'_> {
    /// The span's page table, for a layer whose rows are paged.
    pub(crate) fn page_table(&self, rows: usize) -> Result<KvPages<'_>, ModelError> {
        match (&*self.state, self.pages) {
            (LayerState::Paged, Some(p)) => Ok(KvPages { table: p.table(), page_rows: rows }),
            _ => Err(ModelError::Invalid(format!("layer {} has no paged cache in this sequence's state", self.layer))),
        }
    }
}

/// Writes the span's rows of `src` (`[batch rows, width]`, f32) into its pages of `dst`,
/// in `dst`'s dtype.
pub(crate) fn store_rows(be: &dyn Backend, src: &DeviceBuffer, dst: &mut DeviceBuffer, pages: &KvPages<'_>, sp: &Span<'_>, width: usize) -> Result<(), ModelError> {
    for (j, r, n) in pages.runs(sp.past, sp.past + sp.len)? {
        let desc = CopyDesc { src_offset: (sp.offset + j - sp.past) * width, dst_offset: r * width, len: n * width };
        be.store(src, dst, &desc)?;
    }
    Ok(())
}

/// Runs `f` on the span's rows of `q` (`q_width` values a row), writing its rows of `out`
/// (`out_width` a row): on the buffers themselves when the span is the whole batch (`single`),
/// else on copies of its rows.
#[allow(clippy::too_many_arguments)]
pub(crate) fn on_span_rows(
    be: &dyn Backend,
    sp: &Span<'_>,
    single: bool,
    q: &DeviceBuffer,
    q_width: usize,
    out: &mut DeviceBuffer,
    out_width: usize,
    f: impl FnOnce(&DeviceBuffer, &mut DeviceBuffer) -> Result<(), ModelError>,
) -> Result<(), ModelError> {
    if single {
        return f(q, out);
    }
    let qi = take_rows(be, q, sp.offset, sp.len, q_width)?;
    let mut oi = scratch(be, sp.len * out_width)?;
    f(&qi, &mut oi)?;
    put_rows(be, &oi, out, sp.offset, sp.len, out_width)
}
