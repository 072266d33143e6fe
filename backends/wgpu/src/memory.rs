//! Device buffers: allocation, host transfers, device copies and binding windows.
//!
//! Every buffer is a storage buffer whose size is rounded up to whole 4-byte words (the copy
//! and binding granularity of wgpu); 16-bit elements are packed two to a word. Transfers
//! that do not start or end on a word boundary merge the edge words on the host (uploads)
//! or run a small shader (device copies).

use crate::pipelines::{Bind, Kernel};
use crate::{block_on, WgpuBackend};
use ft_backend::{
    BackendError, BufferStorage, BufferUsage, CopyDesc, DType, DeviceBuffer, HostBytes, Result,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The wgpu buffer behind a [`DeviceBuffer`].
pub(crate) struct WgpuStorage {
    pub(crate) buffer: wgpu::Buffer,
    account: Arc<AtomicU64>,
}

impl Drop for WgpuStorage {
    fn drop(&mut self) {
        self.account
            .fetch_sub(self.buffer.size(), Ordering::Relaxed);
    }
}

impl BufferStorage for WgpuStorage {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}

/// The wgpu buffer of `buf`, or `Invalid` if another backend made it.
pub(crate) fn wbuf<'a>(buf: &'a DeviceBuffer, what: &str) -> Result<&'a wgpu::Buffer> {
    buf.storage::<WgpuStorage>()
        .map(|s| &s.buffer)
        .ok_or_else(|| BackendError::Invalid(format!("{what} was not made by the wgpu backend")))
}

/// `a · b`, or a shape error naming `what`.
pub(crate) fn need(a: usize, b: usize, what: &str) -> Result<usize> {
    a.checked_mul(b)
        .ok_or_else(|| BackendError::Shape(format!("{what}: {a} × {b} overflows")))
}

/// `v` as a shader index; shaders address elements with 32-bit integers.
pub(crate) fn u32_of(v: usize, what: &str) -> Result<u32> {
    u32::try_from(v).map_err(|_| {
        BackendError::Shape(format!(
            "{what}: {v} exceeds the 32-bit index range of the shaders"
        ))
    })
}

