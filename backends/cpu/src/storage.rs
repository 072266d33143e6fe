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
                advise_huge_pages(p as *mut u8, n * 64);
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

/// Bytes of a transparent huge page.
const HUGE_PAGE: usize = 2 << 20;

/// Asks for transparent huge pages over the whole 2 MiB pages of `len` bytes at `p`, before
/// anything touches them. Large buffers are KV pools and scratch read over and over at strides
/// (attention reads each KV head's rows 1 KiB apart): in 4 KiB pages every few rows was a TLB
/// miss. The allocator's large blocks are fresh mappings, untouched until written; where the
/// system leaves huge pages to advice (`madvise` mode) nothing else would ask.
fn advise_huge_pages(p: *mut u8, len: usize) {
    #[cfg(target_os = "linux")]
    {
        extern "C" {
            fn madvise(addr: *mut std::ffi::c_void, len: usize, advice: i32) -> i32;
        }
        /// `MADV_HUGEPAGE` from Linux's `mman-common.h`.
        const MADV_HUGEPAGE: i32 = 14;
        if let Some((start, end)) = whole_huge_pages(p as usize, len) {
            // SAFETY: advice over whole pages inside this allocation; it changes no contents
            // and its failure (no THP in this kernel) leaves ordinary pages.
            let _ = unsafe { madvise(start as *mut std::ffi::c_void, end - start, MADV_HUGEPAGE) };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (p, len);
}

/// The whole huge pages `[start, end)` inside `len` bytes at address `p`, if any.
fn whole_huge_pages(p: usize, len: usize) -> Option<(usize, usize)> {
    let start = p.checked_next_multiple_of(HUGE_PAGE)?;
    let end = p.checked_add(len)? / HUGE_PAGE * HUGE_PAGE;
    (end > start).then_some((start, end))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_whole_huge_pages_inside_a_block_are_advised() {
        const H: usize = HUGE_PAGE;
        assert_eq!(whole_huge_pages(H, 3 * H), Some((H, 4 * H)));
        assert_eq!(whole_huge_pages(H + 64, 3 * H), Some((2 * H, 4 * H)));
        assert_eq!(whole_huge_pages(H + 64, H), None, "no whole page inside");
        assert_eq!(whole_huge_pages(usize::MAX - 10, 100), None, "no overflow");
    }

    #[test]
    fn a_large_buffer_is_zeroed_and_holds_what_is_written() {
        // Large enough for the allocator's own mapping and several huge pages.
        let len = (6 << 20) + 100;
        let mut o = Owned::zeroed(len, Arc::new(AtomicU64::new(0))).expect("allocation");
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut o.lines);
        assert!(bytes.iter().all(|&b| b == 0));
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = (i % 251) as u8;
        }
        assert!(bytes.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
    }
}
