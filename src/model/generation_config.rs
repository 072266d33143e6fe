//! `generation_config.json`: the model's own end-of-sequence ids and default sampling.

use crate::sampling::SamplingParams;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// A malformed `generation_config.json` (a missing one is not an error).
#[derive(Debug, thiserror::Error)]
#[error("{path}: {problem}")]
pub struct GenerationConfigError {
    /// The file.
    pub path: PathBuf,
    /// What is wrong.
    pub problem: String,
}

/// Defaults a model ships for generation.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GenerationConfig {
    /// Ids that end generation.
    pub eos_token_ids: Vec<u32>,
    /// Whether the model's authors intend sampling (else greedy).
    pub do_sample: Option<bool>,
    /// Default temperature.
    pub temperature: Option<f32>,
    /// Default top-p.
    pub top_p: Option<f32>,
    /// Default top-k.
    pub top_k: Option<usize>,
    /// Default min-p.
    pub min_p: Option<f32>,
    /// Default repetition penalty.
    pub repetition_penalty: Option<f32>,
}

impl GenerationConfig {
    /// Reads `<dir>/generation_config.json`; absent file → defaults.
    pub fn from_dir(dir: &Path) -> Result<GenerationConfig, GenerationConfigError> {
        // A GGUF file carries no sampling defaults; its end tokens come with its tokenizer.
        if super::gguf::is_gguf(dir) {
            return Ok(Self::default());
        }
        let path = dir.join("generation_config.json");
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Self::default()),
            Err(e) => return Err(GenerationConfigError { path, problem: e.to_string() }),
        };
        let err = |problem: String| GenerationConfigError { path: path.clone(), problem };
        let v: Value = serde_json::from_str(&text).map_err(|e| err(format!("invalid JSON: {e}")))?;
        let f = |k: &str| v.get(k).and_then(Value::as_f64).map(|x| x as f32);
        let eos_token_ids = match v.get("eos_token_id") {
            None | Some(Value::Null) => vec![],
            Some(Value::Array(a)) => a
                .iter()
                .map(|x| x.as_u64().map(|i| i as u32))
                .collect::<Option<_>>()
                .ok_or_else(|| err("eos_token_id must hold integers".into()))?,
            Some(x) => vec![x.as_u64().ok_or_else(|| err("eos_token_id must be an integer or a list".into()))? as u32],
        };
        Ok(GenerationConfig {
            eos_token_ids,
            do_sample: v.get("do_sample").and_then(Value::as_bool),
            temperature: f("temperature"),
            top_p: f("top_p"),
            top_k: v.get("top_k").and_then(Value::as_u64).map(|x| x as usize),
            min_p: f("min_p"),
            repetition_penalty: f("repetition_penalty"),
        })
    }

    /// The model's default sampling (greedy when it says `do_sample: false`).
    pub fn sampling(&self) -> SamplingParams {
        if self.do_sample == Some(false) {
            return SamplingParams::greedy();
        }
        let d = SamplingParams::default();
        SamplingParams {
            temperature: self.temperature.unwrap_or(d.temperature),
            top_p: self.top_p.unwrap_or(d.top_p),
            top_k: self.top_k.unwrap_or(d.top_k),
            min_p: self.min_p.unwrap_or(d.min_p),
            repetition_penalty: self.repetition_penalty.unwrap_or(d.repetition_penalty),
            ..d
        }
    }
}
