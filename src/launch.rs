//! `ft-actor launch`: point a coding agent at the local server.
//!
//! Each agent is configured the way it is documented to be configured, without writing to
//! the user's own settings files: Claude Code by environment variables, Codex by `-c`
//! overrides defining a model provider that speaks the Responses API, OpenCode by an
//! inline configuration (`OPENCODE_CONFIG_CONTENT`) with an OpenAI-compatible provider,
//! Qwen Code by its documented `OPENAI_*` variables.
//! Cloud API keys are removed from the agent's environment so that nothing it does can
//! reach (and bill) a cloud account by accident.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// The agents `launch` knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Agent {
    /// Claude Code (`claude`), through the Anthropic Messages API.
    Claude,
    /// OpenAI Codex CLI (`codex`), through the Responses API.
    Codex,
    /// OpenCode (`opencode`), through the OpenAI chat completions API.
    Opencode,
    /// Qwen Code (`qwen`), through the OpenAI chat completions API.
    #[value(name = "qwen-code")]
    QwenCode,
}

impl Agent {
    /// The program's name on `PATH`.
    pub fn program(self) -> &'static str {
        match self {
            Agent::Claude => "claude",
            Agent::Codex => "codex",
            Agent::Opencode => "opencode",
            Agent::QwenCode => "qwen",
        }
    }

    /// The npm package that installs it.
    pub fn npm_package(self) -> &'static str {
        match self {
            Agent::Claude => "@anthropic-ai/claude-code",
            Agent::Codex => "@openai/codex",
            Agent::Opencode => "opencode-ai",
            Agent::QwenCode => "@qwen-code/qwen-code",
        }
    }
}

/// Where `program` would run from: itself when it names a path, else the first match on
/// `PATH` (`None`: not installed).
pub fn find_program(program: &str, path: Option<&std::ffi::OsStr>) -> Option<std::path::PathBuf> {
    let p = std::path::Path::new(program);
    if p.components().count() > 1 {
        return p.is_file().then(|| p.to_path_buf());
    }
    std::env::split_paths(path?).map(|d| d.join(program)).find(|c| c.is_file())
}

/// Cloud credentials and switches removed from the agent's environment.
pub const CLOUD_VARS: &[&str] = &[
    "ANTHROPIC_API_KEY", "CLAUDE_CODE_OAUTH_TOKEN", "CLAUDE_CODE_USE_BEDROCK", "CLAUDE_CODE_USE_VERTEX",
    "CLAUDE_CODE_USE_FOUNDRY", "AWS_BEARER_TOKEN_BEDROCK", "OPENAI_API_KEY", "OPENAI_BASE_URL", "OPENAI_ORG_ID",
    "AZURE_OPENAI_API_KEY", "CODEX_API_KEY", "GEMINI_API_KEY", "GOOGLE_API_KEY", "GOOGLE_GENERATIVE_AI_API_KEY",
    "OPENROUTER_API_KEY", "GROQ_API_KEY", "MISTRAL_API_KEY", "DEEPSEEK_API_KEY", "XAI_API_KEY", "TOGETHER_API_KEY",
    "FIREWORKS_API_KEY", "CEREBRAS_API_KEY", "OPENCODE_API_KEY",
];

/// Environment variable Codex reads the key from (its provider's `env_key`).
pub const CODEX_KEY_VAR: &str = "FT_ACTOR_API_KEY";

/// Token sent when the server has no key (agents refuse to start without one).
const NO_KEY: &str = "ft-actor-local";

/// What the agent needs to know about the server.
#[derive(Clone, Debug)]
pub struct Target {
    /// Server base URL without a trailing `/` (e.g. `http://127.0.0.1:8080`).
    pub base_url: String,
    /// Model id to request.
    pub model: String,
    /// The server's key, if it requires one.
    pub api_key: Option<String>,
    /// Context length, when known (Codex and OpenCode size their history by it).
    pub context: Option<usize>,
}

/// Exactly what `launch` does to run an agent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Program to run.
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Variables set in its environment.
    pub set: Vec<(String, String)>,
    /// Variables removed from its environment.
    pub unset: Vec<String>,
}

