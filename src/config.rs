//! Deployment configuration with figment: built-in defaults → a TOML file (`--config`)
//! → `FT_*` environment variables → command-line flags, later sources winning.
//!
//! Keys are flat (`port = 8080`, `vram_budget = "6GiB"`) so that each has one obvious
//! environment variable (`FT_PORT`, `FT_VRAM_BUDGET`). The engine keys are the fields of
//! [`EngineConfig`] and take their defaults from `EngineConfig::default()`; the server keys
//! are the fields of [`ServerSettings`] with its defaults. No default is written twice.
//! `configs/README.md` describes every key.

use crate::device::BackendChoice;
use crate::engine::{EngineConfig, PrefillMode};
use crate::policy::{parse_bytes, MoeMode, VramBudget};
use crate::server::ServerSettings;
use figment::providers::{Env, Format, Serialized, Toml};
use figment::value::Dict;
use figment::{Figment, Metadata, Profile, Provider};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

/// Prefix of the environment variables read as configuration.
pub const ENV_PREFIX: &str = "FT_";

/// A configuration that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// `--config` names a file that does not exist.
    #[error("config file {0} does not exist")]
    MissingFile(PathBuf),
    /// A source has a key that no setting has.
    #[error("unknown setting `{key}` in {source_name} (see configs/README.md for the keys)")]
    UnknownKey {
        /// The key.
        key: String,
        /// Where it came from (file name, environment, flags).
        source_name: String,
    },
    /// A value has the wrong type or cannot be parsed (figment names key and source).
    #[error("{0}")]
    Invalid(String),
}

impl From<figment::Error> for ConfigError {
    fn from(e: figment::Error) -> Self {
        // figment's Display gives the first error only; join them all.
        ConfigError::Invalid(e.into_iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; "))
    }
}

/// The engine keys as they appear in files and the environment: enums and byte sizes as
/// text, so every source (TOML, `FT_*`, flags) writes them the same way.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct EngineKeys {
    #[serde(default, deserialize_with = "lenient::opt_string")]
    model: Option<String>,
    #[serde(deserialize_with = "lenient::string")]
    backend: String,
    cpu_threads: Option<usize>,
    #[serde(deserialize_with = "lenient::string")]
    quant_dot: String,
    #[serde(deserialize_with = "lenient::string")]
    vram_budget: String,
    expert_cache_slots: Option<u64>,
    #[serde(deserialize_with = "lenient::string")]
    moe_mode: String,
    #[serde(deserialize_with = "lenient::string")]
    prefill: String,
    ctx_size: Option<usize>,
    max_active: usize,
    step_tokens: usize,
    #[serde(deserialize_with = "lenient::string")]
    kv_budget: String,
    kv_page_rows: usize,
    #[serde(deserialize_with = "lenient::string")]
    kv_dtype: String,
    max_queue: usize,
    #[serde(default, deserialize_with = "lenient::opt_string")]
    b_p: Option<String>,
    #[serde(default, deserialize_with = "lenient::opt_string")]
    b_h: Option<String>,
    #[serde(default, deserialize_with = "lenient::opt_string")]
    cache_dir: Option<String>,
    #[serde(deserialize_with = "lenient::string")]
    prefix_cache_budget: String,
    #[serde(deserialize_with = "lenient::string")]
    prefix_cache_device_budget: String,
    anchor_interval: usize,
}

fn backend_name(b: BackendChoice) -> &'static str {
    match b {
        BackendChoice::Auto => "auto",
        BackendChoice::Cpu => "cpu",
        BackendChoice::Cuda => "cuda",
        BackendChoice::Wgpu => "wgpu",
    }
}

fn prefill_name(p: PrefillMode) -> &'static str {
    match p {
        PrefillMode::Auto => "auto",
        PrefillMode::Decode => "decode",
        PrefillMode::Stream => "stream",
    }
}

impl From<&EngineConfig> for EngineKeys {
    fn from(c: &EngineConfig) -> Self {
        let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string());
        Self {
            model: path(&c.model),
            backend: backend_name(c.backend).into(),
            cpu_threads: c.cpu_threads,
            quant_dot: c.quant_dot.to_string(),
            vram_budget: c.vram_budget.to_string(),
            expert_cache_slots: c.expert_cache_slots,
            moe_mode: c.moe_mode.to_string(),
            prefill: prefill_name(c.prefill).into(),
            ctx_size: c.ctx_size,
            max_active: c.max_active,
            step_tokens: c.step_tokens,
            kv_budget: c.kv_budget.map_or("auto".into(), |b| b.to_string()),
            kv_page_rows: c.kv_page_rows,
            kv_dtype: c.kv_dtype.name().into(),
            max_queue: c.max_queue,
            b_p: c.b_p.map(|v| v.to_string()),
            b_h: c.b_h.map(|v| v.to_string()),
            cache_dir: path(&c.cache_dir),
            prefix_cache_budget: c.prefix_cache_budget.to_string(),
            prefix_cache_device_budget: c.prefix_cache_device_budget.map_or("auto".into(), |b| b.to_string()),
            anchor_interval: c.anchor_interval,
        }
    }
}

