//! Small request-field types shared by the APIs.

use super::ApiError;
use serde::Deserialize;

/// Most stop strings a request may give (each API documents a small number; a generous
/// cap keeps a hostile request from making every token scan thousands of strings).
const MAX_STOPS: usize = 64;

/// `stop`: a string, a list of strings, or null.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    /// One string.
    One(String),
    /// Several strings.
    Many(Vec<String>),
}

impl Stop {
    /// The stop strings, checked: none empty, not too many.
    pub fn into_vec(stop: Option<Stop>, param: &str) -> Result<Vec<String>, ApiError> {
        let v = match stop {
            None => vec![],
            Some(Stop::One(s)) => vec![s],
            Some(Stop::Many(v)) => v,
        };
        if v.len() > MAX_STOPS {
            return Err(ApiError::invalid(param, format!("at most {MAX_STOPS} stop sequences are supported, got {}", v.len())));
        }
        if v.iter().any(String::is_empty) {
            return Err(ApiError::invalid(param, "stop sequences must not be empty strings"));
        }
        Ok(v)
    }
}

/// A token limit from the request: positive.
pub fn max_tokens(v: Option<u32>, param: &str) -> Result<Option<usize>, ApiError> {
    match v {
        Some(0) => Err(ApiError::invalid(param, format!("{param} must be at least 1"))),
        Some(n) => Ok(Some(n as usize)),
        None => Ok(None),
    }
}

/// `top_k` where `-1` or `0` mean "off" (vLLM's convention) and larger values keep k.
pub fn top_k(v: Option<i64>) -> Result<Option<usize>, ApiError> {
    match v {
        None => Ok(None),
        Some(k) if k <= 0 => Ok(Some(0)),
        Some(k) => usize::try_from(k).map(Some).map_err(|_| ApiError::invalid("top_k", "top_k is too large")),
    }
}

/// A seed of any 64-bit integer (OpenAI allows negative ones).
pub fn seed(v: Option<i64>) -> Option<u64> {
    v.map(|s| s as u64)
}

/// `logit_bias`: token ids (as JSON object keys) to a bias in [-100, 100].
pub fn logit_bias(v: Option<&serde_json::Map<String, serde_json::Value>>, vocab: usize) -> Result<Vec<(u32, f32)>, ApiError> {
    let mut out = vec![];
    for (k, b) in v.into_iter().flatten() {
        let param = format!("logit_bias.{k}");
        let id: u32 = k.parse().map_err(|_| ApiError::invalid(&param, "keys must be token ids"))?;
        if id as usize >= vocab {
            return Err(ApiError::invalid(&param, format!("token id {id} is outside the vocabulary of {vocab}")));
        }
        let b = b.as_f64().ok_or_else(|| ApiError::invalid(&param, "expected a number"))?;
        if !(-100.0..=100.0).contains(&b) {
            return Err(ApiError::invalid(&param, "bias must be between -100 and 100"));
        }
        out.push((id, b as f32));
    }
    Ok(out)
}

