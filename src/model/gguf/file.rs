//! The GGUF container: header, metadata, tensor infos and split files, memory-mapped.
//!
//! Only the header is parsed and copied; tensor bytes stay views of the mapped files. Every
//! count and length read from a file is checked against what is left of it before it is used,
//! so a damaged or hostile file gives a [`GgufError`], never a panic or a huge allocation.

use super::{MetaValue, Metadata};
use ft_backend::HostBytes;
use memmap2::Mmap;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

const DEFAULT_ALIGNMENT: u64 = 32;
const MAX_DIMS: u32 = 4;
// Nested arrays are legal, but nothing needs them deep; a bound keeps recursion off the stack limit.
const MAX_ARRAY_DEPTH: usize = 16;
// Smallest encodings, used to reject counts that the rest of the file could not hold.
const MIN_KV_BYTES: u64 = 8 + 4 + 1;
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 4 + 8;

/// A GGUF file that cannot be read, or a tensor that is not in it.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// A file could not be opened or mapped.
    #[error("cannot read {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    /// The file is not GGUF, or its header or layout is malformed.
    #[error("{path}: {problem}")]
    Format { path: PathBuf, problem: String },
    /// A tensor the caller asked for is absent.
    #[error("tensor `{name}` not found in {path}")]
    MissingTensor { name: String, path: PathBuf },
}

fn format_err(path: &Path, problem: impl Into<String>) -> GgufError {
    GgufError::Format { path: path.to_path_buf(), problem: problem.into() }
}

/// One tensor of a GGUF file.
#[derive(Clone, Debug)]
pub struct GgufTensor {
    /// Name as stored (llama.cpp naming, e.g. `blk.0.ffn_down_exps.weight`).
    pub name: String,
    /// Raw ggml type id (see [`ggml_type_name`]).
    pub ggml_type: u32,
    /// Dimensions in GGUF order: `dims[0]` is ne0, the innermost (contiguous) one.
    pub dims: Vec<usize>,
    /// The tensor's bytes, a view of the mapped file.
    pub bytes: HostBytes,
    /// The (split) file it is in.
    pub file: PathBuf,
}

// (name, values per block, bytes per block); 0/0 for ids ggml has retired without a size.
const GGML_TYPES: &[(u32, &str, usize, usize)] = &[
    (0, "F32", 1, 4),
    (1, "F16", 1, 2),
    (2, "Q4_0", 32, 18),
    (3, "Q4_1", 32, 20),
    (6, "Q5_0", 32, 22),
    (7, "Q5_1", 32, 24),
    (8, "Q8_0", 32, 34),
    (9, "Q8_1", 32, 40),
    (10, "Q2_K", 256, 84),
    (11, "Q3_K", 256, 110),
    (12, "Q4_K", 256, 144),
    (13, "Q5_K", 256, 176),
    (14, "Q6_K", 256, 210),
    (15, "Q8_K", 256, 292),
    (16, "IQ2_XXS", 256, 66),
    (17, "IQ2_XS", 256, 74),
    (18, "IQ3_XXS", 256, 98),
    (19, "IQ1_S", 256, 50),
    (20, "IQ4_NL", 32, 18),
    (21, "IQ3_S", 256, 110),
    (22, "IQ2_S", 256, 82),
    (23, "IQ4_XS", 256, 136),
    (24, "I8", 1, 1),
    (25, "I16", 1, 2),
    (26, "I32", 1, 4),
    (27, "I64", 1, 8),
    (28, "F64", 1, 8),
    (29, "IQ1_M", 256, 56),
    (30, "BF16", 1, 2),
    (31, "Q4_0_4_4", 0, 0),
    (32, "Q4_0_4_8", 0, 0),
    (33, "Q4_0_8_8", 0, 0),
    (34, "TQ1_0", 256, 54),
    (35, "TQ2_0", 256, 66),
    (36, "IQ4_NL_4_4", 0, 0),
    (37, "IQ4_NL_4_8", 0, 0),
    (38, "IQ4_NL_8_8", 0, 0),
    (39, "MXFP4", 32, 17),
    (40, "NVFP4", 64, 36),
    (41, "Q1_0", 128, 18),
];

