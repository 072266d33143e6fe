//! Memory-mapped safetensors checkpoints (single file or sharded with an index).
//!
//! Tensor bytes are never copied here: every [`TensorRef`] is a view into the mapped file,
//! so the host copy of the weights exists once, in the page cache.

use ft_backend::{DType, HostBytes};
use memmap2::Mmap;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// A problem with the checkpoint's weight files.
#[derive(Debug, thiserror::Error)]
pub enum WeightsError {
    /// No weight files were found.
    #[error("no *.safetensors files in {0}")]
    NoFiles(PathBuf),
    /// A file could not be opened or mapped.
    #[error("cannot read {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    /// The index JSON is malformed.
    #[error("{path}: {problem}")]
    Index { path: PathBuf, problem: String },
    /// The safetensors header is malformed or the file is shorter than it says.
    #[error("{path} is not a valid safetensors file: {problem}")]
    Format { path: PathBuf, problem: String },
    /// A tensor the model needs is absent.
    #[error("tensor `{name}` not found in {dir}")]
    MissingTensor { name: String, dir: PathBuf },
    /// A tensor the model needs is absent from a file that names tensors its own way (GGUF).
    #[error("tensor `{theirs}` not found in {path} (the model loader needs it as `{name}`)")]
    MissingAs { theirs: String, name: String, path: PathBuf },
    /// A tensor has a shape other than the config implies.
    #[error("tensor `{name}` has shape {found:?}, expected {expected:?} (from config.json)")]
    Shape { name: String, found: Vec<usize>, expected: Vec<usize> },
    /// A tensor's element type is not one the engine computes with.
    #[error("tensor `{name}` has dtype {dtype}, which is not supported (supported: F32, F16, BF16, and F8_E4M3/U8 with the scales of a quantization_config)")]
    DType { name: String, dtype: String },
    /// A tensor another container's loader could not offer (the message names tensor, type
    /// and file).
    #[error("{0}")]
    Unreadable(String),
}

/// The element type of a tensor as the safetensors header names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileDType {
    /// `F32`, `F16` or `BF16`: computed with as they are.
    Float(DType),
    /// `F8_E4M3` (`float8_e4m3fn`): FP8 weights and NVFP4 block scales.
    F8E4M3,
    /// `F8_E8M0` (`float8_e8m0fnu`): power-of-two block scales (DeepSeek-V4's `ue8m0`).
    F8E8M0,
    /// `U8`: packed 4-bit values, E8M0 scales.
    U8,
    /// `I8`.
    I8,
    /// `I32`.
    I32,
    /// `I64`.
    I64,
    /// Already in one of the engine's block layouts (GGUF's block types are stored as the
    /// engine computes with them); the shape counts values, not blocks.
    Packed(DType),
}

impl FileDType {
    /// Parses a safetensors dtype tag; `None` for one the engine never reads.
    pub fn parse(tag: &str) -> Option<FileDType> {
        Some(match tag {
            "F32" => FileDType::Float(DType::F32),
            "F16" => FileDType::Float(DType::F16),
            "BF16" => FileDType::Float(DType::BF16),
            "F8_E4M3" => FileDType::F8E4M3,
            "F8_E8M0" => FileDType::F8E8M0,
            "U8" => FileDType::U8,
            "I8" => FileDType::I8,
            "I32" => FileDType::I32,
            "I64" => FileDType::I64,
            _ => return None,
        })
    }
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            FileDType::Float(d) => d.size(),
            FileDType::F8E4M3 | FileDType::F8E8M0 | FileDType::U8 | FileDType::I8 => 1,
            FileDType::I32 => 4,
            FileDType::I64 => 8,
            FileDType::Packed(d) => d.size(),
        }
    }
    /// The safetensors tag.
    pub fn tag(self) -> &'static str {
        match self {
            FileDType::Float(DType::F16) => "F16",
            FileDType::Float(DType::BF16) => "BF16",
            FileDType::Float(_) => "F32",
            FileDType::F8E4M3 => "F8_E4M3",
            FileDType::F8E8M0 => "F8_E8M0",
            FileDType::U8 => "U8",
            FileDType::I8 => "I8",
            FileDType::I32 => "I32",
            FileDType::I64 => "I64",
            FileDType::Packed(d) => d.name(),
        }
    }
}

impl std::fmt::Display for FileDType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.tag())
    }
}

/// A tensor of any element type the engine reads (quantized data and scales included).
#[derive(Clone, Debug)]
pub struct RawTensor {
    /// Checkpoint name.
    pub name: String,
    /// Element type as stored.
    pub dtype: FileDType,
    /// Shape, outermost first.
    pub shape: Vec<usize>,
    /// The tensor's bytes, a view of the mapped file.
    pub bytes: HostBytes,
    /// The file it is in.
    pub file: PathBuf,
}

