//! Soak under chaos, on loopback, bounded to about a minute: 16 concurrent clients on both
//! APIs (streamed and not), random disconnects mid-stream, while a chaos thread resizes the
//! expert cache and injects faults (failing copies, out-of-memory copies, failing CPU
//! kernels, failing slot allocations). Every completed response is well formed; every failed
//! one is a typed error in its API's shape; the server stays up; memory is flat after
//! warm-up (RSS growth under 10 %); and once the load stops no sequence, lease or armed fault
//! is left behind.


use ft_actor::policy::MoeMode;
use ft_actor::server::ServerSettings;
use serde_json::{json, Value};
use crate::server_common::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const CLIENTS: usize = 16;
/// Chaos phase after warm-up; the test takes about this long plus start-up.
const SOAK: Duration = Duration::from_secs(45);

/// A small deterministic generator (per thread), so a failure can be replayed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

#[derive(Default)]
struct Tally {
    completed: AtomicU64,
    failed_typed: AtomicU64,
    disconnected: AtomicU64,
    resizes: AtomicU64,
    faults: AtomicU64,
}

/// The error body of a failed request in `anthropic` or OpenAI shape: returns its type.
fn error_type(v: &Value, anthropic: bool) -> String {
    if anthropic {
        assert_eq!(v["type"], "error", "Anthropic error shape: {v}");
    }
    let t = v["error"]["type"].as_str().unwrap_or_else(|| panic!("error without a type: {v}"));
    assert!(v["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "error without a message: {v}");
    t.to_string()
}

/// What a fault may surface as: a server fault or a transient shortage, nothing else.
fn assert_fault_type(t: &str, anthropic: bool) {
    let ok: &[&str] = if anthropic { &["api_error", "overloaded_error"] } else { &["server_error", "service_unavailable_error"] };
    assert!(ok.contains(&t), "unexpected error type {t}");
}

/// Checks a streamed body: a complete stream, or one that ends with an error event.
fn check_stream(body: &str, anthropic: bool, tally: &Tally) {
    let events = parse_sse(body);
    let last = events.last().expect("a stream has events");
    let failed = if anthropic { last.name.as_deref() == Some("error") } else { last.data != "[DONE]" };
    if failed {
        let v: Value = serde_json::from_str(&last.data).expect("error event is JSON");
        assert_fault_type(&error_type(&v, anthropic), anthropic);
        tally.failed_typed.fetch_add(1, Ordering::Relaxed);
    } else {
        if anthropic {
            check_messages_stream(body);
        } else {
            check_chat_stream(body);
        }
        tally.completed.fetch_add(1, Ordering::Relaxed);
    }
}

/// Sends a streamed request and hangs up after the first bytes of the body.
fn disconnect_mid_stream(base: &str, path: &str, body: &Value) {
    let hostport = base.trim_start_matches("http://");
    let mut s = TcpStream::connect(hostport).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(60))).expect("timeout");
    let b = body.to_string();
    let req = format!("POST {path} HTTP/1.1\r\nHost: {hostport}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}", b.len());
    s.write_all(req.as_bytes()).expect("write");
    let mut buf = [0u8; 512];
    let _ = s.read(&mut buf);
}

