//! Snapshots of a [`SequenceState`]: what the prefix store keeps to resume a conversation,
//! and how a preempted sequence comes back without recomputing.
//!
//! A snapshot in device memory holds the sequence's pages by reference (no copy): the pool
//! keeps them until the last holder lets go, and whoever writes into one of them first
//! takes a copy of its own. Unpaged parts (recurrent state, DeepSeek-V4's buffers) are copied.
//! Moved to host memory, a snapshot holds the rows' bytes and gives its pages back.

use super::pages::{self, SharedPool};
use super::{copy_prefix, SeqPages, SequenceState};
use crate::model::ModelError;
use ft_backend::{Backend, BufferUsage, DType, DeviceBuffer, StreamId};
use std::sync::Arc;

/// A copy of a [`SequenceState`] after some number of tokens, in device or host memory.
///
/// Restoring it into any state of the same model with enough capacity continues exactly as
/// the original sequence would have.
pub struct StateSnapshot {
    len: usize,
    /// One entry per unpaged state buffer, in [`SequenceState::buffers`] order.
    parts: Vec<Part>,
    /// The paged rows, when the model keeps any.
    pages: Option<Paged>,
}

/// Where one unpaged buffer of a snapshot lives.
enum Part {
    Device(DeviceBuffer),
    /// The buffer's bytes and dtype; anchors move here when device memory for them runs out.
    Host(Vec<u8>, DType),
}

impl Part {
    fn dtype(&self) -> DType {
        match self {
            Part::Device(b) => b.dtype(),
            Part::Host(_, dtype) => *dtype,
        }
    }

    fn elements(&self) -> usize {
        match self {
            Part::Device(b) => b.len(),
            Part::Host(v, dtype) => v.len() / dtype.size(),
        }
    }
}

/// A snapshot's paged rows.
enum Paged {
    /// Held pages of a pool (the first `len.div_ceil(page_rows)` of the sequence's table).
    Shared { pool: SharedPool, table: Vec<u32> },
    /// The rows' bytes per pool buffer (as [`pages::PagePool::read_rows`] gives them) and
    /// their dtype.
    Host(Vec<Vec<u8>>, DType),
}

impl Drop for StateSnapshot {
    fn drop(&mut self) {
        if let Some(Paged::Shared { pool, table }) = &mut self.pages {
            pages::lock(pool).release_table(table);
        }
    }
}

impl StateSnapshot {
    /// Tokens the snapshot covers.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the snapshot was taken before any token.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes the snapshot holds (device and host together; whole pages, shared or not).
    pub fn size_bytes(&self) -> usize {
        let parts: usize = self
            .parts
            .iter()
            .map(|p| match p {
                Part::Device(b) => b.size_bytes(),
                Part::Host(v, _) => v.len(),
            })
            .sum();
        let paged = match &self.pages {
            None => 0,
            Some(Paged::Shared { pool, table }) => table.len() * pages::lock(pool).page_bytes() as usize,
            Some(Paged::Host(rows, _)) => rows.iter().map(Vec::len).sum(),
        };
        parts + paged
    }

    /// Whether any part is in device memory.
    pub fn on_device(&self) -> bool {
        self.parts.iter().any(|p| matches!(p, Part::Device(_))) || matches!(self.pages, Some(Paged::Shared { .. }))
    }

    /// Moves every part into host memory (frees the device copies and lets go of its pages).
    pub fn move_to_host(&mut self, be: &dyn Backend) -> Result<(), ModelError> {
        for part in &mut self.parts {
            if let Part::Device(buf) = part {
                let mut bytes = vec![0u8; buf.size_bytes()];
                be.download(StreamId::COMPUTE, buf, 0, &mut bytes)?;
                *part = Part::Host(bytes, buf.dtype());
            }
        }
        if let Some(Paged::Shared { pool, table }) = &mut self.pages {
            let mut p = pages::lock(pool);
            let rows = p.read_rows(table, self.len)?;
            let dtype = p.dtype();
            p.release_table(table);
            drop(p);
            self.pages = Some(Paged::Host(rows, dtype));
        }
        Ok(())
    }
}

impl SequenceState {
    /// The state as it is now, in device memory (its pages shared, not copied).
    pub fn snapshot(&self) -> Result<StateSnapshot, ModelError> {
        self.take_snapshot(false)
    }

    /// Copies the state as it is now straight into host memory.
    pub fn snapshot_to_host(&self) -> Result<StateSnapshot, ModelError> {
        self.take_snapshot(true)
    }

