//! The `serve` and `launch` commands as a user runs them: configuration precedence
//! (file < environment < flags), `launch --dry-run` for each agent with and without a running
//! server, and clear start-up errors.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ft-actor"));
    // The caller's FT_* settings must not leak into what is being tested.
    for (k, _) in std::env::vars() {
        if k.starts_with("FT_") && k != "FT_LOG" {
            c.env_remove(k);
        }
    }
    c
}

fn run(c: &mut Command) -> (bool, String, String) {
    let Output { status, stdout, stderr } = c.output().expect("run ft-actor");
    (status.success(), String::from_utf8_lossy(&stdout).into_owned(), String::from_utf8_lossy(&stderr).into_owned())
}

fn temp_file(name: &str, text: &str) -> PathBuf {
    // Under the target's scratch folder, not /tmp, so runs leave nothing behind on the host.
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("ft-actor-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write");
    p
}

/// The value of `key = …` in `--print-config` output.
fn value_of(toml: &str, key: &str) -> Option<String> {
    toml.lines().find_map(|l| l.strip_prefix(&format!("{key} = ")).map(|v| v.trim_matches('"').to_string()))
}

#[test]
fn config_precedence_file_then_env_then_flags() {
    let file = temp_file("prec.toml", "port = 1111\nmax_queue = 7\nserved_model_name = \"from-file\"\nbackend = \"cpu\"\nvram_budget = \"2GiB\"\n");
    let f = file.to_str().expect("utf-8 path");

    let (ok, out, err) = run(bin().args(["serve", "--config", f, "--print-config"]));
    assert!(ok, "{err}");
    assert_eq!(value_of(&out, "port").as_deref(), Some("1111"));
    assert_eq!(value_of(&out, "served_model_name").as_deref(), Some("from-file"));
    assert_eq!(value_of(&out, "host").as_deref(), Some("127.0.0.1"), "defaults fill the rest");

    let (ok, out, err) = run(bin().args(["serve", "--config", f, "--print-config"]).env("FT_PORT", "2222").env("FT_SERVED_MODEL_NAME", "4242"));
    assert!(ok, "{err}");
    assert_eq!(value_of(&out, "port").as_deref(), Some("2222"), "env beats file");
    assert_eq!(value_of(&out, "served_model_name").as_deref(), Some("4242"), "a numeric env value is still a name");
    assert_eq!(value_of(&out, "max_queue").as_deref(), Some("7"), "file keys not in env remain");

    let (ok, out, err) = run(bin()
        .args(["serve", "--config", f, "--print-config", "--port", "3333", "--max-queue", "9"])
        .env("FT_PORT", "2222")
        .env("FT_MAX_QUEUE", "8"));
    assert!(ok, "{err}");
    assert_eq!(value_of(&out, "port").as_deref(), Some("3333"), "flag beats env");
    assert_eq!(value_of(&out, "max_queue").as_deref(), Some("9"));
    assert_eq!(value_of(&out, "vram_budget").as_deref(), Some("2GiB"));

    // The config file can also come from FT_CONFIG.
    let (ok, out, _) = run(bin().args(["serve", "--print-config"]).env("FT_CONFIG", f));
    assert!(ok);
    assert_eq!(value_of(&out, "port").as_deref(), Some("1111"));
}

#[test]
fn config_errors_name_the_key_and_the_source() {
    let file = temp_file("bad.toml", "port = 1\nexpert_cach_slots = 3\n");
    let (ok, _, err) = run(bin().args(["serve", "--print-config", "--config", file.to_str().expect("path")]));
    assert!(!ok);
    assert!(err.contains("expert_cach_slots") && err.contains("bad.toml"), "{err}");
    let (ok, _, err) = run(bin().args(["serve", "--print-config"]).env("FT_MOE_MODE", "turbo"));
    assert!(!ok);
    assert!(err.contains("moe_mode") && err.contains("turbo"), "{err}");
    let (ok, _, err) = run(bin().args(["serve", "--print-config", "--config", "/nonexistent/x.toml"]));
    assert!(!ok && err.contains("does not exist"), "{err}");
}

#[test]
fn shipped_example_configs_load() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("configs");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).expect("configs/") {
        let p = e.expect("entry").path();
        if p.extension().is_some_and(|x| x == "toml") {
            let (ok, out, err) = run(bin().args(["serve", "--print-config", "--config"]).arg(&p));
            assert!(ok, "{}: {err}", p.display());
            assert!(out.contains("port = "), "{out}");
            n += 1;
        }
    }
    assert!(n >= 3, "configs/ has the three example deployments");
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}