/// The plan for `agent` against `t`; `present` tells which variables are set now (only
/// those are listed as removed), `program` overrides the agent's program path.
pub fn plan(agent: Agent, t: &Target, program: Option<&str>, extra_args: &[String], present: &dyn Fn(&str) -> bool) -> Plan {
    let key = t.api_key.clone().unwrap_or_else(|| NO_KEY.into());
    let mut set: Vec<(String, String)> = vec![];
    let mut args: Vec<String> = vec![];
    let mut s = |k: &str, v: &str| set.push((k.to_string(), v.to_string()));
    match agent {
        Agent::Claude => {
            s("ANTHROPIC_BASE_URL", &t.base_url);
            s("ANTHROPIC_AUTH_TOKEN", &key);
            // Every model slot Claude Code may pick (main, opus/sonnet/haiku aliases,
            // background tasks, subagents) goes to the one local model.
            for var in [
                "ANTHROPIC_MODEL", "ANTHROPIC_DEFAULT_OPUS_MODEL", "ANTHROPIC_DEFAULT_SONNET_MODEL",
                "ANTHROPIC_DEFAULT_HAIKU_MODEL", "ANTHROPIC_SMALL_FAST_MODEL", "CLAUDE_CODE_SUBAGENT_MODEL",
            ] {
                s(var, &t.model);
            }
            // The attribution header changes per request and would defeat prompt reuse.
            s("CLAUDE_CODE_ATTRIBUTION_HEADER", "0");
            s("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1");
            // A model it does not know is assumed to hold 1M tokens: compaction would come
            // only after the server had refused the prompt as too long.
            if let Some(ctx) = t.context {
                s("CLAUDE_CODE_MAX_CONTEXT_TOKENS", &ctx.to_string());
            }
        }
        Agent::Codex => {
            s(CODEX_KEY_VAR, &key);
            let q = |v: &str| toml::Value::String(v.to_string()).to_string();
            let provider = format!(
                "model_providers.ft_actor={{ name = {}, base_url = {}, env_key = {}, wire_api = \"responses\" }}",
                q("ft-actor (local)"),
                q(&format!("{}/v1", t.base_url)),
                q(CODEX_KEY_VAR),
            );
            for c in [provider, "model_provider=\"ft_actor\"".to_string(), format!("model={}", q(&t.model))] {
                args.push("-c".into());
                args.push(c);
            }
            if let Some(ctx) = t.context {
                args.push("-c".into());
                args.push(format!("model_context_window={ctx}"));
            }
        }
        Agent::Opencode => {
            let mut model = serde_json::json!({"name": t.model});
            if let Some(ctx) = t.context {
                model["limit"] = serde_json::json!({"context": ctx, "output": (ctx / 2).min(32_768)});
            }
            let cfg = serde_json::json!({
                "$schema": "https://opencode.ai/config.json",
                "provider": {"ft-actor": {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": "ft-actor (local)",
                    "options": {"baseURL": format!("{}/v1", t.base_url), "apiKey": key},
                    "models": {t.model.clone(): model},
                }},
                "model": format!("ft-actor/{}", t.model),
                "small_model": format!("ft-actor/{}", t.model),
            });
            s("OPENCODE_CONFIG_CONTENT", &cfg.to_string());
        }
        Agent::QwenCode => {
            s("OPENAI_API_KEY", &key);
            s("OPENAI_BASE_URL", &format!("{}/v1", t.base_url));
            s("OPENAI_MODEL", &t.model);
        }
    }
    args.extend(extra_args.iter().cloned());
    // A variable the agent is given is not also listed as removed.
    let unset = CLOUD_VARS.iter().filter(|v| present(v) && !set.iter().any(|(k, _)| k == *v)).map(|v| v.to_string()).collect();
    Plan { program: program.unwrap_or(agent.program()).to_string(), args, set, unset }
}

impl Plan {
    /// Shell lines doing what the plan does (the `--dry-run` output).
    pub fn shell(&self) -> String {
        let mut out = String::new();
        for v in &self.unset {
            let _ = writeln!(out, "unset {v}");
        }
        for (k, v) in &self.set {
            let _ = writeln!(out, "export {k}={}", shell_quote(v));
        }
        let mut cmd = shell_quote(&self.program);
        for a in &self.args {
            cmd.push(' ');
            cmd.push_str(&shell_quote(a));
        }
        let _ = writeln!(out, "{cmd}");
        out
    }

    /// The command, ready to spawn.
    pub fn command(&self) -> std::process::Command {
        let mut c = std::process::Command::new(&self.program);
        c.args(&self.args);
        for v in &self.unset {
            c.env_remove(v);
        }
        for (k, v) in &self.set {
            c.env(k, v);
        }
        c
    }
}

/// Quotes `s` for a POSIX shell (plain words stay as they are).
pub fn shell_quote(s: &str) -> String {
    if !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_./:=@,+%".contains(c)) {
        return s.to_string();
    }
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// Why a request to the server failed.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The URL is not `http://host:port[/...]`.
    #[error("unsupported URL {0} (expected http://HOST:PORT)")]
    Url(String),
    /// Connecting, sending or reading failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The answer is not HTTP.
    #[error("malformed HTTP response")]
    Malformed,
}

/// A minimal HTTP/1.1 GET to a local server (no TLS, no redirects): `(status, body)`.
/// `launch` only ever talks to ft-actor on this machine, which a full client would not
/// improve on.
pub fn http_get(base_url: &str, path: &str, api_key: Option<&str>, timeout: Duration) -> Result<(u16, String), HttpError> {
    let rest = base_url.strip_prefix("http://").ok_or_else(|| HttpError::Url(base_url.into()))?;
    let hostport = rest.split('/').next().unwrap_or(rest);
    let addr = hostport
        .to_socket_addrs()
        .map_err(|_| HttpError::Url(base_url.into()))?
        .next()
        .ok_or_else(|| HttpError::Url(base_url.into()))?;
    let mut s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    let mut req = format!("GET {path} HTTP/1.1\r\nHost: {hostport}\r\nConnection: close\r\nAccept: application/json\r\n");
    if let Some(k) = api_key {
        let _ = write!(req, "Authorization: Bearer {k}\r\n");
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes())?;
    let mut raw = vec![];
    s.read_to_end(&mut raw)?;
    parse_response(&raw).ok_or(HttpError::Malformed)
}

