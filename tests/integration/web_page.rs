//! The web page at `/` of `serve`: its files and `/v1/stats` over HTTP, then the page itself in
//! headless Chromium (`tests/web/page_test.js` through playwright-core): it loads, a message
//! streams a reply, the engine view updates, thinking and tool calls render.
//!
//! `.ci/install-browser.sh` installs Debian's `chromium` and the pinned playwright-core into
//! `target/browser`. The test looks for the browser at `FT_CHROMIUM` (default
//! `/usr/bin/chromium`) and the package at `FT_PLAYWRIGHT_CORE` (default
//! `target/browser/node_modules/playwright-core`). Without them it prints why it skips, unless
//! `FT_REQUIRE_BROWSER=1` (CI) makes that a failure.

use crate::server_common::{request, test_engine_config, TestServer};
use ft_actor::server::ServerSettings;
use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn header<'a>(headers: &'a str, name: &str) -> Option<&'a str> {
    headers.lines().find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(':'))).map(str::trim)
}

#[test]
fn page_assets_and_stats_are_served() {
    let server = TestServer::start(test_engine_config(), ServerSettings::default());
    let get = |path: &str, extra: &[(&str, &str)]| request(&server.base, "GET", path, extra, b"");

    let page = get("/", &[]);
    assert_eq!(page.status, 200, "{}", page.body);
    assert_eq!(header(&page.headers, "content-type"), Some("text/html; charset=utf-8"));
    assert_eq!(header(&page.headers, "cache-control"), Some("no-cache"));
    assert!(page.body.contains("<title>ft-actor</title>") && page.body.contains("/assets/app.js"), "{}", page.body);
    assert!(!page.body.contains("http://") && !page.body.contains("https://"), "the page loads nothing from elsewhere");

    for (name, kind) in [("app.js", "text/javascript"), ("chat.js", "text/javascript"), ("dashboard.js", "text/javascript"), ("style.css", "text/css")] {
        let r = get(&format!("/assets/{name}"), &[]);
        assert_eq!(r.status, 200, "{name}: {}", r.body);
        assert!(header(&r.headers, "content-type").is_some_and(|t| t.starts_with(kind)), "{name}: {}", r.headers);
        let etag = header(&r.headers, "etag").expect("an ETag").to_string();
        let again = get(&format!("/assets/{name}"), &[("if-none-match", &etag)]);
        assert_eq!(again.status, 304, "{name} unchanged is not sent again");
        assert!(again.body.is_empty());
    }
    assert_eq!(get("/assets/nope.js", &[]).status, 404);

    let s = get("/v1/stats", &[]);
    assert_eq!(s.status, 200, "{}", s.body);
    let v = s.json();
    assert_eq!(v["model"], "ft-actor-demo");
    for key in ["tokens", "expert_cache", "split", "bandwidth", "prefix_cache", "kv", "steps", "requests"] {
        assert!(v[key].is_object(), "/v1/stats lacks {key}: {v}");
    }
    assert!(v["expert_cache"]["layers"].is_array() && v["split"]["q_star_for_top_k_misses"].is_number(), "{v}");
    assert!(v["bandwidth"]["host_to_device_bytes_per_s"].is_number() && v["bandwidth"]["source"].is_string(), "{v}");
}

#[test]
fn the_stats_need_the_key_but_the_page_does_not() {
    let settings = ServerSettings { api_key: Some("s3cret".into()), ..ServerSettings::default() };
    let server = TestServer::start(test_engine_config(), settings);
    assert_eq!(request(&server.base, "GET", "/", &[], b"").status, 200);
    assert_eq!(request(&server.base, "GET", "/assets/app.js", &[], b"").status, 200);
    assert_eq!(request(&server.base, "GET", "/v1/stats", &[], b"").status, 401);
    assert_eq!(request(&server.base, "GET", "/v1/stats", &[("authorization", "Bearer s3cret")], b"").status, 200);
}

/// What the browser test needs, or why it cannot run.
fn browser_tools() -> Result<(PathBuf, PathBuf), String> {
    let chromium = std::env::var_os("FT_CHROMIUM").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
    if !chromium.is_file() {
        return Err(format!("no browser at {}", chromium.display()));
    }
    let playwright = std::env::var_os("FT_PLAYWRIGHT_CORE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/browser/node_modules/playwright-core"));
    if !playwright.join("package.json").is_file() {
        return Err(format!("no playwright-core in {}", playwright.display()));
    }
    match Command::new("node").arg("--version").output() {
        Ok(o) if o.status.success() => Ok((chromium, playwright)),
        _ => Err("no node on PATH".into()),
    }
}

#[test]
fn the_page_streams_a_reply_and_updates_the_engine_view_in_chromium() {
    let (chromium, playwright) = match browser_tools() {
        Ok(t) => t,
        Err(why) => {
            let require = std::env::var("FT_REQUIRE_BROWSER").as_deref() == Ok("1");
            assert!(!require, "FT_REQUIRE_BROWSER=1 but {why} (run .ci/install-browser.sh)");
            println!("skipped: {why} (run .ci/install-browser.sh)");
            return;
        }
    };
    let server = TestServer::start(test_engine_config(), ServerSettings::default());
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/web/page_test.js");
    let mut child = Command::new("node")
        .arg(&script)
        .arg(&server.base)
        .env("FT_CHROMIUM", &chromium)
        .env("FT_PLAYWRIGHT_CORE", &playwright)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run node");
    let drain = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            if let Some(mut r) = r {
                let _ = r.read_to_string(&mut s);
            }
            s
        })
    };
    let out = drain(child.stdout.take().map(|r| Box::new(r) as Box<dyn Read + Send>));
    let err = drain(child.stderr.take().map(|r| Box::new(r) as Box<dyn Read + Send>));
    // The script has its own 240 s guard; this one covers a node that hangs before it.
    let deadline = Instant::now() + Duration::from_secs(300);
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait for node") {
            break Some(st);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let (out, err) = (out.join().unwrap_or_default(), err.join().unwrap_or_default());
    println!("{out}{err}");
    let status = status.unwrap_or_else(|| panic!("the browser test hung past 300 s:\n{out}{err}"));
    assert!(status.success(), "the browser test failed ({status}):\n{out}{err}");
    assert!(out.contains("checks passed"), "{out}");
}