impl EngineKeys {
    fn engine_config(&self) -> Result<EngineConfig, ConfigError> {
        let bad = |key: &str, e: String| ConfigError::Invalid(format!("setting `{key}`: {e}"));
        let rate = |key: &str, v: &Option<String>| -> Result<Option<f64>, ConfigError> {
            v.as_deref().map(|s| parse_bytes(s).map(|b| b as f64).map_err(|e| bad(key, e.to_string()))).transpose()
        };
        if self.max_active == 0 {
            return Err(bad("max_active", "must be at least 1".into()));
        }
        if self.step_tokens == 0 {
            return Err(bad("step_tokens", "must be at least 1".into()));
        }
        if self.kv_page_rows == 0 {
            return Err(bad("kv_page_rows", "must be at least 1".into()));
        }
        if self.cpu_threads == Some(0) {
            return Err(bad("cpu_threads", "must be at least 1 (leave it unset for all cores)".into()));
        }
        if self.anchor_interval == 0 {
            return Err(bad("anchor_interval", "must be at least 1".into()));
        }
        if self.ctx_size == Some(0) {
            return Err(bad("ctx_size", "must be at least 1 (leave it unset for the model's maximum)".into()));
        }
        Ok(EngineConfig {
            model: self.model.as_ref().map(PathBuf::from),
            backend: self.backend.parse::<BackendChoice>().map_err(|e| bad("backend", e))?,
            cpu_threads: self.cpu_threads,
            quant_dot: self.quant_dot.parse::<crate::engine::QuantDot>().map_err(|e| bad("quant_dot", e))?,
            vram_budget: self.vram_budget.parse::<VramBudget>().map_err(|e| bad("vram_budget", e.to_string()))?,
            expert_cache_slots: self.expert_cache_slots,
            moe_mode: self.moe_mode.parse::<MoeMode>().map_err(|e| bad("moe_mode", e.to_string()))?,
            prefill: self.prefill.parse::<PrefillMode>().map_err(|e| bad("prefill", e))?,
            ctx_size: self.ctx_size,
            max_active: self.max_active,
            step_tokens: self.step_tokens,
            kv_page_rows: self.kv_page_rows,
            kv_budget: match self.kv_budget.trim() {
                "auto" => None,
                b => match parse_bytes(b).map_err(|e| bad("kv_budget", e.to_string()))? {
                    0 => return Err(bad("kv_budget", "must be more than 0 (or auto)".into())),
                    b => Some(b),
                },
            },
            kv_dtype: match ft_backend::DType::parse(self.kv_dtype.trim()) {
                Some(d @ (ft_backend::DType::F32 | ft_backend::DType::BF16 | ft_backend::DType::F16 | ft_backend::DType::Q8_0)) => d,
                _ => return Err(bad("kv_dtype", format!("unknown `{}`: use f16, bf16, f32 or q8_0", self.kv_dtype))),
            },
            max_queue: self.max_queue,
            b_p: rate("b_p", &self.b_p)?,
            b_h: rate("b_h", &self.b_h)?,
            cache_dir: self.cache_dir.as_ref().map(PathBuf::from),
            prefix_cache_budget: parse_bytes(&self.prefix_cache_budget).map_err(|e| bad("prefix_cache_budget", e.to_string()))?,
            prefix_cache_device_budget: match self.prefix_cache_device_budget.trim() {
                "auto" => None,
                b => Some(parse_bytes(b).map_err(|e| bad("prefix_cache_device_budget", e.to_string()))?),
            },
            anchor_interval: self.anchor_interval,
        })
    }
}

/// The effective configuration of `ft-actor serve` (and of the server `launch` starts).
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// How to start the engine.
    pub engine: EngineConfig,
    /// How to run the HTTP server.
    pub server: ServerSettings,
    /// The merged key/value table, for `--print-config`.
    table: Map<String, Value>,
}

/// Every setting key: engine keys, then server keys.
pub fn keys() -> Vec<String> {
    let mut k = object_keys(&EngineKeys::from(&EngineConfig::default()));
    k.extend(object_keys(&ServerSettings::default()));
    k
}

fn object_keys<T: Serialize>(v: &T) -> Vec<String> {
    match serde_json::to_value(v) {
        Ok(Value::Object(m)) => m.keys().cloned().collect(),
        _ => vec![],
    }
}

impl ServeConfig {
    /// Merges the sources: defaults, then `file` (if any), then the `FT_*` environment,
    /// then `flags` (keys as in the file; absent flags must be absent from the map).
    pub fn load(file: Option<&Path>, flags: Map<String, Value>) -> Result<ServeConfig, ConfigError> {
        let keys = keys();
        let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let mut fig = Figment::new()
            .merge(Named("built-in defaults", EngineKeys::from(&EngineConfig::default())))
            .merge(Named("built-in defaults", ServerSettings::default()));
        if let Some(f) = file {
            if !f.is_file() {
                return Err(ConfigError::MissingFile(f.to_path_buf()));
            }
            fig = fig.merge(Toml::file_exact(f));
        }
        fig = fig.merge(Env::prefixed(ENV_PREFIX).only(&key_refs));
        fig = fig.merge(Named("command-line flags", Value::Object(flags)));
        let table: Map<String, Value> = fig.extract()?;
        if let Some(k) = table.keys().find(|k| !keys.contains(k)) {
            let source_name = match fig.find_metadata(k) {
                Some(m) => match &m.source {
                    Some(src) => format!("{} {src}", m.name),
                    None => m.name.to_string(),
                },
                None => "the configuration".into(),
            };
            return Err(ConfigError::UnknownKey { key: k.clone(), source_name });
        }
        let engine = fig.extract::<EngineKeys>()?.engine_config()?;
        let server: ServerSettings = fig.extract()?;
        Ok(ServeConfig { engine, server, table })
    }