impl RawTensor {
    /// The values as f32, for float tensors and scales (`F8_E4M3` decoded exactly); `None`
    /// for integer types.
    pub fn to_f32(&self) -> Option<Vec<f32>> {
        let b = self.bytes.as_slice();
        match self.dtype {
            FileDType::Float(d) => ft_backend::dtype::to_f32_vec(b, d).ok(),
            FileDType::F8E4M3 => Some(b.iter().map(|c| ft_backend::quant::e4m3_to_f32(*c)).collect()),
            FileDType::F8E8M0 => Some(b.iter().map(|c| ft_backend::quant::e8m0_to_f32(*c)).collect()),
            _ => None,
        }
    }
}

/// A tensor inside a mapped file.
#[derive(Clone, Debug)]
pub struct TensorRef {
    /// Checkpoint name.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Shape, outermost first.
    pub shape: Vec<usize>,
    /// The tensor's bytes (little-endian), a view of the mapped file.
    pub bytes: HostBytes,
}

impl TensorRef {
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    /// The values converted to f32 (for small tensors such as norms and biases).
    pub fn to_f32(&self) -> Vec<f32> {
        // Length was validated against dtype and shape when the file was opened.
        ft_backend::dtype::to_f32_vec(self.bytes.as_slice(), self.dtype).unwrap_or_default()
    }
}

struct Entry {
    file: usize,
    dtype: Result<FileDType, Unreadable>,
    shape: Vec<usize>,
    bytes: HostBytes,
}

/// Why a tensor's element type cannot be read.
#[derive(Clone, Debug)]
enum Unreadable {
    /// A safetensors dtype tag the engine does not know.
    Tag(String),
    /// A whole message from another container's loader.
    Message(String),
}

/// A tensor handed to [`WeightFiles::from_entries`] by a loader for another container (GGUF).
pub struct ExternalTensor {
    /// The Hugging Face name the model loader asks for.
    pub name: String,
    /// Index into the file list given alongside.
    pub file: usize,
    /// Element type as the engine reads it, or the message to report if the model reads it.
    pub dtype: Result<FileDType, String>,
    /// Shape, outermost first (rows, columns for a matrix).
    pub shape: Vec<usize>,
    /// The bytes: a view of a mapped file, or owned where the layout had to be converted.
    pub bytes: HostBytes,
}

/// All tensors of a checkpoint folder.
pub struct WeightFiles {
    dir: PathBuf,
    total_bytes: u64,
    files: Vec<PathBuf>,
    entries: HashMap<String, Entry>,
    used: Mutex<std::collections::HashSet<String>>,
    /// For tensors named after another container's (GGUF): the name a missing tensor has there.
    missing_name: Option<MissingName>,
}

/// Maps a checkpoint tensor name to the name the user's file would hold it under.
pub type MissingName = Box<dyn Fn(&str) -> Option<String> + Send + Sync>;

