//! Writing `.npy` files (NumPy format 1.0, little-endian float32, C order).

use std::io::Write;
use std::path::Path;

/// Writes `data` with `shape` as a float32 `.npy` file.
pub fn write_f32(path: &Path, shape: &[usize], data: &[f32]) -> std::io::Result<()> {
    if shape.iter().product::<usize>() != data.len() {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "shape does not match the data length"));
    }
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let shape_txt = if dims.len() == 1 { format!("({},)", dims[0]) } else { format!("({})", dims.join(", ")) };
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape_txt}, }}");
    // Magic (6) + version (2) + length (2) + header + newline must be a multiple of 64.
    let pad = 64 - (10 + header.len() + 1) % 64;
    header.push_str(&" ".repeat(pad % 64));
    header.push('\n');
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    f.write_all(b"\x93NUMPY\x01\x00")?;
    f.write_all(&(header.len() as u16).to_le_bytes())?;
    f.write_all(header.as_bytes())?;
    for v in data {
        f.write_all(&v.to_le_bytes())?;
    }
    f.flush()
}

#[cfg(test)]
mod tests {
    #[test]
    fn header_is_aligned_and_data_follows() {
        let path = std::env::temp_dir().join(format!("ft-npy-{}.npy", std::process::id()));
        super::write_f32(&path, &[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).ok();
        let hlen = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
        assert_eq!((10 + hlen) % 64, 0);
        let header = std::str::from_utf8(&bytes[10..10 + hlen]).unwrap();
        assert!(header.contains("'shape': (2, 3)"), "{header}");
        assert_eq!(bytes.len(), 10 + hlen + 24);
        assert_eq!(f32::from_le_bytes(bytes[10 + hlen + 20..].try_into().unwrap()), 6.0);
    }
}
