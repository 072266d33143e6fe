//! Device buffers: an opaque backend-owned storage plus the facts every layer may read.

use crate::dtype::DType;
use std::any::Any;
use std::sync::Arc;

/// What a buffer is for; backends may place or account for them differently.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BufferUsage {
    /// Non-expert model weights, resident for the engine's lifetime.
    Weights,
    /// One slot of the expert cache.
    ExpertSlot,
    /// Key/value cache or recurrent state of sequences.
    Kv,
    /// Activations and temporaries.
    Scratch,
    /// Host-visible staging memory for transfers.
    Staging,
}

/// Backend-specific storage behind a [`DeviceBuffer`].
pub trait BufferStorage: Any + Send + Sync {
    /// Upcast for the owning backend to downcast.
    fn as_any(&self) -> &dyn Any;
    /// Mutable upcast for the owning backend to downcast.
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

/// A typed, sized region of device memory. Only the backend that made it can read it.
pub struct DeviceBuffer {
    storage: Box<dyn BufferStorage>,
    dtype: DType,
    len: usize,
    /// Bytes the storage was created with.
    capacity: usize,
    usage: BufferUsage,
}

impl DeviceBuffer {
    /// Wraps backend storage; called by backends only.
    pub fn new(storage: Box<dyn BufferStorage>, dtype: DType, len: usize, usage: BufferUsage) -> Self {
        let capacity = len / dtype.block_elems() * dtype.size();
        Self { storage, dtype, len, usage, capacity }
    }
    /// Reinterprets the buffer as `len` values of `dtype`, which must fit the bytes it was
    /// created with: an expert cache slot holds, in turn, experts of layers stored in
    /// different block types (a GGUF Q4_K_M keeps some layers' `ffn_down` in Q6_K).
    pub fn retype(&mut self, dtype: DType, len: usize) -> crate::error::Result<()> {
        if dtype.bytes_for(len).is_none_or(|b| b > self.capacity) {
            return Err(crate::error::BackendError::Shape(format!("{len} values of {dtype} do not fit a buffer of {} bytes", self.capacity)));
        }
        self.dtype = dtype;
        self.len = len;
        Ok(())
    }
    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the buffer holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Size in bytes (a quantized buffer holds whole blocks: backends check at creation).
    pub fn size_bytes(&self) -> usize {
        self.len / self.dtype.block_elems() * self.dtype.size()
    }
    /// What the buffer is for.
    pub fn usage(&self) -> BufferUsage {
        self.usage
    }
    /// The backend storage, if it is of type `T`.
    pub fn storage<T: 'static>(&self) -> Option<&T> {
        self.storage.as_any().downcast_ref::<T>()
    }
    /// The backend storage, mutably, if it is of type `T`.
    pub fn storage_mut<T: 'static>(&mut self) -> Option<&mut T> {
        self.storage.as_any_mut().downcast_mut::<T>()
    }
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("dtype", &self.dtype)
            .field("len", &self.len)
            .field("usage", &self.usage)
            .finish()
    }
}

/// Shared, read-only host bytes: a range of an owner such as a memory-mapped file.
#[derive(Clone)]
pub struct HostBytes {
    owner: Arc<dyn AsRef<[u8]> + Send + Sync>,
    offset: usize,
    len: usize,
}

impl HostBytes {
    /// A view of `owner[offset..offset + len]`; `None` if the range is out of bounds.
    pub fn new(owner: Arc<dyn AsRef<[u8]> + Send + Sync>, offset: usize, len: usize) -> Option<Self> {
        let total = (*owner).as_ref().len();
        (offset.checked_add(len)? <= total).then_some(Self { owner, offset, len })
    }
    /// Owns a copy of `bytes`.
    pub fn from_vec(bytes: Vec<u8>) -> Self {
        let len = bytes.len();
        Self { owner: Arc::new(bytes), offset: 0, len }
    }
    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        &(*self.owner).as_ref()[self.offset..self.offset + self.len]
    }
    /// Number of bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// A sub-range of this view; `None` if out of bounds.
    pub fn slice(&self, offset: usize, len: usize) -> Option<HostBytes> {
        (offset.checked_add(len)? <= self.len).then(|| HostBytes {
            owner: self.owner.clone(),
            offset: self.offset + offset,
            len,
        })
    }
}

impl std::fmt::Debug for HostBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HostBytes({} bytes at {})", self.len, self.offset)
    }
}
