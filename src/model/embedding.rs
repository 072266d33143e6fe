//! The token embedding table.
//!
//! Block-quantized tables (GGUF files store `token_embd` as Q4_K, Q8_0, …) stay packed in host
//! memory and only the looked-up rows are decoded: dequantizing a 151,936 × 2,048 table to f32
//! at load cost 1.2 GB of memory and seconds of start-up for one row read per token, and on a
//! GPU it would take device memory that the expert cache can use.

use super::ModelError;
use ft_backend::{Backend, BufferUsage, DType, DeviceBuffer, HostBytes, StreamId};

/// Where the embedding's rows are looked up.
pub enum Embedding {
    /// A plain-dtype table on the device, gathered there.
    Device(DeviceBuffer),
    /// A block-quantized table in host memory (memory-mapped), decoded row by row.
    Host {
        /// `rows × dtype.row_bytes(cols)` packed bytes.
        bytes: HostBytes,
        /// The block type.
        dtype: DType,
        /// Vocabulary size.
        rows: usize,
        /// Hidden size.
        cols: usize,
    },
}

impl Embedding {
    /// The table as loaded: packed types stay on the host, plain ones go to `backend`.
    pub fn new(backend: &dyn Backend, bytes: HostBytes, dtype: DType, rows: usize, cols: usize) -> Result<Self, ModelError> {
        if dtype.is_quantized() {
            let need = rows.checked_mul(dtype.row_bytes(cols));
            if need.is_none_or(|n| n > bytes.len()) {
                return Err(ModelError::Invalid(format!("embedding: {} bytes cannot hold {rows}×{cols} {dtype}", bytes.len())));
            }
            Ok(Embedding::Host { bytes, dtype, rows, cols })
        } else {
            Ok(Embedding::Device(backend.import_host(bytes, dtype, BufferUsage::Weights)?))
        }
    }

