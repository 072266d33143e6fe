//! RoPE settings from transformers 5's `rope_parameters` or the older top-level `rope_theta`
//! + `rope_scaling` keys, normalised the way transformers' `standardize_rope_params` does.

use super::keys::Keys;
use super::{ConfigError, RopeConfig, RopeScaling};
use serde_json::{Map, Value};
use std::path::Path;

/// Reads the rotary embedding of a (text) config object.
pub(super) fn rope_config(obj: &Map<String, Value>, path: &Path, head_dim: usize) -> Result<RopeConfig, ConfigError> {
    let empty = Map::new();
    let params = match obj.get("rope_parameters") {
        Some(Value::Object(p)) => p,
        _ => &empty,
    };
    let scaling = match obj.get("rope_scaling") {
        Some(Value::Object(s)) => s,
        _ => params,
    };
    let p = Keys { obj: params, path };
    let top = Keys { obj, path };
    let s = Keys { obj: scaling, path };
    let theta = p.f32_opt(&["rope_theta"])?.or(top.f32_opt(&["rope_theta"])?).unwrap_or(10000.0);
    let partial_rotary_factor =
        p.f32_opt(&["partial_rotary_factor"])?.or(top.f32_opt(&["partial_rotary_factor"])?).unwrap_or(1.0);
    if !(partial_rotary_factor > 0.0 && partial_rotary_factor <= 1.0) || head_dim == 0 {
        return Err(top.invalid("partial_rotary_factor", format!("must be in (0, 1], found {partial_rotary_factor}")));
    }
    let rope_type = s.find(&["rope_type", "type"]).and_then(|(_, v)| v.as_str()).unwrap_or("default").to_string();
    let max_position = top.usize_opt(&["max_position_embeddings"])?;
    // transformers gives a top-level `original_max_position_embeddings` priority over the one
    // inside the RoPE dict (Phi-3 style configs), and falls back to `max_position_embeddings`.
    let original = top
        .usize_opt(&["original_max_position_embeddings"])?
        .or(s.usize_opt(&["original_max_position_embeddings"])?)
        .or(max_position);
    let scaling = match rope_type.as_str() {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear { factor: s.f32_opt(&["factor"])?.unwrap_or(1.0) },
        "yarn" => {
            let original_max_position = original.unwrap_or(4096);
            // An explicit factor wins; only without one is it the context extension ratio.
            let factor = match s.f32_opt(&["factor"])? {
                Some(f) => f,
                None => max_position.map_or(1.0, |m| m as f32 / original_max_position.max(1) as f32),
            };
            RopeScaling::Yarn {
                factor,
                original_max_position,
                beta_fast: s.f32_opt(&["beta_fast"])?.unwrap_or(32.0),
                beta_slow: s.f32_opt(&["beta_slow"])?.unwrap_or(1.0),
                // Absent and zero mean the same to transformers (both are falsy).
                mscale: s.f32_opt(&["mscale"])?.unwrap_or(0.0),
                mscale_all_dim: s.f32_opt(&["mscale_all_dim"])?.unwrap_or(0.0),
                attention_factor: s.f32_opt(&["attention_factor"])?,
                truncate: s.bool_opt(&["truncate"])?.unwrap_or(true),
            }
        }
        "llama3" => RopeScaling::Llama3 {
            factor: s.f32_opt(&["factor"])?.unwrap_or(1.0),
            low_freq_factor: s.f32_opt(&["low_freq_factor"])?.unwrap_or(1.0),
            high_freq_factor: s.f32_opt(&["high_freq_factor"])?.unwrap_or(4.0),
            original_max_position: original.unwrap_or(8192),
        },
        other => {
            return Err(ConfigError::Invalid {
                path: path.into(),
                key: "rope_type".into(),
                problem: format!("`{other}` is not supported (supported: default, linear, yarn, llama3)"),
            })
        }
    };
    Ok(RopeConfig { theta, partial_rotary_factor, scaling })
}