/// The ggml name of a tensor type id (`"Q4_K"`), or `"type N"` for an unknown one.
pub fn ggml_type_name(t: u32) -> String {
    match GGML_TYPES.iter().find(|e| e.0 == t) {
        Some(e) => e.1.to_string(),
        None => format!("type {t}"),
    }
}

/// (values per block, bytes per block) of a ggml type; `None` if its layout is unknown.
pub fn ggml_block(t: u32) -> Option<(usize, usize)> {
    GGML_TYPES.iter().find(|e| e.0 == t && e.2 > 0).map(|e| (e.2, e.3))
}

/// A tensor as the header describes it, with its absolute byte range validated.
struct TensorInfo {
    name: String,
    ggml_type: u32,
    dims: Vec<usize>,
    start: usize,
    len: usize,
}

struct Header {
    metadata: Metadata,
    tensors: Vec<TensorInfo>,
}

/// Bounds-checked little-endian reading of a header; `what` names the item being read.
struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
    path: &'a Path,
    what: String,
}

impl<'a> Reader<'a> {
    fn err(&self, problem: impl Into<String>) -> GgufError {
        format_err(self.path, problem)
    }
    fn left(&self) -> u64 {
        (self.data.len() - self.pos) as u64
    }
    fn take(&mut self, n: u64) -> Result<&'a [u8], GgufError> {
        if n > self.left() {
            return Err(self.err(format!(
                "the file ends (at byte {}) in the middle of {} ({n} bytes needed at byte {}): truncated?",
                self.data.len(),
                self.what,
                self.pos
            )));
        }
        let s = &self.data[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }
    fn bytes<const N: usize>(&mut self) -> Result<[u8; N], GgufError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N as u64)?);
        Ok(a)
    }
    fn u32(&mut self) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.bytes()?))
    }
    fn u64(&mut self) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.bytes()?))
    }
    fn string(&mut self) -> Result<String, GgufError> {
        let len = self.u64()?;
        // Lossy: llama.cpp token lists hold byte pieces that are not valid UTF-8 on their own.
        Ok(String::from_utf8_lossy(self.take(len)?).into_owned())
    }
    /// Rejects a count of items of at least `min_bytes` each that cannot fit in the rest of the file.
    fn check_count(&self, count: u64, min_bytes: u64, what: &str) -> Result<(), GgufError> {
        if count.saturating_mul(min_bytes) > self.left() {
            return Err(self.err(format!(
                "{} claims {count} {what}, more than the remaining {} bytes of the file can hold: truncated or corrupt",
                self.what,
                self.left()
            )));
        }
        Ok(())
    }

    fn value(&mut self, ty: u32, depth: usize) -> Result<MetaValue, GgufError> {
        Ok(match ty {
            0 => MetaValue::U8(u8::from_le_bytes(self.bytes()?)),
            1 => MetaValue::I8(i8::from_le_bytes(self.bytes()?)),
            2 => MetaValue::U16(u16::from_le_bytes(self.bytes()?)),
            3 => MetaValue::I16(i16::from_le_bytes(self.bytes()?)),
            4 => MetaValue::U32(self.u32()?),
            5 => MetaValue::I32(i32::from_le_bytes(self.bytes()?)),
            6 => MetaValue::F32(f32::from_le_bytes(self.bytes()?)),
            7 => MetaValue::Bool(self.bytes::<1>()?[0] != 0),
            8 => MetaValue::String(self.string()?),
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(self.err(format!("{} nests arrays more than {MAX_ARRAY_DEPTH} deep", self.what)));
                }
                let elem = self.u32()?;
                let count = self.u64()?;
                let min = min_value_bytes(elem)
                    .ok_or_else(|| self.err(format!("{} is an array of unknown value type {elem}", self.what)))?;
                self.check_count(count, min, "array elements")?;
                // Grows with what is actually parsed rather than trusting the count up front.
                let mut items = Vec::with_capacity(count.min(4096) as usize);
                for _ in 0..count {
                    items.push(self.value(elem, depth + 1)?);
                }
                MetaValue::Array(items)
            }
            10 => MetaValue::U64(self.u64()?),
            11 => MetaValue::I64(i64::from_le_bytes(self.bytes()?)),
            12 => MetaValue::F64(f64::from_le_bytes(self.bytes()?)),
            _ => return Err(self.err(format!("{} has unknown value type {ty}", self.what))),
        })
    }
}