fn one_request(base: &str, rng: &mut Rng, i: u64, tally: &Tally) {
    let anthropic = rng.below(2) == 0;
    let stream = rng.below(4) != 0;
    let max_tokens = 4 + rng.below(24);
    let user = format!("client request {i}: write a short note");
    let (path, body) = if anthropic {
        ("/v1/messages", json!({"messages": [{"role": "user", "content": user}], "max_tokens": max_tokens, "stream": stream}))
    } else {
        ("/v1/chat/completions", json!({"messages": [{"role": "user", "content": user}], "max_tokens": max_tokens, "stream": stream}))
    };
    if stream && rng.below(5) == 0 {
        disconnect_mid_stream(base, path, &body);
        tally.disconnected.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let r = post(base, path, &body);
    match r.status {
        200 if stream => check_stream(&r.body, anthropic, tally),
        200 => {
            let v = r.json();
            if anthropic {
                assert_eq!(v["type"], "message", "{v}");
                assert!(v["stop_reason"].is_string(), "{v}");
            } else {
                assert_eq!(v["object"], "chat.completion", "{v}");
                assert!(v["choices"][0]["finish_reason"].is_string(), "{v}");
            }
            tally.completed.fetch_add(1, Ordering::Relaxed);
        }
        500 | 503 => {
            assert_fault_type(&error_type(&r.json(), anthropic), anthropic);
            if r.status == 503 {
                assert!(r.headers.contains("retry-after:"), "503 without Retry-After: {}", r.headers);
            }
            tally.failed_typed.fetch_add(1, Ordering::Relaxed);
        }
        s => panic!("unexpected status {s}: {}", r.body),
    }
}

/// Resizes the cache or arms a fault, at random.
fn chaos(base: &str, rng: &mut Rng, max_slots: u64, tally: &Tally) {
    if rng.below(3) == 0 {
        let slots = rng.below(max_slots + 1);
        let r = post(base, "/v1/cache/resize", &json!({"slots": slots}));
        match r.status {
            200 => assert_eq!(r.json()["slots"], slots),
            // An injected allocation failure: typed, and the cache stays as it was.
            503 => assert_eq!(error_type(&r.json(), false), "service_unavailable_error"),
            s => panic!("resize to {slots}: {s} {}", r.body),
        }
        tally.resizes.fetch_add(1, Ordering::Relaxed);
    } else {
        let kind = ["copy", "copy_oom", "cpu", "alloc"][rng.below(4) as usize];
        let r = post(base, "/v1/debug/faults", &json!({kind: 1}));
        assert_eq!(r.status, 200, "{}", r.body);
        tally.faults.fetch_add(1, Ordering::Relaxed);
    }
}

/// Bytes of saved prefix state the soak's engine keeps.
const PREFIX_BUDGET: u64 = 4 << 20;

#[test]
fn soak_with_cancellations_resizes_and_faults() {
    let mut engine_cfg = test_engine_config();
    engine_cfg.max_active = 4;
    engine_cfg.moe_mode = MoeMode::Hybrid;
    engine_cfg.expert_cache_slots = Some(8);
    // Both branches priced alike, so the split sends misses to copies and to the CPU.
    engine_cfg.b_p = Some(1e9);
    engine_cfg.b_h = Some(1e9);
    // The prefix store is a cache that fills to its budget: a small one fills during warm-up,
    // so growth after it is what a leak would be (4 MiB: f16 caches make anchors half the
    // size of f32 ones, and a slow debug build must still fill it within the warm-up).
    engine_cfg.prefix_cache_budget = PREFIX_BUDGET;
    let settings = ServerSettings { fault_injection: true, max_stored_responses: 16, ..ServerSettings::default() };
    let server = TestServer::start(engine_cfg, settings);
    let base = server.base.clone();
    let max_slots = server.engine.info().memory.max_cache_slots.min(64);
    assert!(max_slots > 0, "the demo model's experts fit a cache");

    let tally = Tally::default();
    let stop = AtomicBool::new(false);
    let warm = AtomicBool::new(false);
    let mut rss_warm = 0;
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for c in 0..CLIENTS {
            let (base, tally, stop) = (&base, &tally, &stop);
            s.spawn(move || {
                let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (c as u64 + 1) * 0x1234_5678);
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    one_request(base, &mut rng, i, tally);
                    i += 1;
                }
            });
        }
        let (base, tally, stop, warm) = (&base, &tally, &stop, &warm);
        s.spawn(move || {
            let mut rng = Rng(0xC0FF_EE00_D15E_A5E5);
            // Warm-up: load only, so allocator pools and caches reach their working size.
            std::thread::sleep(Duration::from_secs(8));
            warm.store(true, Ordering::Relaxed);
            let until = Instant::now() + SOAK;
            while Instant::now() < until {
                chaos(base, &mut rng, max_slots, tally);
                std::thread::sleep(Duration::from_millis(150 + rng.below(250)));
            }
            stop.store(true, Ordering::Relaxed);
        });
        while !warm.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(50));
        }
        rss_warm = rss_bytes();
    });
    let rss_end = rss_bytes();

    // Faults left armed by the last chaos rounds would hit the checks below: fire them off.
    let t_idle = Instant::now();
    loop {
        let s = server.block_on(server.engine.stats()).expect("the engine answers");
        if s.active == 0 && s.queued == 0 && s.sequences == 0 {
            assert_eq!(s.cache_leased, 0, "a lease outlived its request");
            assert!(s.reuse.index.bytes <= PREFIX_BUDGET, "prefix store over budget: {}", s.reuse.index.bytes);
            eprintln!("idle: prefix store {} KiB in {} anchors; {} of {} slots used", s.reuse.index.bytes >> 10, s.reuse.index.anchors, s.cache_used, s.cache_slots);
            break;
        }
        assert!(t_idle.elapsed() < Duration::from_secs(30), "not idle 30 s after the load: {} active, {} sequences", s.active, s.sequences);
        std::thread::sleep(Duration::from_millis(20));
    }
    let pending = server.engine.pending_faults();
    let fired = tally.faults.load(Ordering::Relaxed);
    eprintln!(
        "soak {:?}: {} completed, {} failed with typed errors, {} disconnected, {} resizes, {fired} faults armed ({pending:?} unfired); RSS {} → {} MiB",
        t0.elapsed(),
        tally.completed.load(Ordering::Relaxed),
        tally.failed_typed.load(Ordering::Relaxed),
        tally.disconnected.load(Ordering::Relaxed),
        tally.resizes.load(Ordering::Relaxed),
        rss_warm >> 20,
        rss_end >> 20,
    );
    assert!(tally.completed.load(Ordering::Relaxed) > 100, "too little completed work to call this a soak");
    assert!(tally.failed_typed.load(Ordering::Relaxed) > 0, "no injected fault reached a client");
    assert!(rss_end <= rss_warm + rss_warm / 10, "RSS grew from {} to {} MiB", rss_warm >> 20, rss_end >> 20);

    // Still serving, correctly: with the faults still armed cleared, every request completes.
    server.engine.clear_faults();
    let tally = Tally::default();
    let mut rng = Rng(7);
    for i in 0..24 {
        one_request(&base, &mut rng, i, &tally);
    }
    assert_eq!(tally.failed_typed.load(Ordering::Relaxed), 0, "a fault outlived the chaos");
    let h = request(&base, "GET", "/health", &[], b"");
    assert_eq!(h.status, 200, "{}", h.body);
}
