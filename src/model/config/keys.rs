//! Tolerant, typed lookups in a `config.json` object, with errors naming the file and key.

use super::ConfigError;
use serde_json::{Map, Value};
use std::path::Path;

/// Tolerant typed access to a JSON object, with errors naming the file and key.
pub(super) struct Keys<'a> {
    pub(super) obj: &'a Map<String, Value>,
    pub(super) path: &'a Path,
}

impl<'a> Keys<'a> {
    pub(super) fn invalid(&self, key: &str, problem: impl Into<String>) -> ConfigError {
        ConfigError::Invalid { path: self.path.to_path_buf(), key: key.into(), problem: problem.into() }
    }
    /// The first of `keys` that is present and not null.
    pub(super) fn find(&self, keys: &[&str]) -> Option<(&'a str, &'a Value)> {
        keys.iter().find_map(|k| {
            self.obj.get_key_value(*k).filter(|(_, v)| !v.is_null()).map(|(k, v)| (k.as_str(), v))
        })
    }
    pub(super) fn usize_opt(&self, keys: &[&str]) -> Result<Option<usize>, ConfigError> {
        match self.find(keys) {
            None => Ok(None),
            Some((k, v)) => v
                .as_u64()
                .map(|x| Some(x as usize))
                .ok_or_else(|| self.invalid(k, format!("must be a non-negative integer, found {v}"))),
        }
    }
    pub(super) fn usize(&self, keys: &[&str]) -> Result<usize, ConfigError> {
        self.usize_opt(keys)?
            .ok_or_else(|| ConfigError::Missing { path: self.path.to_path_buf(), key: keys.join("` or `") })
    }
    pub(super) fn f32_opt(&self, keys: &[&str]) -> Result<Option<f32>, ConfigError> {
        match self.find(keys) {
            None => Ok(None),
            Some((k, v)) => v
                .as_f64()
                .map(|x| Some(x as f32))
                .ok_or_else(|| self.invalid(k, format!("must be a number, found {v}"))),
        }
    }
    pub(super) fn bool_opt(&self, keys: &[&str]) -> Result<Option<bool>, ConfigError> {
        match self.find(keys) {
            None => Ok(None),
            Some((k, v)) => v.as_bool().map(Some).ok_or_else(|| self.invalid(k, format!("must be true or false, found {v}"))),
        }
    }
    /// An id or list of ids (`eos_token_id` may be either).
    pub(super) fn ids(&self, key: &str) -> Result<Vec<u32>, ConfigError> {
        match self.find(&[key]) {
            None => Ok(vec![]),
            Some((_, Value::Array(a))) => a
                .iter()
                .map(|v| v.as_u64().map(|x| x as u32).ok_or_else(|| self.invalid(key, "must hold integers")))
                .collect(),
            Some((_, v)) => v.as_u64().map(|x| vec![x as u32]).ok_or_else(|| self.invalid(key, "must be an integer or a list")),
        }
    }
}


impl Keys<'_> {
    /// A list of layer indices (`mlp_only_layers`), empty when absent.
    pub(super) fn indices(&self, key: &str) -> Result<Vec<usize>, ConfigError> {
        match self.find(&[key]) {
            None => Ok(vec![]),
            Some((k, Value::Array(a))) => a
                .iter()
                .map(|v| v.as_u64().map(|x| x as usize).ok_or_else(|| self.invalid(k, "must hold layer indices")))
                .collect(),
            Some((k, _)) => Err(self.invalid(k, "must be a list of layer indices")),
        }
    }

    /// A list of strings (`layer_types`), `None` when absent.
    pub(super) fn strings(&self, key: &str) -> Result<Option<Vec<&str>>, ConfigError> {
        match self.find(&[key]) {
            None => Ok(None),
            Some((k, Value::Array(a))) => a
                .iter()
                .map(|v| v.as_str().ok_or_else(|| self.invalid(k, "must hold strings")))
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some((k, _)) => Err(self.invalid(k, "must be a list of strings")),
        }
    }
}