    /// The effective settings as TOML (a valid config file).
    pub fn to_toml(&self) -> String {
        // TOML has no null: unset optional keys are written as comments.
        let mut set = toml::Table::new();
        let mut unset = vec![];
        for k in keys() {
            match self.table.get(&k) {
                None | Some(Value::Null) => unset.push(k),
                Some(v) => {
                    if let Ok(t) = toml::Value::try_from(v) {
                        set.insert(k, t);
                    }
                }
            }
        }
        let mut s = toml::to_string(&set).unwrap_or_default();
        for k in unset {
            s.push_str(&format!("# {k} = (unset)\n"));
        }
        s
    }
}

/// A serialized value with a name users understand in error messages (figment would name
/// it after the Rust type).
struct Named<T>(&'static str, T);

impl<T: Serialize> Provider for Named<T> {
    fn metadata(&self) -> Metadata {
        Metadata::named(self.0)
    }

    fn data(&self) -> Result<figment::value::Map<Profile, Dict>, figment::Error> {
        Serialized::defaults(&self.1).data()
    }
}

/// Deserializers that accept a number where text is meant: environment values are parsed
/// (`FT_API_KEY=1234` arrives as a number), but a key or a name is still text.
pub mod lenient {
    use serde::de::{self, Deserializer, Visitor};
    use std::fmt;

    struct Text;

    impl Visitor<'_> for Text {
        type Value = String;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a string")
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_string<E: de::Error>(self, v: String) -> Result<String, E> {
            Ok(v)
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_u128<E: de::Error>(self, v: u128) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_i128<E: de::Error>(self, v: i128) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_bool<E: de::Error>(self, v: bool) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_char<E: de::Error>(self, v: char) -> Result<String, E> {
            Ok(v.to_string())
        }
    }

    struct OptText;

    impl<'de> Visitor<'de> for OptText {
        type Value = Option<String>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a string or nothing")
        }
        fn visit_none<E: de::Error>(self) -> Result<Option<String>, E> {
            Ok(None)
        }
        fn visit_unit<E: de::Error>(self) -> Result<Option<String>, E> {
            Ok(None)
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Option<String>, D::Error> {
            string(d).map(Some)
        }
    }

    /// Text, also from a number or a boolean.
    pub fn string<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
        d.deserialize_any(Text)
    }

    /// Optional text, also from a number or a boolean.
    pub fn opt_string<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
        d.deserialize_option(OptText)
    }

    /// A byte count: an integer, or text such as `32MiB`.
    pub fn bytes<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        let s = string(d)?;
        crate::policy::parse_bytes(&s).map_err(de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_come_from_the_structs() {
        let c = ServeConfig::load(None, Map::new()).expect("defaults load");
        let d = EngineConfig::default();
        assert_eq!(c.engine.max_queue, d.max_queue);
        assert_eq!(c.engine.backend, d.backend);
        assert_eq!(c.server, ServerSettings::default());
    }

    #[test]
    fn flags_override_and_parse() {
        let mut flags = Map::new();
        flags.insert("port".into(), 9001.into());
        flags.insert("vram_budget".into(), "6GiB".into());
        flags.insert("backend".into(), "cpu".into());
        flags.insert("api_key".into(), "1234".into());
        let c = ServeConfig::load(None, flags).expect("loads");
        assert_eq!(c.server.port, 9001);
        assert_eq!(c.engine.vram_budget, VramBudget::Bytes(6 << 30));
        assert_eq!(c.engine.backend, BackendChoice::Cpu);
        assert_eq!(c.server.api_key.as_deref(), Some("1234"));
        assert!(c.to_toml().contains("port = 9001"));
    }

    #[test]
    fn bad_values_name_the_key() {
        let mut flags = Map::new();
        flags.insert("backend".into(), "tpu".into());
        let e = ServeConfig::load(None, flags).expect_err("rejected").to_string();
        assert!(e.contains("backend") && e.contains("tpu"), "{e}");
        let mut flags = Map::new();
        flags.insert("nonsense".into(), 1.into());
        let e = ServeConfig::load(None, flags).expect_err("rejected").to_string();
        assert!(e.contains("nonsense") && e.contains("command-line flags"), "{e}");
    }

    #[test]
    fn every_key_is_documented() {
        let doc = include_str!("../configs/README.md");
        for k in keys() {
            assert!(doc.contains(&format!("`{k}`")), "configs/README.md does not describe `{k}`");
        }
    }
}
