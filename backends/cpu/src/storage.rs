//! Host memory behind the CPU backend's device buffers, and the checked views kernels use.

use ft_backend::{BackendError, BufferStorage, DType, DeviceBuffer, HostBytes, Result};
use std::alloc::{alloc_zeroed, Layout};
use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// One cache line; owned buffers are vectors of these, so every owned buffer is 64-byte
/// aligned (full-width AVX-512 rows never straddle lines at the start).
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Line([u8; 64]);

// SAFETY: a plain byte array with no padding (size 64 == alignment 64).
unsafe impl bytemuck::Zeroable for Line {}
// SAFETY: as above; every bit pattern is valid.
unsafe impl bytemuck::Pod for Line {}

/// Memory allocated by the backend; returns its bytes to the backend's account on drop.
pub(crate) struct Owned {
    lines: Vec<Line>,
    len: usize,
    account: Arc<AtomicU64>,
}

impl Owned {
    /// Zeroed memory for `len` bytes, charged to `account`; `None` if the allocator refuses.
    pub(crate) fn zeroed(len: usize, account: Arc<AtomicU64>) -> Option<Owned> {
        let n = len.div_ceil(64);
        let lines = if n == 0 {
            Vec::new()
        } else {
            let layout = Layout::array::<Line>(n).ok()?;
            // SAFETY: `layout` has non-zero size; a null return is handled; the allocation is
            // made with exactly the layout `Vec<Line>` uses for capacity `n`, and zeroed bytes
            // are valid `Line`s.
            unsafe {
                let p = alloc_zeroed(layout) as *mut Line;
                if p.is_null() {
                    return None;
                }
                Vec::from_raw_parts(p, n, n)
            }
        };
        account.fetch_add((n * 64) as u64, Ordering::Relaxed);
        Some(Owned {
            lines,
            len,
            account,
        })
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        self.account
            .fetch_sub((self.lines.len() * 64) as u64, Ordering::Relaxed);
    }
}

/// What a CPU [`DeviceBuffer`] holds.
pub(crate) enum CpuStorage {
    /// Backend-allocated, writable memory.
    Owned(Owned),
    /// Host bytes used in place (e.g. a memory-mapped checkpoint); read-only.
    Imported(HostBytes),
}

impl BufferStorage for CpuStorage {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}

impl CpuStorage {
    fn bytes(&self) -> &[u8] {
        match self {
            CpuStorage::Owned(o) => &bytemuck::cast_slice::<Line, u8>(&o.lines)[..o.len],
            CpuStorage::Imported(h) => h.as_slice(),
        }
    }
}

fn foreign(what: &str) -> BackendError {
    BackendError::Invalid(format!("{what} was not made by the CPU backend"))
}

/// The bytes of `buf` (exactly `buf.size_bytes()` of them).
pub(crate) fn bytes<'a>(buf: &'a DeviceBuffer, what: &str) -> Result<&'a [u8]> {
    let s = buf.storage::<CpuStorage>().ok_or_else(|| foreign(what))?;
    s.bytes()
        .get(..buf.size_bytes())
        .ok_or_else(|| BackendError::Invalid(format!("{what}: storage shorter than its length")))
}

/// The bytes of `buf` for writing; imported (read-only) buffers are refused.
pub(crate) fn bytes_mut<'a>(buf: &'a mut DeviceBuffer, what: &str) -> Result<&'a mut [u8]> {
    let size = buf.size_bytes();
    match buf.storage_mut::<CpuStorage>() {
        None => Err(foreign(what)),
        Some(CpuStorage::Imported(_)) => Err(BackendError::Invalid(format!(
            "{what} is an imported, read-only buffer"
        ))),
        Some(CpuStorage::Owned(o)) => bytemuck::cast_slice_mut::<Line, u8>(&mut o.lines)
            .get_mut(..size)
            .ok_or_else(|| {
                BackendError::Invalid(format!("{what}: storage shorter than its length"))
            }),
    }
}

/// Fails with a dtype error unless `buf` holds `want`.
pub(crate) fn expect_dtype(buf: &DeviceBuffer, want: DType, what: &'static str) -> Result<()> {
    if buf.dtype() == want {
        Ok(())
    } else {
        Err(BackendError::DType {
            expected: want,
            got: buf.dtype(),
            what,
        })
    }
}

/// `len` f32 values of `buf` from element `offset`. Borrowed in place when aligned (always
/// for owned buffers); an imported buffer at an address not divisible by 4 is copied, which
/// only activations or norm weights imported from odd file offsets ever hit.
pub(crate) fn f32s<'a>(
    buf: &'a DeviceBuffer,
    offset: usize,
    len: usize,
    what: &'static str,
) -> Result<Cow<'a, [f32]>> {
    expect_dtype(buf, DType::F32, what)?;
    let b = range(bytes(buf, what)?, offset, len, 4, what)?;
    Ok(match bytemuck::try_cast_slice::<u8, f32>(b) {
        Ok(s) => Cow::Borrowed(s),
        Err(_) => Cow::Owned(
            b.chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        ),
    })
}

/// `len` f32 values of `buf` from element `offset`, writable.
pub(crate) fn f32s_mut<'a>(
    buf: &'a mut DeviceBuffer,
    offset: usize,
    len: usize,
    what: &'static str,
) -> Result<&'a mut [f32]> {
    expect_dtype(buf, DType::F32, what)?;
    let b = bytes_mut(buf, what)?;
    let b = range_mut(b, offset, len, 4, what)?;
    // Owned buffers are 64-byte aligned, so this cast cannot fail; map it to an error anyway.
    bytemuck::try_cast_slice_mut(b).map_err(|e| BackendError::Invalid(format!("{what}: {e}")))
}

/// Bytes of elements `offset .. offset + len` (element size `es`), or a shape error.
pub(crate) fn range<'a>(
    b: &'a [u8],
    offset: usize,
    len: usize,
    es: usize,
    what: &str,
) -> Result<&'a [u8]> {
    let (start, end) = span(offset, len, es, what)?;
    b.get(start..end)
        .ok_or_else(|| out_of_range(what, offset, len, b.len() / es))
}

pub(crate) fn range_mut<'a>(
    b: &'a mut [u8],
    offset: usize,
    len: usize,
    es: usize,
    what: &str,
) -> Result<&'a mut [u8]> {
    let (start, end) = span(offset, len, es, what)?;
    let have = b.len() / es;
    b.get_mut(start..end)
        .ok_or_else(|| out_of_range(what, offset, len, have))
}

fn span(offset: usize, len: usize, es: usize, what: &str) -> Result<(usize, usize)> {
    let end = offset.checked_add(len).and_then(|e| e.checked_mul(es));
    match (offset.checked_mul(es), end) {
        (Some(s), Some(e)) => Ok((s, e)),
        _ => Err(BackendError::Shape(format!(
            "{what}: offset {offset} + {len} elements overflows"
        ))),
    }
}

fn out_of_range(what: &str, offset: usize, len: usize, have: usize) -> BackendError {
    BackendError::Shape(format!(
        "{what}: elements {offset}..{offset}+{len} exceed its {have}"
    ))
}