    /// Values in the table.
    pub fn len(&self) -> usize {
        match self {
            Embedding::Device(b) => b.len(),
            Embedding::Host { rows, cols, .. } => rows * cols,
        }
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes the table takes where it lives.
    pub fn size_bytes(&self) -> usize {
        match self {
            Embedding::Device(b) => b.size_bytes(),
            Embedding::Host { bytes, .. } => bytes.len(),
        }
    }

    /// The storage type.
    pub fn dtype(&self) -> DType {
        match self {
            Embedding::Device(b) => b.dtype(),
            Embedding::Host { dtype, .. } => *dtype,
        }
    }

    /// The table as an output projection (tied embeddings): the device table itself, or the
    /// packed bytes handed to the backend (zero-copy on the CPU), which multiplies them packed.
    pub fn as_weight(
        &self,
        backend: &dyn Backend,
        host_cpu: &super::fallback::HostCpu,
    ) -> Result<Option<(DeviceBuffer, Option<std::sync::Arc<dyn Backend>>)>, ModelError> {
        match self {
            Embedding::Device(_) => Ok(None),
            Embedding::Host { bytes, dtype, .. } if backend.supports(ft_backend::Op::Matmul, *dtype) => {
                Ok(Some((backend.import_host(bytes.clone(), *dtype, BufferUsage::Weights)?, None)))
            }
            Embedding::Host { bytes, dtype, .. } => {
                let cpu = host_cpu.get()?;
                Ok(Some((cpu.import_host(bytes.clone(), *dtype, BufferUsage::Weights)?, Some(cpu))))
            }
        }
    }

    /// Rows `tokens` (already checked against the vocabulary) into `out` (`tokens.len() ×
    /// hidden` f32).
    pub fn lookup(&self, be: &dyn Backend, tokens: &[u32], hidden: usize, out: &mut DeviceBuffer) -> Result<(), ModelError> {
        match self {
            Embedding::Device(table) => Ok(be.gather_rows(table, tokens, hidden, out)?),
            Embedding::Host { bytes, dtype, rows, cols } => {
                let rb = dtype.row_bytes(*cols);
                let mut values = Vec::with_capacity(tokens.len() * cols);
                for &id in tokens {
                    let id = id as usize;
                    let row = (id < *rows).then(|| bytes.as_slice().get(id * rb..(id + 1) * rb)).flatten();
                    let decoded = row.and_then(|r| ft_backend::quant::dequantize_matrix(*dtype, r, 1, *cols));
                    values.extend(decoded.ok_or_else(|| ModelError::Invalid(format!("token id {id} is outside the {rows}-row embedding")))?);
                }
                be.upload(StreamId::COMPUTE, bytemuck::cast_slice(&values), out, 0)?;
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ft_backend::MatmulDesc;

    /// A Q8_0 table stays packed on the host; looked-up rows equal the dequantized table's,
    /// the tied head multiplies the packed bytes, and an id past the table is an error.
    #[test]
    fn packed_table_rows_and_tied_head() {
        let be = ft_backend_cpu::CpuBackend::with_defaults().unwrap();
        let (rows, cols) = (7, 64);
        let mut rng = ft_backend::conformance::Rng::new(3);
        let vals = rng.vec(rows * cols, 1.0);
        let packed = ft_backend::quant::quantize_matrix(DType::Q8_0, &vals, rows, cols);
        let dense = ft_backend::quant::dequantize_matrix(DType::Q8_0, &packed, rows, cols).unwrap();
        let e = Embedding::new(&be, HostBytes::from_vec(packed), DType::Q8_0, rows, cols).unwrap();
        assert!(matches!(e, Embedding::Host { .. }));
        assert_eq!((e.len(), e.size_bytes(), e.dtype()), (rows * cols, rows * DType::Q8_0.row_bytes(cols), DType::Q8_0));
        let ids = [3u32, 0, 6, 3];
        let mut out = be.alloc(DType::F32, ids.len() * cols, BufferUsage::Scratch).unwrap();
        e.lookup(&be, &ids, cols, &mut out).unwrap();
        let mut got = vec![0f32; ids.len() * cols];
        be.download(StreamId::COMPUTE, &out, 0, bytemuck::cast_slice_mut(&mut got)).unwrap();
        for (i, &id) in ids.iter().enumerate() {
            assert_eq!(&got[i * cols..][..cols], &dense[id as usize * cols..][..cols], "row {id}");
        }
        assert!(e.lookup(&be, &[7], cols, &mut out).is_err());
        let (head, host) = e.as_weight(&be, &Default::default()).unwrap().expect("a head for a host table");
        assert!(host.is_none(), "the CPU multiplies its own packed table");
        let x = rng.vec(cols, 1.0);
        let xb = be.import_host(HostBytes::from_vec(bytemuck::cast_slice(&x).to_vec()), DType::F32, BufferUsage::Scratch).unwrap();
        let mut logits = be.alloc(DType::F32, rows, BufferUsage::Scratch).unwrap();
        be.matmul(&xb, &head, None, &mut logits, &MatmulDesc::new(1, cols, rows)).unwrap();
        let mut l = vec![0f32; rows];
        be.download(StreamId::COMPUTE, &logits, 0, bytemuck::cast_slice_mut(&mut l)).unwrap();
        for r in 0..rows {
            let want: f32 = dense[r * cols..][..cols].iter().zip(&x).map(|(a, b)| a * b).sum();
            assert!((l[r] - want).abs() <= 1e-4 * want.abs().max(1.0), "row {r}: {} vs {want}", l[r]);
        }
    }

    /// Plain tables go to the device and have no separate head.
    #[test]
    fn plain_table_is_on_the_device() {
        let be = ft_backend_cpu::CpuBackend::with_defaults().unwrap();
        let e = Embedding::new(&be, HostBytes::from_vec(vec![0u8; 4 * 6]), DType::F32, 2, 3).unwrap();
        assert!(matches!(e, Embedding::Device(_)));
        assert!(e.as_weight(&be, &Default::default()).unwrap().is_none());
    }
}
