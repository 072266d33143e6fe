//! The official `openai` and `anthropic` Python SDKs against the real server on loopback
//! (tests/python/test_sdk.py). `.ci/install-python.sh` installs the SDKs into `.venv`; where
//! they are missing the test says so and skips, unless `FT_REQUIRE_SDK_TESTS=1` (CI) makes
//! that a failure.


use ft_actor::server::ServerSettings;
use crate::server_common::{test_engine_config, TestServer};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

/// The Python with both SDKs: the project's `.venv` first, then `python3` on PATH.
fn python() -> Option<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let candidates = [root.join(".venv/bin/python"), PathBuf::from("python3")];
    candidates.into_iter().find(|py| {
        Command::new(py)
            .args(["-c", "import openai, anthropic"])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    })
}

#[test]
fn official_sdks_drive_every_endpoint() {
    let Some(py) = python() else {
        let msg = "SKIPPED: the `openai` and `anthropic` Python SDKs are not installed; run .ci/install-python.sh";
        if std::env::var("FT_REQUIRE_SDK_TESTS").is_ok_and(|v| v == "1") {
            panic!("{msg} (FT_REQUIRE_SDK_TESTS=1)");
        }
        eprintln!("{msg}");
        return;
    };
    let server = TestServer::start(test_engine_config(), ServerSettings::default());
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/test_sdk.py");
    let mut child = Command::new(&py)
        .arg(&script)
        .arg(&server.base)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run python");
    // Bounded: the demo model is tiny; minutes mean something hangs.
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        if child.try_wait().expect("wait").is_some() {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the SDK tests did not finish in 10 minutes");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = child.wait_with_output().expect("output");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(out.status.success(), "SDK tests failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains(" passed, 0 failed"), "{stdout}");
    // Every generation finished or was cancelled: nothing is left running.
    let stats = server.block_on(server.engine.stats()).expect("stats");
    assert_eq!((stats.active, stats.queued), (0, 0), "no sequence left behind");
}
