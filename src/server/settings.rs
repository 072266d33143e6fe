//! The server's own settings (the engine's are [`crate::engine::EngineConfig`]). Their
//! defaults are defined here, once; `configs/README.md` describes each.

use serde::{Deserialize, Serialize};
use std::path::Path;

/// How reasoning is separated from the answer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReasoningParser {
    /// On when the vocabulary has `<think>` and `</think>`.
    #[default]
    Auto,
    /// Always split `<think>…</think>`.
    Think,
    /// Never: reasoning stays in the text.
    None,
}

/// How tool calls are recognised in the output.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolParser {
    /// From the chat template: the markup of gpt-oss, DeepSeek, Kimi, MiniMax or Mistral when it writes that,
    /// else `qwen3_coder` when it writes `<function=`, else `hermes` when it mentions
    /// `<tool_call>`, else none.
    #[default]
    Auto,
    /// `<tool_call>` blocks holding JSON (or XML) calls.
    Hermes,
    /// Like `hermes`, and bare `<function=…>` blocks too.
    Qwen3Coder,
    /// DeepSeek V3.1: `<｜tool▁calls▁begin｜>` sections.
    Deepseek,
    /// DeepSeek V3.2/V4: DSML `<｜DSML｜invoke>` blocks.
    DeepseekDsml,
    /// Mistral/Devstral: `[TOOL_CALLS]NAME[ARGS]{json}`.
    Mistral,
    /// Kimi K2: `<|tool_calls_section_begin|>` sections.
    Kimi,
    /// MiniMax-M2: `<minimax:tool_call>` blocks of `<invoke>`s.
    Minimax,
    /// gpt-oss: harmony channels, calls addressed `to=functions.NAME`.
    Harmony,
    /// Tool calls stay in the text.
    None,
}

/// Settings of the HTTP server.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ServerSettings {
    /// Address to listen on.
    #[serde(deserialize_with = "crate::config::lenient::string")]
    pub host: String,
    /// Port to listen on.
    pub port: u16,
    /// The model id clients use (default: the model folder's name).
    #[serde(default, deserialize_with = "crate::config::lenient::opt_string")]
    pub served_model_name: Option<String>,
    /// Further model ids accepted as the served model.
    pub model_aliases: Vec<String>,
    /// Required key (`Authorization: Bearer` or `x-api-key`); none when unset.
    #[serde(default, deserialize_with = "crate::config::lenient::opt_string")]
    pub api_key: Option<String>,
    /// Largest accepted request body, in bytes.
    #[serde(deserialize_with = "crate::config::lenient::bytes")]
    pub max_body_bytes: u64,
    /// New tokens when a request gives no limit (default: the rest of the context).
    pub default_max_tokens: Option<usize>,
    /// Most new tokens any request generates, whatever it asks (it stops with the length
    /// reason); none when unset.
    pub max_tokens_limit: Option<usize>,
    /// Reasoning split.
    pub reasoning_parser: ReasoningParser,
    /// Tool-call recognition.
    pub tool_parser: ToolParser,
    /// Answer 400 to request fields the server does not know (as the real APIs do).
    pub reject_unknown_fields: bool,
    /// Responses kept for `GET /v1/responses/{id}` and `previous_response_id`.
    pub max_stored_responses: usize,
    /// Seconds without output after which a stream gets a keep-alive (0: never).
    pub keepalive_secs: u64,
    /// Serve `POST /v1/debug/faults`, which makes the next expert copies, CPU kernels or
    /// cache allocations fail (robustness tests only).
    pub fault_injection: bool,
}

impl Default for ServerSettings {
    fn default() -> Self {
        Self {
            host: "127.0.0.1".into(),
            port: 8080,
            served_model_name: None,
            model_aliases: vec![],
            api_key: None,
            max_body_bytes: 32 << 20,
            default_max_tokens: None,
            max_tokens_limit: None,
            reasoning_parser: ReasoningParser::Auto,
            tool_parser: ToolParser::Auto,
            reject_unknown_fields: true,
            max_stored_responses: 256,
            keepalive_secs: 15,
            fault_injection: false,
        }
    }
}

/// The id of the built-in demo model.
pub const DEMO_MODEL_ID: &str = "ft-actor-demo";

impl ServerSettings {
    /// The id clients use: `served_model_name`, else the model folder's name.
    pub fn model_id(&self, model_dir: &Path, demo: bool) -> String {
        if let Some(n) = &self.served_model_name {
            return n.clone();
        }
        if demo {
            return DEMO_MODEL_ID.into();
        }
        if crate::model::gguf::is_gguf(model_dir) {
            // `Qwen3-30B-A3B-Q4_K_M-00001-of-00003.gguf` is served as `Qwen3-30B-A3B-Q4_K_M`.
            let stem = model_dir.file_stem().and_then(|n| n.to_str()).unwrap_or(DEMO_MODEL_ID);
            return crate::model::gguf::split_base(stem).unwrap_or(stem).to_string();
        }
        model_dir
            .file_name()
            .and_then(|n| n.to_str())
            .map(str::to_string)
            .unwrap_or_else(|| DEMO_MODEL_ID.into())
    }

    /// The model id before the engine starts (for `launch`): `None` for the demo model.
    pub fn model_id_for(&self, model: Option<&Path>) -> String {
        match model {
            Some(dir) => self.model_id(dir, false),
            None => self.served_model_name.clone().unwrap_or_else(|| DEMO_MODEL_ID.into()),
        }
    }

    /// The base URL clients reach this server at.
    pub fn base_url(&self) -> String {
        let host = match self.host.as_str() {
            // A wildcard address is where we listen, not where a client connects.
            "0.0.0.0" | "" => "127.0.0.1",
            "::" | "[::]" => "[::1]",
            h if h.contains(':') && !h.starts_with('[') => return format!("http://[{h}]:{}", self.port),
            h => h,
        };
        format!("http://{host}:{}", self.port)
    }
}