fn min_value_bytes(ty: u32) -> Option<u64> {
    Some(match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 | 10..=12 => 8,
        9 => 12,
        _ => return None,
    })
}

/// Parses and validates the header of one GGUF file held in `data`.
fn parse(path: &Path, data: &[u8]) -> Result<Header, GgufError> {
    if data.len() < 4 || &data[..4] != b"GGUF" {
        let start: Vec<String> = data.iter().take(4).map(|b| format!("{b:02x}")).collect();
        let seen = if data.is_empty() { "it is empty".to_string() } else { format!("it starts with bytes {}", start.join(" ")) };
        return Err(format_err(path, format!("not a GGUF file ({seen}, not the magic `GGUF`)")));
    }
    let mut r = Reader { data, pos: 4, path, what: "the header".into() };
    match r.u32()? {
        2 | 3 => {}
        1 => return Err(r.err("GGUF version 1 is not supported (only versions 2 and 3); convert the model again with a current llama.cpp")),
        v if v & 0xffff == 0 && (1..=3).contains(&v.swap_bytes()) => {
            return Err(r.err(format!(
                "this is a big-endian GGUF file (the version reads {v:#010x}); only little-endian files are supported"
            )))
        }
        v => return Err(r.err(format!("unsupported GGUF version {v} (only versions 2 and 3 are supported)"))),
    }
    let n_tensors = r.u64()?;
    let n_kv = r.u64()?;
    r.check_count(n_kv, MIN_KV_BYTES, "metadata entries")?;
    let mut metadata = Metadata::new();
    for i in 0..n_kv {
        r.what = format!("metadata entry {i}");
        let key = r.string()?;
        r.what = format!("metadata `{key}`");
        let ty = r.u32()?;
        let value = r.value(ty, 0)?;
        if metadata.insert(key.clone(), value).is_some() {
            return Err(r.err(format!("metadata key `{key}` appears twice")));
        }
    }
    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(v) => match v.as_u64() {
            Some(a) if a.is_power_of_two() => a,
            _ => {
                let found = v.as_u64().map_or_else(|| v.type_name().to_string(), |a| a.to_string());
                return Err(r.err(format!("general.alignment is {found}, not a power of two")));
            }
        },
    };

    r.what = "the tensor infos".into();
    r.check_count(n_tensors, MIN_TENSOR_INFO_BYTES, "tensors")?;
    let mut raw = Vec::with_capacity(n_tensors.min(4096) as usize);
    let mut seen = std::collections::HashSet::new();
    for i in 0..n_tensors {
        r.what = format!("tensor info {i}");
        let name = r.string()?;
        r.what = format!("the info of tensor `{name}`");
        if !seen.insert(name.clone()) {
            return Err(r.err(format!("tensor `{name}` appears twice")));
        }
        let n_dims = r.u32()?;
        if n_dims > MAX_DIMS {
            return Err(r.err(format!("tensor `{name}` has {n_dims} dimensions; GGUF allows at most {MAX_DIMS}")));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            dims.push(r.u64()?);
        }
        let ggml_type = r.u32()?;
        let offset = r.u64()?;
        raw.push((name, dims, ggml_type, offset));
    }

    let data_start = align_up(r.pos as u64, alignment)
        .ok_or_else(|| r.err("the data section offset overflows"))?;
    let mut tensors = Vec::with_capacity(raw.len());
    for (name, dims, ggml_type, offset) in raw {
        let n_elems = dims.iter().try_fold(1u64, |acc, &d| if d == 0 { None } else { acc.checked_mul(d) });
        let n_elems = n_elems.filter(|&n| usize::try_from(n).is_ok()).ok_or_else(|| {
            r.err(format!("tensor `{name}` has dimensions {dims:?}: zero, or too many elements to address"))
        })?;
        let (block, block_bytes) = ggml_block(ggml_type)
            .ok_or_else(|| {
                let known = GGML_TYPES.iter().find(|e| e.0 == ggml_type).map_or(String::new(), |e| format!(" ({}, retired from ggml)", e.1));
                r.err(format!("tensor `{name}` has unknown ggml type {ggml_type}{known}: its size cannot be known"))
            })?;
        let ne0 = dims.first().copied().unwrap_or(1);
        if ne0 % block as u64 != 0 {
            return Err(r.err(format!(
                "tensor `{name}`: ne0 = {ne0} is not a multiple of the {} block size {block}",
                ggml_type_name(ggml_type)
            )));
        }
        let size = (n_elems / block as u64).checked_mul(block_bytes as u64);
        if offset % alignment != 0 {
            return Err(r.err(format!("tensor `{name}`: data offset {offset} is not a multiple of the alignment {alignment}")));
        }
        let range = size.and_then(|s| Some((data_start.checked_add(offset)?, s))).and_then(|(a, s)| Some((a, a.checked_add(s)?)));
        let (start, end) = match range {
            Some((a, e)) if e <= data.len() as u64 => (a as usize, e as usize),
            _ => {
                return Err(r.err(format!(
                    "tensor `{name}` ({} bytes at data offset {offset}) runs past the end of the {}-byte file: offset past the end: truncated?",
                    size.map_or("too many".to_string(), |s| s.to_string()),
                    data.len()
                )))
            }
        };
        let dims = dims.into_iter().map(|d| d as usize).collect();
        tensors.push(TensorInfo { name, ggml_type, dims, start, len: end - start });
    }
    Ok(Header { metadata, tensors })
}