#[test]
fn launch_dry_run_without_a_server() {
    let port = free_port().to_string();
    let (ok, out, err) = run(bin()
        .args(["launch", "claude", "--dry-run", "--port", &port, "--served-model-name", "my-model", "--", "--resume", "it's"])
        .env("ANTHROPIC_API_KEY", "sk-ant-secret")
        .env("OPENAI_API_KEY", "sk-secret"));
    assert!(ok, "{err}");
    assert!(out.contains("would start: ") && out.contains(" serve ") && out.contains(&format!("--port {port}")), "{out}");
    assert!(out.contains("unset ANTHROPIC_API_KEY") && out.contains("unset OPENAI_API_KEY"), "{out}");
    assert!(out.contains(&format!("export ANTHROPIC_BASE_URL=http://127.0.0.1:{port}")), "{out}");
    for var in ["ANTHROPIC_MODEL", "ANTHROPIC_DEFAULT_OPUS_MODEL", "ANTHROPIC_DEFAULT_SONNET_MODEL", "ANTHROPIC_DEFAULT_HAIKU_MODEL", "ANTHROPIC_SMALL_FAST_MODEL"] {
        assert!(out.contains(&format!("export {var}=my-model")), "{var}: {out}");
    }
    assert!(out.contains("export ANTHROPIC_AUTH_TOKEN=") && out.contains("export CLAUDE_CODE_ATTRIBUTION_HEADER=0"), "{out}");
    assert!(out.trim_end().ends_with("claude --resume 'it'\\''s'"), "{out}");
    assert!(!out.contains("sk-ant-secret") && !out.contains("sk-secret"), "secrets are never printed");

    let (ok, out, err) = run(bin().args(["launch", "codex", "--dry-run", "--port", &port, "--api-key", "k123", "--ctx-size", "4096"]));
    assert!(ok, "{err}");
    assert!(out.contains("export FT_ACTOR_API_KEY=k123"), "{out}");
    assert!(out.contains("wire_api = \"responses\"") && out.contains(&format!("base_url = \"http://127.0.0.1:{port}/v1\"")), "{out}");
    assert!(out.contains("model_provider=\"ft_actor\"") && out.contains("model=\"ft-actor-demo\"") && out.contains("model_context_window=4096"), "{out}");
    assert!(out.lines().last().is_some_and(|l| l.starts_with("codex -c ")), "{out}");

    let (ok, out, err) = run(bin().args(["launch", "opencode", "--dry-run", "--port", &port]));
    assert!(ok, "{err}");
    let line = out.lines().find(|l| l.starts_with("export OPENCODE_CONFIG_CONTENT=")).expect("opencode config");
    let json = line.trim_start_matches("export OPENCODE_CONFIG_CONTENT=").trim_matches('\'');
    let v: serde_json::Value = serde_json::from_str(json).expect("the inline config is JSON");
    assert_eq!(v["provider"]["ft-actor"]["npm"], "@ai-sdk/openai-compatible");
    assert_eq!(v["provider"]["ft-actor"]["options"]["baseURL"], format!("http://127.0.0.1:{port}/v1"));
    assert_eq!(v["model"], "ft-actor/ft-actor-demo");
    assert!(out.trim_end().ends_with("opencode"), "{out}");

    let (ok, out, err) = run(bin().args(["launch", "qwen-code", "--dry-run", "--port", &port]));
    assert!(ok, "{err}");
    assert!(out.contains(&format!("export OPENAI_BASE_URL=http://127.0.0.1:{port}/v1")) && out.contains("export OPENAI_MODEL=ft-actor-demo"), "{out}");
    assert!(out.trim_end().ends_with("qwen"), "{out}");

    // Without --dry-run, a missing agent is named with how to install it, before any server starts.
    let (ok, _, err) = run(bin().args(["launch", "qwen-code", "--port", &port]).env("PATH", "/nonexistent"));
    assert!(!ok && err.contains("`qwen` is not installed") && err.contains("npm install -g @qwen-code/qwen-code"), "{err}");
    assert!(!err.contains("starting the server"), "{err}");
}

/// `ft-actor serve` on a free port; returns the child and its base URL once it listens.
fn spawn_server(extra: &[&str]) -> (Child, String) {
    let mut child = bin()
        .args(["serve", "--port", "0", "--backend", "cpu", "--cpu-threads", "1", "--ctx-size", "512"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn serve");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(url) = line.strip_prefix("ft-actor listening on ") {
                let _ = tx.send(url.to_string());
            }
        }
    });
    match rx.recv_timeout(Duration::from_secs(120)) {
        Ok(url) => (child, url),
        Err(_) => {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!("serve did not start: {}", String::from_utf8_lossy(&out.stderr));
        }
    }
}

struct Kill(Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn launch_dry_run_reads_the_running_servers_model() {
    let (child, url) = spawn_server(&["--served-model-name", "local/qwen-test", "--api-key", "topsecret"]);
    let _guard = Kill(child);
    let (ok, out, err) = run(bin().args(["launch", "codex", "--dry-run", "--url", &url, "--api-key", "topsecret"]));
    assert!(ok, "{err}");
    assert!(out.contains("is running; model `local/qwen-test`"), "{out}");
    assert!(out.contains("model=\"local/qwen-test\"") && out.contains("model_context_window=512"), "{out}");
    // Without the key, launch explains what is missing.
    let (ok, _, err) = run(bin().args(["launch", "claude", "--dry-run", "--url", &url]));
    assert!(!ok && err.contains("API key"), "{err}");
}

#[test]
fn unavailable_backend_is_a_clear_error() {
    // Where a GPU exists the server may start; then there is nothing to check here.
    let mut child = bin()
        .args(["serve", "--port", "0", "--backend", "cuda"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(60) {
        if let Some(status) = child.try_wait().expect("wait") {
            let out = child.wait_with_output().expect("output");
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(!status.success());
            assert!(err.to_lowercase().contains("cuda"), "the error names the backend: {err}");
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn launch_starts_a_server_runs_the_agent_and_stops_the_server() {
    // A stand-in agent: prints what Claude Code would see, and asks the server for its model.
    let port = free_port().to_string();
    let script = "echo \"model=$ANTHROPIC_MODEL url=$ANTHROPIC_BASE_URL key=${ANTHROPIC_API_KEY:-none}\"";
    let (ok, out, err) = run(bin()
        .args(["launch", "claude", "--port", &port, "--backend", "cpu", "--cpu-threads", "1", "--ctx-size", "512", "--agent-bin", "sh", "--", "-c", script])
        .env("ANTHROPIC_API_KEY", "sk-ant-secret"));
    assert!(ok, "{err}");
    assert!(out.contains(&format!("model=ft-actor-demo url=http://127.0.0.1:{port} key=none")), "{out}\n{err}");
    // The server launch started is gone with the agent.
    assert!(std::net::TcpListener::bind(format!("127.0.0.1:{port}")).is_ok(), "the started server was stopped");
}
