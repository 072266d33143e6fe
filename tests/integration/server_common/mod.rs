//! Shared by the server tests: a real server on loopback, a small blocking HTTP client, and
//! an SSE checker.
#![allow(dead_code)]

use ft_actor::engine::{Engine, EngineConfig, EngineHandle};
use ft_actor::server::{AppState, ServerSettings};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// A server running on 127.0.0.1 with an ephemeral port, in its own runtime thread.
pub struct TestServer {
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// The engine behind it.
    pub engine: EngineHandle,
    /// The app state (metrics, stores).
    pub state: AppState,
    /// Keeps the runtime (and so the server and engine) alive.
    _rt: tokio::runtime::Runtime,
}

/// Engine settings for tests: the demo model on the CPU, small context.
pub fn test_engine_config() -> EngineConfig {
    EngineConfig {
        backend: ft_actor::device::BackendChoice::Cpu,
        cpu_threads: Some(1),
        ctx_size: Some(1024),
        max_queue: 256,
        ..EngineConfig::default()
    }
}

impl TestServer {
    /// Starts the demo model and serves it with `settings` (host/port are ignored).
    pub fn start(engine_cfg: EngineConfig, settings: ServerSettings) -> TestServer {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let (base, engine, state) = rt.block_on(async move {
            let engine = Engine::spawn(engine_cfg, None).await.expect("engine starts on the demo model");
            let state = AppState::new(engine.clone(), settings).expect("server state");
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind loopback");
            let base = format!("http://{}", listener.local_addr().expect("local addr"));
            let st = state.clone();
            tokio::spawn(async move {
                let _ = ft_actor::server::serve(listener, st, std::future::pending()).await;
            });
            (base, engine, state)
        });
        TestServer { base, engine, state, _rt: rt }
    }

    /// Runs a future on the server's runtime.
    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self._rt.block_on(f)
    }
}

/// A whole HTTP response.
#[derive(Debug)]
pub struct Resp {
    /// Status code.
    pub status: u16,
    /// Header block (lower-cased names).
    pub headers: String,
    /// Body (de-chunked).
    pub body: String,
}

impl Resp {
    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

/// Sends one request with `Connection: close` and reads the whole response.
pub fn request(base: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Resp {
    let hostport = base.trim_start_matches("http://");
    let mut s = TcpStream::connect(hostport).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(120))).expect("timeout");
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {hostport}\r\nConnection: close\r\nContent-Length: {}\r\n", body.len());
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).expect("write head");
    s.write_all(body).expect("write body");
    let mut raw = vec![];
    s.read_to_end(&mut raw).expect("read");
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("header end");
    let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).expect("status");
    let body = &raw[end + 4..];
    let body = if head.contains("transfer-encoding: chunked") {
        ft_actor::launch::dechunk(body).expect("valid chunked body")
    } else {
        body.to_vec()
    };
    Resp { status, headers: head, body: String::from_utf8(body).expect("UTF-8 body") }
}

/// POSTs JSON.
pub fn post(base: &str, path: &str, body: &serde_json::Value) -> Resp {
    request(base, "POST", path, &[("content-type", "application/json")], body.to_string().as_bytes())
}

/// One SSE event.
#[derive(Debug, Clone)]
pub struct Event {
    /// `event:` name, if any.
    pub name: Option<String>,
    /// `data:` payload.
    pub data: String,
}

/// Parses an SSE body, panicking on anything malformed: every line is `event:`, `data:`, a
/// comment or blank; every event has data; the body ends with a blank line.
pub fn parse_sse(body: &str) -> Vec<Event> {
    assert!(body.ends_with("\n\n"), "SSE body must end with a blank line: {body:?}");
    let mut events = vec![];
    for block in body.split("\n\n").filter(|b| !b.is_empty()) {
        let (mut name, mut data) = (None, None::<String>);
        for line in block.lines() {
            if let Some(v) = line.strip_prefix("event: ") {
                name = Some(v.to_string());
            } else if let Some(v) = line.strip_prefix("data: ") {
                data = Some(match data {
                    Some(d) => format!("{d}\n{v}"),
                    None => v.to_string(),
                });
            } else if line.starts_with(':') {
            } else {
                panic!("malformed SSE line {line:?} in {body:?}");
            }
        }
        if let Some(data) = data {
            events.push(Event { name, data });
        } else {
            assert!(name.is_none(), "event without data: {block:?}");
        }
    }
    events
}