    fn take_snapshot(&self, to_host: bool) -> Result<StateSnapshot, ModelError> {
        let be = self.backend.as_ref();
        let parts = self
            .buffers()
            .into_iter()
            .zip(self.snapshot_extents(self.len))
            .map(|((buf, _), n)| {
                if to_host {
                    let mut bytes = vec![0u8; n * buf.dtype().size()];
                    if n > 0 {
                        be.download(StreamId::COMPUTE, buf, 0, &mut bytes)?;
                    }
                    Ok(Part::Host(bytes, buf.dtype()))
                } else {
                    let mut copy = be.alloc(buf.dtype(), n, BufferUsage::Kv)?;
                    copy_prefix(be, buf, &mut copy, n)?;
                    Ok(Part::Device(copy))
                }
            })
            .collect::<Result<_, ModelError>>()?;
        let pages = match &self.pages {
            None => None,
            Some(SeqPages { pool, table }) => {
                let mut p = pages::lock(pool);
                let used = &table[..self.len.div_ceil(p.page_rows()).min(table.len())];
                Some(if to_host {
                    Paged::Host(p.read_rows(used, self.len)?, p.dtype())
                } else {
                    used.iter().for_each(|&page| p.retain(page));
                    Paged::Shared { pool: pool.clone(), table: used.to_vec() }
                })
            }
        };
        Ok(StateSnapshot { len: self.len, parts, pages })
    }

    /// Makes this state what it was when `snapshot` was taken (of a state of the same model).
    pub fn restore(&mut self, snapshot: &StateSnapshot) -> Result<(), ModelError> {
        self.restore_prefix(snapshot, snapshot.len)
    }

    /// Like [`restore`](Self::restore), then keeps only the first `len` tokens: attention
    /// state taken after a longer sequence serves any of its prefixes. A snapshot with
    /// recurrent state can only be restored whole. Pages of the same pool are shared, not
    /// copied.
    pub fn restore_prefix(&mut self, snapshot: &StateSnapshot, len: usize) -> Result<(), ModelError> {
        if len > snapshot.len {
            return Err(ModelError::Invalid(format!("cannot restore {len} tokens from a snapshot of {}", snapshot.len)));
        }
        if len < snapshot.len && self.has_recurrent_layers() {
            return Err(ModelError::Invalid(format!(
                "a snapshot of {} tokens with recurrent state cannot be cut to {len}",
                snapshot.len
            )));
        }
        if len > self.capacity {
            return Err(ModelError::ContextOverflow { needed: len, capacity: self.capacity });
        }
        // Check every buffer before copying any, so a mismatch leaves this state untouched.
        let want = self.snapshot_extents(snapshot.len);
        if want.len() != snapshot.parts.len() || want.iter().zip(&snapshot.parts).any(|(n, p)| *n != p.elements()) {
            return Err(ModelError::Invalid("snapshot layers do not match this model's state".into()));
        }
        if self.buffers().iter().zip(&snapshot.parts).any(|((b, _), p)| b.dtype() != p.dtype()) {
            return Err(ModelError::Invalid("the snapshot's cache type differs from this state's".into()));
        }
        let paged_dtype = match &snapshot.pages {
            None => None,
            Some(Paged::Shared { pool, .. }) => Some(pages::lock(pool).dtype()),
            Some(Paged::Host(_, dtype)) => Some(*dtype),
        };
        let own_dtype = self.pages.as_ref().map(|p| pages::lock(&p.pool).dtype());
        if paged_dtype != own_dtype {
            return Err(ModelError::Invalid("the snapshot's cache type differs from this state's".into()));
        }
        // Unpaged per-token buffers only need the kept prefix; fixed-size ones are copied whole.
        self.grow_rows(len)?;
        let keep = self.snapshot_extents(len);
        let be = self.backend.clone();
        for ((dst, part), n) in self.buffers_mut().into_iter().zip(&snapshot.parts).zip(keep) {
            if n == 0 {
                continue;
            }
            match part {
                Part::Device(src) => copy_prefix(be.as_ref(), src, dst, n)?,
                Part::Host(bytes, dtype) => be.upload(StreamId::COMPUTE, &bytes[..n * dtype.size()], dst, 0)?,
            }
        }
        if let (Some(own), Some(saved)) = (&mut self.pages, &snapshot.pages) {
            // From here a failure leaves the state empty, not half restored.
            own.release_all();
            self.len = 0;
            match saved {
                Paged::Shared { pool, table } if Arc::ptr_eq(pool, &own.pool) => {
                    let mut p = pages::lock(pool);
                    let used = &table[..len.div_ceil(p.page_rows())];
                    used.iter().for_each(|&page| p.retain(page));
                    own.table = used.to_vec();
                }
                other => {
                    // Another pool's pages or host bytes: rows copied into pages of our own.
                    let read;
                    let rows: &[Vec<u8>] = match other {
                        Paged::Shared { pool, table } => {
                            read = pages::lock(pool).read_rows(table, len)?;
                            &read
                        }
                        Paged::Host(rows, _) => rows,
                    };
                    let mut p = pages::lock(&own.pool);
                    for _ in 0..len.div_ceil(p.page_rows()) {
                        let page = p.take()?;
                        own.table.push(page);
                    }
                    p.write_rows(&own.table, len, rows)?;
                }
            }
        }
        self.len = len;
        Ok(())
    }
}