fn align_up(x: u64, a: u64) -> Option<u64> {
    Some(x.checked_add(a - 1)? / a * a)
}

/// The split naming of gguf-split: `<prefix>-<no>-of-<count>.gguf` → (prefix, no digits, count digits, extension).
pub(crate) fn split_name(path: &Path) -> Option<(&str, &str, &str, &str)> {
    let name = path.file_name()?.to_str()?;
    let (stem, ext) = name.rsplit_once('.')?;
    let (head, count) = stem.rsplit_once("-of-")?;
    let (prefix, no) = head.rsplit_once('-')?;
    let digits = |s: &str| !s.is_empty() && s.len() <= 9 && s.bytes().all(|b| b.is_ascii_digit());
    (digits(no) && digits(count)).then_some((prefix, no, count, ext))
}

/// All files of the model `path` names: itself, or every split when it is the first of several.
fn split_files(path: &Path) -> Result<Vec<PathBuf>, GgufError> {
    let Some((prefix, no, count, ext)) = split_name(path) else { return Ok(vec![path.to_path_buf()]) };
    let (k, n): (usize, usize) = (no.parse().unwrap_or(0), count.parse().unwrap_or(0));
    let sibling = |i: usize| path.with_file_name(format!("{prefix}-{i:0w$}-of-{count}.{ext}", w = no.len()));
    if k == 0 || k > n {
        return Err(format_err(path, format!("the file name says split {k} of {n}, which cannot be")));
    }
    if k != 1 {
        return Err(format_err(
            path,
            format!("this is split {k} of {n} of a model; pass the first split, {}", sibling(1).display()),
        ));
    }
    // Built as found, so an absurd count in a file name costs nothing before it fails.
    let mut files = vec![path.to_path_buf()];
    for i in 2..=n {
        let f = sibling(i);
        if !f.is_file() {
            return Err(format_err(path, format!("split {i} of {n} is missing: {} does not exist", f.display())));
        }
        files.push(f);
    }
    Ok(files)
}

/// A GGUF model: one file, or all splits of one, memory-mapped.
pub struct GgufFile {
    path: PathBuf,
    files: Vec<PathBuf>,
    maps: Vec<Arc<dyn AsRef<[u8]> + Send + Sync>>,
    metadata: Metadata,
    // In file order, so listings follow the file; `index` maps names to positions.
    tensors: Vec<(usize, TensorInfo)>,
    index: HashMap<String, usize>,
    total_bytes: u64,
}

