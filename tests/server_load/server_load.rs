//! A bounded load test on loopback: 16 concurrent streaming clients, 200 requests over the
//! four streaming APIs; every stream must be well-formed, and memory must not grow once the
//! load has passed. Also: a client that disconnects cancels its generation.


use ft_actor::engine::EngineConfig;
use ft_actor::server::ServerSettings;
use serde_json::json;
use crate::server_common::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const CLIENTS: usize = 16;
const REQUESTS: usize = 200;

fn one_request(base: &str, i: usize) {
    let user = format!("request {i}: tell me something");
    match i % 4 {
        0 => {
            let r = post(base, "/v1/chat/completions", &json!({"messages": [{"role": "user", "content": user}], "max_tokens": 8, "stream": true, "stream_options": {"include_usage": true}}));
            assert_eq!(r.status, 200, "{}", r.body);
            assert!(r.headers.contains("content-type: text/event-stream"));
            check_chat_stream(&r.body);
        }
        1 => {
            let r = post(base, "/v1/messages", &json!({"messages": [{"role": "user", "content": user}], "max_tokens": 8, "stream": true}));
            assert_eq!(r.status, 200, "{}", r.body);
            check_messages_stream(&r.body);
        }
        2 => {
            let r = post(base, "/v1/responses", &json!({"input": user, "max_output_tokens": 8, "stream": true}));
            assert_eq!(r.status, 200, "{}", r.body);
            let resp = check_responses_stream(&r.body);
            assert!(resp["usage"]["output_tokens"].as_u64().is_some_and(|n| n <= 8));
        }
        _ => {
            let r = post(base, "/v1/completions", &json!({"prompt": user, "max_tokens": 8, "stream": true}));
            assert_eq!(r.status, 200, "{}", r.body);
            let events = parse_sse(&r.body);
            assert_eq!(events.last().map(|e| e.data.as_str()), Some("[DONE]"));
        }
    }
}

/// Runs `n` requests from `CLIENTS` threads; returns the wall time.
fn load(base: &str, n: usize) -> Duration {
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for c in 0..CLIENTS {
            s.spawn(move || {
                let mut i = c;
                while i < n {
                    one_request(base, i);
                    i += CLIENTS;
                }
            });
        }
    });
    t0.elapsed()
}

fn wait_idle(server: &TestServer, within: Duration) {
    let t0 = Instant::now();
    loop {
        let s = server.block_on(server.engine.stats()).expect("stats");
        if s.active == 0 && s.queued == 0 {
            return;
        }
        assert!(t0.elapsed() < within, "engine still busy after {within:?}: {} active, {} queued", s.active, s.queued);
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn load_then_disconnects() {
    // A context long enough that an abandoned generation would run for a while.
    let engine = EngineConfig { max_active: 4, ctx_size: Some(4096), ..test_engine_config() };
    let settings = ServerSettings { max_stored_responses: 16, ..ServerSettings::default() };
    let server = TestServer::start(engine, settings);
    let base = server.base.clone();

    // Warm up (allocator pools, thread stacks, the tokenizer's caches), then measure.
    load(&base, 32);
    wait_idle(&server, Duration::from_secs(30));
    let before = rss_bytes();
    let took = load(&base, REQUESTS);
    wait_idle(&server, Duration::from_secs(30));
    let after = rss_bytes();
    eprintln!("{REQUESTS} streaming requests from {CLIENTS} clients in {took:?}; RSS {} → {} MiB", before >> 20, after >> 20);
    assert!(took < Duration::from_secs(240), "load took {took:?}");
    assert!(server.state.responses.len() <= 16, "the response store is bounded");
    let grew = after.saturating_sub(before);
    assert!(grew < 48 << 20, "RSS grew by {} MiB over {REQUESTS} requests", grew >> 20);

    // A client that goes away mid-stream cancels its generation: far fewer tokens are
    // generated than the request allowed.
    let cases = [
        ("/v1/chat/completions", json!({"messages": [{"role": "user", "content": "go on forever"}], "max_tokens": 4000, "ignore_eos": true, "stream": true})),
        ("/v1/responses", json!({"input": "go on forever", "max_output_tokens": 4000, "stream": true, "temperature": 0.0})),
        // Not streaming: the handler is waiting for the whole answer when the client leaves.
        ("/v1/completions", json!({"prompt": "go on forever", "max_tokens": 4000, "ignore_eos": true})),
    ];
    for (path, body) in cases {
        let streaming = body["stream"] == true;
        let tokens_before = server.block_on(server.engine.stats()).expect("stats").tokens_generated;
        let hostport = base.trim_start_matches("http://");
        let mut s = TcpStream::connect(hostport).expect("connect");
        let b = body.to_string();
        let req = format!("POST {path} HTTP/1.1\r\nHost: {hostport}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}", b.len());
        s.write_all(req.as_bytes()).expect("write");
        if streaming {
            let mut buf = [0u8; 256];
            let n = s.read(&mut buf).expect("first bytes of the stream");
            assert!(n > 0);
        } else {
            std::thread::sleep(Duration::from_millis(50));
        }
        drop(s);
        wait_idle(&server, Duration::from_secs(20));
        let generated = server.block_on(server.engine.stats()).expect("stats").tokens_generated - tokens_before;
        eprintln!("{path}: {generated} of 4000 tokens generated before the disconnect cancelled it");
        assert!(generated < 3000, "{path}: {generated} of 4000 tokens generated after the client left");
    }
    // And the server keeps serving.
    one_request(&base, 0);
}