/// Checks an OpenAI chat stream: JSON chunks, one finish, `[DONE]` last; returns the text.
pub fn check_chat_stream(body: &str) -> String {
    let events = parse_sse(body);
    let last = events.last().expect("events");
    assert_eq!(last.data, "[DONE]", "stream must end with [DONE]");
    let (mut text, mut finishes) = (String::new(), 0);
    for e in &events[..events.len() - 1] {
        let v: serde_json::Value = serde_json::from_str(&e.data).unwrap_or_else(|_| panic!("chunk is not JSON: {}", e.data));
        assert_eq!(v["object"], "chat.completion.chunk");
        if let Some(c) = v["choices"].as_array().and_then(|c| c.first()) {
            if let Some(t) = c["delta"]["content"].as_str() {
                text.push_str(t);
            }
            if !c["finish_reason"].is_null() {
                finishes += 1;
            }
        }
    }
    assert_eq!(finishes, 1, "exactly one finish_reason");
    text
}

/// Checks an Anthropic stream's event order and block nesting.
pub fn check_messages_stream(body: &str) {
    let events = parse_sse(body);
    let names: Vec<&str> = events.iter().map(|e| e.name.as_deref().expect("named events")).collect();
    assert_eq!(names.first(), Some(&"message_start"));
    assert_eq!(names.last(), Some(&"message_stop"));
    assert_eq!(names.iter().filter(|n| **n == "message_delta").count(), 1);
    let mut open: Option<u64> = None;
    let mut next_index = 0;
    for e in &events {
        let v: serde_json::Value = serde_json::from_str(&e.data).expect("event data is JSON");
        assert_eq!(v["type"].as_str(), e.name.as_deref(), "type matches the event name");
        match v["type"].as_str() {
            Some("content_block_start") => {
                assert!(open.is_none(), "blocks do not nest");
                assert_eq!(v["index"].as_u64(), Some(next_index));
                open = Some(next_index);
            }
            Some("content_block_delta") => assert_eq!(v["index"].as_u64(), open),
            Some("content_block_stop") => {
                assert_eq!(v["index"].as_u64(), open);
                open = None;
                next_index += 1;
            }
            _ => {}
        }
    }
    assert!(open.is_none(), "every block is closed");
}

/// Checks a Responses stream: increasing sequence numbers, created first, a terminal event last.
pub fn check_responses_stream(body: &str) -> serde_json::Value {
    let events = parse_sse(body);
    for (seq, e) in events.iter().enumerate() {
        let v: serde_json::Value = serde_json::from_str(&e.data).expect("event data is JSON");
        assert_eq!(v["type"].as_str(), e.name.as_deref());
        assert_eq!(v["sequence_number"].as_u64(), Some(seq as u64), "sequence numbers count up from 0");
    }
    assert_eq!(events[0].name.as_deref(), Some("response.created"));
    let last = events.last().expect("events");
    assert!(matches!(last.name.as_deref(), Some("response.completed" | "response.incomplete")), "{:?}", last.name);
    serde_json::from_str::<serde_json::Value>(&last.data).expect("json")["response"].clone()
}

/// Resident memory of this process in bytes (Linux), 0 where unknown.
pub fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmRSS:")).map(str::to_string))
        .and_then(|l| l.split_whitespace().nth(1).and_then(|kb| kb.parse::<u64>().ok()))
        .map(|kb| kb * 1024)
        .unwrap_or(0)
}