fn map_file(path: &Path) -> Result<Arc<Mmap>, GgufError> {
    let io = |source| GgufError::Io { path: path.to_path_buf(), source };
    let file = std::fs::File::open(path).map_err(io)?;
    if file.metadata().map_err(io)?.len() == 0 {
        return Err(format_err(path, "not a GGUF file (it is empty)"));
    }
    // SAFETY: the map is read-only; as with any mapped model file, it must not be truncated
    // while the engine runs (the same contract as llama.cpp's and safetensors' loaders).
    let map = Arc::new(unsafe { Mmap::map(&file) }.map_err(io)?);
    crate::model::readahead::advise(&map, path);
    Ok(map)
}

impl GgufFile {
    /// Maps and validates `path`; the first split of a split model brings all its siblings.
    pub fn open(path: &Path) -> Result<GgufFile, GgufError> {
        let files = split_files(path)?;
        let n = files.len() as u64;
        let mut out = GgufFile {
            path: path.to_path_buf(),
            files: files.clone(),
            maps: Vec::new(),
            metadata: Metadata::new(),
            tensors: Vec::new(),
            index: HashMap::new(),
            total_bytes: 0,
        };
        for (i, file) in files.iter().enumerate() {
            let map = map_file(file)?;
            let header = parse(file, &map)?;
            let meta = |k: &str| header.metadata.get(k).and_then(MetaValue::as_u64);
            match meta("split.count") {
                Some(c) if c != n && n == 1 => {
                    return Err(format_err(file, format!(
                        "the metadata says this is one of {c} splits (split.count), but the file name does not end in -00001-of-{c:05}.gguf; keep the names gguf-split gave the files"
                    )))
                }
                Some(c) if c != n => {
                    return Err(format_err(file, format!("split.count is {c}, but the file names say {n} splits")))
                }
                _ => {}
            }
            if n > 1 {
                // split.no counts from 0; the file names from 1.
                if let Some(no) = meta("split.no").filter(|&no| no != i as u64) {
                    return Err(format_err(file, format!("split.no is {no}, expected {i} for split {} of {n}", i + 1)));
                }
            }
            for t in header.tensors {
                if let Some(&j) = out.index.get(&t.name) {
                    let other = &out.files[out.tensors[j].0];
                    return Err(format_err(file, format!("tensor `{}` appears again (also in {})", t.name, other.display())));
                }
                out.index.insert(t.name.clone(), out.tensors.len());
                out.tensors.push((i, t));
            }
            if i == 0 {
                out.metadata = header.metadata;
            }
            out.total_bytes += map.len() as u64;
            out.maps.push(map);
        }
        if let Some(t) = out.get("split.tensors.count").and_then(MetaValue::as_u64) {
            if t != out.tensors.len() as u64 {
                return Err(format_err(path, format!(
                    "split.tensors.count says {t} tensors, but the {n} file(s) hold {}",
                    out.tensors.len()
                )));
            }
        }
        Ok(out)
    }

    /// Metadata of the first split (which holds all of the model's).
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// One metadata value.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.get(key)
    }

    /// The tensor `name`, as a view of its mapped file.
    pub fn tensor(&self, name: &str) -> Result<GgufTensor, GgufError> {
        let missing = || GgufError::MissingTensor { name: name.to_string(), path: self.path.clone() };
        let (split, t) = self.index.get(name).and_then(|&i| self.tensors.get(i)).ok_or_else(missing)?;
        let file = self.files.get(*split).ok_or_else(missing)?;
        let owner = self.maps.get(*split).ok_or_else(missing)?.clone();
        let bytes = HostBytes::new(owner, t.start, t.len)
            .ok_or_else(|| format_err(file, format!("tensor `{name}` lies outside the mapped file")))?;
        Ok(GgufTensor { name: t.name.clone(), ggml_type: t.ggml_type, dims: t.dims.clone(), bytes, file: file.clone() })
    }

    /// Whether a tensor `name` exists.
    pub fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    /// All tensor names, in file order (splits in turn).
    pub fn tensor_names(&self) -> impl Iterator<Item = &str> {
        self.tensors.iter().map(|(_, t)| t.name.as_str())
    }

    /// The files mapped: one, or every split in order.
    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }

    /// The path the model was opened by.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Total size of the mapped files in bytes.
    pub fn total_bytes(&self) -> u64 {
        self.total_bytes
    }
}

#[cfg(test)]
#[path = "file_tests.rs"]
mod tests;
