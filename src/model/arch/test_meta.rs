//! Hand-built GGUF metadata for the per-family config tests: keys as llama.cpp's converter
//! writes them, and the config the loader makes of them.

use super::{config_json, spec_for, GgufKeys};
use crate::model::config::{ConfigError, ModelConfig};
use crate::model::gguf::{MetaValue, Metadata};
use serde_json::Value;
use std::path::Path;

/// `general.architecture = arch`, each of `keys` under the `arch.` prefix, and `extra` as given.
pub(super) fn gguf_meta(arch: &str, keys: &[(&str, MetaValue)], extra: &[(&str, MetaValue)]) -> Metadata {
    let mut m = Metadata::new();
    m.insert("general.architecture".into(), MetaValue::String(arch.into()));
    for (key, v) in keys {
        m.insert(format!("{arch}.{key}"), v.clone());
    }
    for (key, v) in extra {
        m.insert((*key).into(), v.clone());
    }
    m
}

/// The config.json and the parsed config of `m`, read as the file `path` holding the tensors
/// `has` accepts.
pub(super) fn load_config(m: &Metadata, path: &str, has: &dyn Fn(&str) -> bool) -> Result<(Value, ModelConfig), ConfigError> {
    let path = Path::new(path);
    let spec = spec_for(m, path)?;
    let c = config_json(spec, &GgufKeys { meta: m, arch: spec.gguf, path, tensors: has })?;
    let cfg = ModelConfig::from_json(&c, path)?;
    Ok((c, cfg))
}