/// Fails unless `buf` has `first + count` elements.
pub(crate) fn check_range(
    buf: &DeviceBuffer,
    first: usize,
    count: usize,
    what: &str,
) -> Result<()> {
    match first.checked_add(count) {
        Some(end) if end <= buf.len() => Ok(()),
        _ => Err(BackendError::Shape(format!(
            "{what}: elements {first}..+{count} of a buffer of {}",
            buf.len()
        ))),
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

/// The start (element, inside the binding) of a bound window.
pub(crate) struct Window<'a> {
    pub bind: Bind<'a>,
    pub base: u32,
}

impl WgpuBackend {
    /// Binds elements `first..first + count` of `buf` (checked against its length). The whole
    /// buffer is bound when the adapter allows, else an aligned window around the range, so
    /// tensors larger than one binding (fused expert weights, big embeddings) still work.
    pub(crate) fn window<'a>(
        &self,
        buf: &'a DeviceBuffer,
        first: usize,
        count: usize,
        what: &str,
    ) -> Result<Window<'a>> {
        if buf.dtype().is_quantized() {
            // Only matmul reads block types, through `byte_window`; element windows would
            // misplace them (an element here is a value, not `dtype.size()` bytes).
            return Err(BackendError::Invalid(format!(
                "{what}: {} data is read by matmul only",
                buf.dtype()
            )));
        }
        check_range(buf, first, count, what)?;
        let b = wbuf(buf, what)?;
        let max_bind = self.max_binding;
        if b.size() <= max_bind {
            return Ok(Window {
                bind: Bind::all(b),
                base: u32_of(first, what)?,
            });
        }
        let es = buf.dtype().size() as u64;
        let align = u64::from(self.limits.min_storage_buffer_offset_alignment.max(4));
        let start = first as u64 * es;
        let offset = start / align * align;
        let end = ((first + count) as u64 * es)
            .next_multiple_of(4)
            .max(offset + 4)
            .min(b.size());
        let size = end - offset;
        if size > max_bind {
            return Err(BackendError::Shape(format!(
                "{what}: {size} bytes in one binding exceed the adapter's limit of {max_bind}"
            )));
        }
        Ok(Window {
            bind: Bind {
                buffer: b,
                offset,
                size,
            },
            base: u32_of(((start - offset) / es) as usize, what)?,
        })
    }

    /// Creates a zeroed storage buffer for `bytes` bytes.
    fn create(&self, bytes: usize, contents: Option<&[u8]>) -> Result<wgpu::Buffer> {
        let size = (bytes.max(4) as u64).next_multiple_of(4);
        let free = self.memory().free;
        let oom = || BackendError::OutOfMemory {
            requested: size,
            free,
        };
        if size > self.limits.max_buffer_size || size > free {
            return Err(oom());
        }
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: contents.is_some(),
        });
        if block_on(scope.pop()).is_some() {
            return Err(oom());
        }
        if let Some(data) = contents {
            let mut view = buffer
                .get_mapped_range_mut(..)
                .map_err(|e| BackendError::Device(format!("mapping a new buffer: {e}")))?;
            view.slice(..data.len()).copy_from_slice(data);
            drop(view);
            buffer.unmap();
        }
        self.allocated.fetch_add(size, Ordering::Relaxed);
        Ok(buffer)
    }

    fn wrap(
        &self,
        buffer: wgpu::Buffer,
        dtype: DType,
        len: usize,
        usage: BufferUsage,
    ) -> DeviceBuffer {
        let storage = WgpuStorage {
            buffer,
            account: self.allocated.clone(),
        };
        DeviceBuffer::new(Box::new(storage), dtype, len, usage)
    }

    pub(crate) fn alloc_buffer(
        &self,
        dtype: DType,
        len: usize,
        usage: BufferUsage,
    ) -> Result<DeviceBuffer> {
        // A block-quantized buffer holds whole blocks (`len` counts their values).
        let bytes = dtype.bytes_for(len).ok_or_else(|| {
            BackendError::Shape(format!(
                "allocation of {len} {dtype} values: not whole blocks of {}, or overflows",
                dtype.block_elems()
            ))
        })?;
        // wgpu zero-initialises new buffers.
        let buffer = self.create(bytes, None)?;
        Ok(self.wrap(buffer, dtype, len, usage))
    }

    pub(crate) fn import(
        &self,
        data: HostBytes,
        dtype: DType,
        usage: BufferUsage,
    ) -> Result<DeviceBuffer> {
        let len = dtype.elems_in(data.len()).ok_or_else(|| {
            BackendError::Shape(format!("{} bytes are not whole {dtype} values", data.len()))
        })?;
        // Device memory is not host memory here, so the bytes are copied once at import.
        let buffer = self.create(data.len(), Some(data.as_slice()))?;
        Ok(self.wrap(buffer, dtype, len, usage))
    }

    /// Copies `len` bytes at byte `offset` of `src` to the host (`offset`, `len` any).
    pub(crate) fn read_bytes(&self, src: &wgpu::Buffer, offset: u64, out: &mut [u8]) -> Result<()> {
        if out.is_empty() {
            return Ok(());
        }
        let start = offset / 4 * 4;
        let end = (offset + out.len() as u64).next_multiple_of(4);
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("ft-readback"),
            size: end - start,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut enc = self
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        enc.copy_buffer_to_buffer(src, start, &staging, 0, end - start);
        self.queue.submit([enc.finish()]);
        let (tx, rx) = std::sync::mpsc::channel();
        staging.map_async(wgpu::MapMode::Read, .., move |r| {
            let _ = tx.send(r);
        });
        self.wait_idle()?;
        rx.recv()
            .map_err(|_| BackendError::Device("readback was never mapped".into()))?
            .map_err(|e| BackendError::Device(format!("readback: {e}")))?;
        {
            let view = staging
                .get_mapped_range(..)
                .map_err(|e| BackendError::Device(format!("readback view: {e}")))?;
            let skip = (offset - start) as usize;
            out.copy_from_slice(&view[skip..skip + out.len()]);
        }
        staging.unmap();
        Ok(())
    }

    pub(crate) fn write_bytes(
        &self,
        dst: &mut DeviceBuffer,
        offset: usize,
        src: &[u8],
    ) -> Result<()> {
        let have = dst.size_bytes();
        if offset.checked_add(src.len()).is_none_or(|end| end > have) {
            return Err(BackendError::Shape(format!(
                "upload of {} bytes at {offset} into {have}",
                src.len()
            )));
        }
        let b = wbuf(dst, "upload destination")?;
        if src.is_empty() {
            return Ok(());
        }
        let (off, end) = (offset as u64, (offset + src.len()) as u64);
        if off % 4 == 0 && end % 4 == 0 {
            self.queue.write_buffer(b, off, src);
            return self.check_device();
        }
        // Partial words at the edges keep their other bytes: read them, merge, write words.
        let (start, stop) = (off / 4 * 4, end.next_multiple_of(4));
        let mut words = vec![0u8; (stop - start) as usize];
        self.read_bytes(b, start, &mut words[..4])?;
        let n = words.len();
        let mut last = [0u8; 4];
        self.read_bytes(b, stop - 4, &mut last)?;
        words[n - 4..].copy_from_slice(&last);
        let skip = (off - start) as usize;
        words[skip..skip + src.len()].copy_from_slice(src);
        self.queue.write_buffer(b, start, &words);
        self.check_device()
    }

    pub(crate) fn copy_elements(
        &self,
        src: &DeviceBuffer,
        dst: &mut DeviceBuffer,
        d: &CopyDesc,
    ) -> Result<()> {
        expect_dtype(dst, src.dtype(), "copy destination")?;
        check_range(src, d.src_offset, d.len, "copy source")?;
        check_range(dst, d.dst_offset, d.len, "copy destination")?;
        let es = src.dtype().size();
        let sb = wbuf(src, "copy source")?;
        let db = wbuf(dst, "copy destination")?;
        if d.len == 0 {
            return Ok(());
        }
        let (so, dof, n) = if src.dtype().is_quantized() {
            // Whole blocks only, moved as bytes; a run that is not word-aligned would need a
            // byte-moving shader, which no caller has needed (`supports(Copy, _)` is false).
            let be = src.dtype().block_elems();
            let aligned = [d.src_offset, d.dst_offset, d.len]
                .iter()
                .all(|v| v.is_multiple_of(be));
            let (so, dof, n) = (
                d.src_offset / be * es,
                d.dst_offset / be * es,
                d.len / be * es,
            );
            if !aligned || so % 4 != 0 || dof % 4 != 0 || n % 4 != 0 {
                return Err(BackendError::Shape(format!(
                    "copy of {} {} values ({} → {}): not whole, word-aligned blocks",
                    d.len,
                    src.dtype(),
                    d.src_offset,
                    d.dst_offset
                )));
            }
            (so, dof, n)
        } else {
            (d.src_offset * es, d.dst_offset * es, d.len * es)
        };
        if so % 4 == 0 && dof % 4 == 0 && n % 4 == 0 {
            let mut enc = self
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
            enc.copy_buffer_to_buffer(sb, so as u64, db, dof as u64, n as u64);
            self.queue.submit([enc.finish()]);
            return self.check_device();
        }
        // 16-bit elements at odd offsets: a shader moves halves of words.
        self.copy16(src, dst, d, 0)
    }

    /// The `copy16` shader over `d`: 16-bit values moved (`tdt` 0), or f32 values stored as
    /// f16 / bf16 (`tdt` 1 / 2), one thread per destination word. `d` is checked and not empty.
    fn copy16(&self, src: &DeviceBuffer, dst: &DeviceBuffer, d: &CopyDesc, tdt: u32) -> Result<()> {
        let s = self.window(src, d.src_offset, d.len, "copy source")?;
        let t = self.window(dst, d.dst_offset, d.len, "copy destination")?;
        let words = (t.base as u64 + d.len as u64).div_ceil(2) - t.base as u64 / 2;
        let params = [u32_of(words as usize, "copy")?, 0, 0, s.base, t.base, u32_of(d.len, "copy")?];
        self.dispatch(Kernel::Copy16, &[("TDT", tdt)], &params, &[(8, s.bind), (9, t.bind)], words.div_ceil(256))
    }

    /// f32 values into a 16-bit buffer, rounded (see [`ft_backend::Backend::store`]).
    pub(crate) fn store_elements(&self, src: &DeviceBuffer, dst: &mut DeviceBuffer, d: &CopyDesc) -> Result<()> {
        let code = match dst.dtype() {
            DType::F32 => return self.copy_elements(src, dst, d),
            DType::F16 | DType::BF16 => crate::pipelines::dtype_code(dst.dtype()),
            dtype => return Err(BackendError::Unsupported { backend: "wgpu".into(), op: ft_backend::Op::Copy, dtype }),
        };
        expect_dtype(src, DType::F32, "store source")?;
        check_range(src, d.src_offset, d.len, "store source")?;
        check_range(dst, d.dst_offset, d.len, "store destination")?;
        if d.len == 0 {
            return Ok(());
        }
        self.copy16(src, dst, d, code)
    }
}
