//! The tiny demo model compiled into the binary, so `ft-actor generate` runs on a fresh
//! machine with nothing downloaded. Its weights are random (it proves the pipeline, not
//! language skill); it is written to a cache folder on first use.

use std::path::PathBuf;

const FILES: [(&str, &[u8]); 9] = [
    ("config.json", include_bytes!("../models/demo/config.json")),
    ("generation_config.json", include_bytes!("../models/demo/generation_config.json")),
    ("model.safetensors.index.json", include_bytes!("../models/demo/model.safetensors.index.json")),
    ("model-00001-of-00002.safetensors", include_bytes!("../models/demo/model-00001-of-00002.safetensors")),
    ("model-00002-of-00002.safetensors", include_bytes!("../models/demo/model-00002-of-00002.safetensors")),
    ("tokenizer.json", include_bytes!("../models/demo/tokenizer.json")),
    ("tokenizer_config.json", include_bytes!("../models/demo/tokenizer_config.json")),
    ("chat_template.jinja", include_bytes!("../models/demo/chat_template.jinja")),
    ("special_tokens_map.json", include_bytes!("../models/demo/special_tokens_map.json")),
];

/// Path of the demo model folder, written on first use (or when a file is missing or changed).
pub fn demo_model_dir() -> std::io::Result<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    let dir = base.join("ft-actor").join(format!("demo-{}", env!("CARGO_PKG_VERSION")));
    std::fs::create_dir_all(&dir)?;
    for (name, bytes) in FILES {
        let path = dir.join(name);
        let same = std::fs::metadata(&path).map(|m| m.len() == bytes.len() as u64).unwrap_or(false);
        if !same {
            // Write to a temporary name first so a concurrent reader never sees half a file;
            // the name is unique per call, since threads of one process (tests) race here too.
            static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
            let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let tmp = dir.join(format!(".{name}.{}.{n}", std::process::id()));
            std::fs::write(&tmp, bytes)?;
            std::fs::rename(&tmp, &path)?;
        }
    }
    Ok(dir)
}