impl WeightFiles {
    /// Maps every safetensors file of `dir` (through `model.safetensors.index.json` when present).
    pub fn open(dir: &Path) -> Result<WeightFiles, WeightsError> {
        let index = dir.join("model.safetensors.index.json");
        let files: Vec<PathBuf> = if index.exists() {
            let text = std::fs::read_to_string(&index).map_err(|source| WeightsError::Io { path: index.clone(), source })?;
            let value: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| WeightsError::Index { path: index.clone(), problem: format!("invalid JSON: {e}") })?;
            let map = value.get("weight_map").and_then(|m| m.as_object()).ok_or_else(|| WeightsError::Index {
                path: index.clone(),
                problem: "missing object `weight_map`".into(),
            })?;
            let mut names: Vec<String> = Vec::new();
            for (tensor, file) in map {
                let file = file.as_str().ok_or_else(|| WeightsError::Index {
                    path: index.clone(),
                    problem: format!("weight_map[`{tensor}`] is not a file name"),
                })?;
                if file.contains('/') || file.contains('\\') || file.contains("..") {
                    return Err(WeightsError::Index { path: index.clone(), problem: format!("shard name `{file}` is not a plain file name") });
                }
                if !names.iter().any(|n| n == file) {
                    names.push(file.to_string());
                }
            }
            names.sort();
            names.into_iter().map(|n| dir.join(n)).collect()
        } else {
            let rd = std::fs::read_dir(dir).map_err(|source| WeightsError::Io { path: dir.to_path_buf(), source })?;
            let mut v: Vec<PathBuf> = rd
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
                .collect();
            v.sort();
            v
        };
        if files.is_empty() {
            return Err(WeightsError::NoFiles(dir.to_path_buf()));
        }
        let mut out = WeightFiles {
            dir: dir.to_path_buf(),
            total_bytes: 0,
            files: vec![],
            entries: HashMap::new(),
            used: Mutex::new(Default::default()),
            missing_name: None,
        };
        for path in files {
            out.add_file(path)?;
        }
        Ok(out)
    }

    /// Maps one safetensors file on its own (e.g. reference tensors in tests and tools).
    pub fn open_file(path: &Path) -> Result<WeightFiles, WeightsError> {
        let mut out = WeightFiles {
            dir: path.parent().unwrap_or(Path::new(".")).to_path_buf(),
            total_bytes: 0,
            files: vec![],
            entries: HashMap::new(),
            used: Mutex::new(Default::default()),
            missing_name: None,
        };
        out.add_file(path.to_path_buf())?;
        Ok(out)
    }

    /// Tensors another container's loader has mapped and named as the checkpoint folder would
    /// (`source` is what the user gave, `files` the files they come from, `total_bytes` their
    /// size; `missing_name` names a missing tensor as that container would).
    pub fn from_entries(source: &Path, files: Vec<PathBuf>, total_bytes: u64, tensors: Vec<ExternalTensor>, missing_name: MissingName) -> Result<WeightFiles, WeightsError> {
        let mut entries = HashMap::new();
        for t in tensors {
            if t.file >= files.len() {
                return Err(WeightsError::Format { path: source.to_path_buf(), problem: format!("`{}` refers to file {} of {}", t.name, t.file, files.len()) });
            }
            let name = t.name.clone();
            let entry = Entry { file: t.file, dtype: t.dtype.map_err(Unreadable::Message), shape: t.shape, bytes: t.bytes };
            if entries.insert(name.clone(), entry).is_some() {
                return Err(WeightsError::Format { path: files[t.file].clone(), problem: format!("two tensors map to `{name}`") });
            }
        }
        Ok(WeightFiles { dir: source.to_path_buf(), total_bytes, files, entries, used: Mutex::new(Default::default()), missing_name: Some(missing_name) })
    }

    fn add_file(&mut self, path: PathBuf) -> Result<(), WeightsError> {
        let file = std::fs::File::open(&path).map_err(|source| WeightsError::Io { path: path.clone(), source })?;
        // SAFETY: the mapping is read-only; a checkpoint modified while it is being served is
        // outside what any engine can guard against (transformers and llama.cpp map the same way).
        let map = unsafe { Mmap::map(&file) }.map_err(|source| WeightsError::Io { path: path.clone(), source })?;
        let bad = |problem: String| WeightsError::Format { path: path.clone(), problem };
        if map.len() < 8 {
            return Err(bad(format!("file is {} bytes, shorter than the 8-byte header length", map.len())));
        }
        let header_len = u64::from_le_bytes(map[..8].try_into().map_err(|_| bad("short header".into()))?) as usize;
        let data_start = 8usize.checked_add(header_len).filter(|e| *e <= map.len()).ok_or_else(|| {
            bad(format!("header length {header_len} runs past the end of the file ({} bytes): truncated?", map.len()))
        })?;
        let header: BTreeMap<String, serde_json::Value> = serde_json::from_slice(&map[8..data_start])
            .map_err(|e| bad(format!("header is not valid JSON: {e}")))?;
        let data_len = map.len() - data_start;
        let file_idx = self.files.len();
        let map: Arc<Mmap> = Arc::new(map);
        super::readahead::advise(&map, &path);
        for (name, info) in header {
            if name == "__metadata__" {
                continue;
            }
            let dtype_str = info.get("dtype").and_then(|d| d.as_str()).ok_or_else(|| bad(format!("`{name}` has no dtype")))?;
            let shape: Vec<usize> = info
                .get("shape")
                .and_then(|s| s.as_array())
                .ok_or_else(|| bad(format!("`{name}` has no shape")))?
                .iter()
                .map(|d| d.as_u64().map(|x| x as usize))
                .collect::<Option<_>>()
                .ok_or_else(|| bad(format!("`{name}` has a malformed shape")))?;
            let offs = info
                .get("data_offsets")
                .and_then(|s| s.as_array())
                .filter(|a| a.len() == 2)
                .and_then(|a| Some((a[0].as_u64()? as usize, a[1].as_u64()? as usize)))
                .ok_or_else(|| bad(format!("`{name}` has malformed data_offsets")))?;
            if offs.0 > offs.1 || offs.1 > data_len {
                return Err(bad(format!(
                    "`{name}` occupies bytes {}..{} but the file holds {data_len} data bytes: truncated?",
                    offs.0, offs.1
                )));
            }
            let dtype = FileDType::parse(dtype_str).ok_or_else(|| Unreadable::Tag(dtype_str.to_string()));
            if let Ok(dt) = dtype {
                let expect = shape.iter().product::<usize>() * dt.size();
                if expect != offs.1 - offs.0 {
                    return Err(bad(format!("`{name}` holds {} bytes but shape {shape:?} of {dt} needs {expect}", offs.1 - offs.0)));
                }
            }
            let owner: Arc<dyn AsRef<[u8]> + Send + Sync> = map.clone();
            let bytes = HostBytes::new(owner, data_start + offs.0, offs.1 - offs.0)
                .ok_or_else(|| bad(format!("`{name}` lies outside the file")))?;
            if let Some(first) = self.entries.get(&name) {
                // Which copy a loader would take is arbitrary: refuse instead of guessing.
                return Err(bad(format!("`{name}` is also in {}; a tensor must be in one shard only", self.files[first.file].display())));
            }
            self.entries.insert(name, Entry { file: file_idx, dtype, shape, bytes });
        }
        self.total_bytes += map.len() as u64;
        self.files.push(path);
        Ok(())
    }

    /// The folder the files are in (the file, for a GGUF).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The weight files, in load order.
    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }

    /// Whether a tensor exists.
    pub fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    /// All tensor names.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(|s| s.as_str())
    }

    /// Bytes of all weight files.
    pub fn total_bytes(&self) -> u64 {
        self.total_bytes
    }

    /// A float (F32/F16/BF16) tensor by name, of any shape.
    pub fn get(&self, name: &str) -> Result<TensorRef, WeightsError> {
        let t = self.get_raw(name)?;
        match t.dtype {
            FileDType::Float(dtype) => Ok(TensorRef { name: t.name, dtype, shape: t.shape, bytes: t.bytes }),
            other => Err(WeightsError::DType { name: name.into(), dtype: other.tag().into() }),
        }
    }

    /// A tensor of any readable element type by name (quantized data, scales).
    pub fn get_raw(&self, name: &str) -> Result<RawTensor, WeightsError> {
        let e = self
            .entries
            .get(name)
            .ok_or_else(|| match self.missing_name.as_ref().and_then(|f| f(name)) {
                Some(theirs) => WeightsError::MissingAs { theirs, name: name.into(), path: self.dir.clone() },
                None => WeightsError::MissingTensor { name: name.into(), dir: self.dir.clone() },
            })?;
        let dtype = e.dtype.clone().map_err(|u| match u {
            Unreadable::Tag(dtype) => WeightsError::DType { name: name.into(), dtype },
            Unreadable::Message(m) => WeightsError::Unreadable(m),
        })?;
        let bytes = e.bytes.clone();
        if let Ok(mut used) = self.used.lock() {
            used.insert(name.to_string());
        }
        Ok(RawTensor { name: name.into(), dtype, shape: e.shape.clone(), bytes, file: self.files[e.file].clone() })
    }

    /// The stored element type of a tensor, if it exists and is readable.
    pub fn file_dtype(&self, name: &str) -> Option<FileDType> {
        self.entries.get(name).and_then(|e| e.dtype.clone().ok())
    }


    /// A tensor that must have exactly `shape`.
    pub fn get_shaped(&self, name: &str, shape: &[usize]) -> Result<TensorRef, WeightsError> {
        let t = self.get(name)?;
        if t.shape != shape {
            return Err(WeightsError::Shape { name: name.into(), found: t.shape, expected: shape.to_vec() });
        }
        Ok(t)
    }

    /// Tensors present in the files that no `get` asked for (e.g. a vision tower).
    pub fn unused(&self) -> Vec<String> {
        let used = self.used.lock().map(|u| u.clone()).unwrap_or_default();
        let mut v: Vec<String> = self.entries.keys().filter(|k| !used.contains(*k)).cloned().collect();
        v.sort();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &Path, names: &[&str]) {
        let data = [0u8; 8];
        let views: Vec<(String, safetensors::tensor::TensorView)> = names
            .iter()
            .map(|n| (n.to_string(), safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![2], &data).unwrap()))
            .collect();
        safetensors::serialize_to_file(views, None, path).unwrap();
    }

    #[test]
    fn a_tensor_in_two_shards_is_refused() {
        let dir = std::env::temp_dir().join(format!("ft-actor-dup-shards-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        write(&dir.join("model-00001-of-00002.safetensors"), &["a", "b"]);
        write(&dir.join("model-00002-of-00002.safetensors"), &["b", "c"]);
        let e = WeightFiles::open(&dir).err().expect("duplicate refused").to_string();
        assert!(e.contains("`b`") && e.contains("model-00001-of-00002.safetensors") && e.contains("model-00002-of-00002.safetensors"), "{e}");
        write(&dir.join("model-00002-of-00002.safetensors"), &["c"]);
        let files = WeightFiles::open(&dir).expect("distinct names load");
        assert_eq!(files.names().count(), 3);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