/// Splits a whole HTTP/1.1 response into status and body (de-chunking it if needed).
pub fn parse_response(raw: &[u8]) -> Option<(u16, String)> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&raw[..end]).ok()?;
    let status: u16 = head.split_whitespace().nth(1)?.parse().ok()?;
    let body = &raw[end + 4..];
    let chunked = head
        .lines()
        .any(|l| l.to_ascii_lowercase().starts_with("transfer-encoding:") && l.to_ascii_lowercase().contains("chunked"));
    let body = if chunked { dechunk(body)? } else { body.to_vec() };
    Some((status, String::from_utf8_lossy(&body).into_owned()))
}

/// Decodes a chunked transfer-encoded body.
pub fn dechunk(mut b: &[u8]) -> Option<Vec<u8>> {
    let mut out = vec![];
    loop {
        let line_end = b.windows(2).position(|w| w == b"\r\n")?;
        let size_str = std::str::from_utf8(&b[..line_end]).ok()?;
        let size = usize::from_str_radix(size_str.split(';').next()?.trim(), 16).ok()?;
        b = &b[line_end + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(b.get(..size)?);
        b = b.get(size + 2..)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target() -> Target {
        Target { base_url: "http://127.0.0.1:8080".into(), model: "Qwen3-30B-A3B".into(), api_key: None, context: Some(32768) }
    }

    #[test]
    fn claude_gets_every_model_slot_and_no_cloud_key() {
        let p = plan(Agent::Claude, &target(), None, &["--resume".into()], &|v| v == "ANTHROPIC_API_KEY");
        assert_eq!(p.program, "claude");
        assert_eq!(p.args, vec!["--resume"]);
        assert_eq!(p.unset, vec!["ANTHROPIC_API_KEY"]);
        let get = |k: &str| p.set.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("ANTHROPIC_BASE_URL"), Some("http://127.0.0.1:8080"));
        assert_eq!(get("ANTHROPIC_DEFAULT_HAIKU_MODEL"), Some("Qwen3-30B-A3B"));
        assert_eq!(get("CLAUDE_CODE_ATTRIBUTION_HEADER"), Some("0"));
        assert_eq!(get("CLAUDE_CODE_MAX_CONTEXT_TOKENS"), Some("32768"));
    }

    #[test]
    fn codex_provider_is_valid_toml() {
        let p = plan(Agent::Codex, &Target { model: "we\"ird".into(), ..target() }, None, &[], &|_| false);
        let provider = p.args[1].strip_prefix("model_providers.ft_actor=").expect("provider override");
        let v: toml::Table = toml::from_str(&format!("x = {provider}")).expect("valid TOML");
        assert_eq!(v["x"]["wire_api"].as_str(), Some("responses"));
        assert_eq!(v["x"]["base_url"].as_str(), Some("http://127.0.0.1:8080/v1"));
        let model = p.args.iter().find_map(|a| a.strip_prefix("model=")).expect("model override");
        let v: toml::Table = toml::from_str(&format!("m = {model}")).expect("valid TOML");
        assert_eq!(v["m"].as_str(), Some("we\"ird"));
    }

    #[test]
    fn qwen_code_gets_the_local_server_by_its_openai_variables() {
        let p = plan(Agent::QwenCode, &target(), None, &[], &|v| v == "OPENAI_API_KEY" || v == "ANTHROPIC_API_KEY");
        assert_eq!(p.program, "qwen");
        let get = |k: &str| p.set.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("OPENAI_BASE_URL"), Some("http://127.0.0.1:8080/v1"));
        assert_eq!(get("OPENAI_API_KEY"), Some(NO_KEY));
        assert_eq!(get("OPENAI_MODEL"), Some(target().model.as_str()));
        assert_eq!(p.unset, vec!["ANTHROPIC_API_KEY".to_string()], "a set variable is not also removed");
        assert!(p.shell().contains("export OPENAI_BASE_URL=") && !p.shell().contains("unset OPENAI_API_KEY"));
    }

    #[test]
    fn programs_are_found_on_path_or_by_path() {
        let dir = std::env::temp_dir().join(format!("ft-actor-find-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("qwen"), "").unwrap();
        let path = std::env::join_paths([std::path::Path::new("/nonexistent"), &dir]).unwrap();
        assert_eq!(find_program("qwen", Some(&path)), Some(dir.join("qwen")));
        assert_eq!(find_program("claude", Some(&path)), None);
        assert_eq!(find_program(dir.join("qwen").to_str().unwrap(), None), Some(dir.join("qwen")));
        assert_eq!(find_program("qwen", None), None);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn shell_quoting() {
        assert_eq!(shell_quote("abc-1.2"), "abc-1.2");
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
        assert_eq!(shell_quote(""), "''");
    }

    #[test]
    fn chunked_bodies() {
        let raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
        assert_eq!(parse_response(raw), Some((200, "abcde".into())));
    }
}
