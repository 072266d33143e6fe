//! The real coding-agent CLIs from npm against `ft-actor serve` on the demo model, each
//! started by `ft-actor launch` and completing one non-interactive turn. A random-weight model
//! never ends its turn, so output is capped and the agent's clean max-tokens stop counts as a
//! completed round trip; the server must have answered the agent's API route with 200.
//!
//! `.ci/install-agents.sh` installs the pinned versions into `target/agents`; the test looks in
//! `FT_AGENT_BIN_DIR` (default `target/agents/node_modules/.bin`). Without them it prints why it
//! skips, unless `FT_REQUIRE_AGENT_CLIS=1` (CI) makes that a failure.

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

struct Kill(Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn bin_dir() -> PathBuf {
    std::env::var_os("FT_AGENT_BIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/agents/node_modules/.bin"))
}

/// `serve` on the demo model with a context that holds Claude Code's first request (~42k
/// tokens of system prompt and tools) and every reply capped at 16 tokens by the server, as
/// agents ask for thousands (OpenCode has no setting for it).
fn serve() -> (Kill, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ft-actor"))
        .args(["serve", "--port", "0", "--backend", "cpu", "--cpu-threads", "2", "--ctx-size", "65536", "--max-tokens-limit", "16"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
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
    let url = rx.recv_timeout(Duration::from_secs(120)).expect("serve starts");
    (Kill(child), url)
}

/// The server's count of `route` answered 200, from `/metrics`.
fn served(url: &str, route: &str) -> u64 {
    let hostport = url.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(hostport).expect("connect");
    use std::io::Write;
    write!(s, "GET /metrics HTTP/1.1\r\nHost: {hostport}\r\nConnection: close\r\n\r\n").expect("write");
    let mut body = String::new();
    s.read_to_string(&mut body).expect("read");
    let key = format!("ft_http_requests_total{{route=\"{route}\",status=\"200\"}} ");
    body.lines().find_map(|l| l.strip_prefix(&key)).and_then(|n| n.trim().parse().ok()).unwrap_or(0)
}

#[test]
fn real_agent_clis_complete_a_turn() {
    let dir = bin_dir();
    let require = std::env::var("FT_REQUIRE_AGENT_CLIS").as_deref() == Ok("1");
    // (launch name, program, its arguments for one non-interactive turn, the API route it uses,
    // what it prints when it stops at the output cap)
    let agents: [(&str, &str, &[&str], &str, &str); 4] = [
        ("claude", "claude", &["-p", "say hi"], "/v1/messages", "output token maximum"),
        ("codex", "codex", &["exec", "--skip-git-repo-check", "say hi"], "/v1/responses", "max_output_tokens"),
        ("opencode", "opencode", &["run", "say hi"], "/v1/chat/completions", "length"),
        ("qwen-code", "qwen", &["-p", "say hi"], "/v1/chat/completions", "length"),
    ];
    let missing: Vec<&str> = agents.iter().filter(|a| !dir.join(a.1).is_file()).map(|a| a.1).collect();
    if !missing.is_empty() {
        assert!(!require, "FT_REQUIRE_AGENT_CLIS=1 but {missing:?} are not in {} (run .ci/install-agents.sh)", dir.display());
        println!("skipped: agent CLIs {missing:?} not in {} (run .ci/install-agents.sh)", dir.display());
        return;
    }
    let (_server, url) = serve();
    let home = std::env::temp_dir().join(format!("ft-actor-agents-{}", std::process::id()));
    std::fs::create_dir_all(&home).expect("agent home");
    for (name, program, args, route, capped) in agents {
        let before = served(&url, route);
        let out = Command::new(env!("CARGO_BIN_EXE_ft-actor"))
            .args(["launch", name, "--url", &url, "--agent-bin"])
            .arg(dir.join(program))
            .arg("--")
            .args(args)
            .env("HOME", &home)
            .env("CLAUDE_CODE_MAX_OUTPUT_TOKENS", "16")
            .current_dir(&home)
            .stdin(Stdio::null())
            .output()
            .expect("run launch");
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        let after = served(&url, route);
        println!("{name}: exit {:?}, {} request(s) to {route} answered 200", out.status.code(), after - before);
        assert!(after > before, "{name} made no successful {route} request:\n{text}");
        assert!(out.status.success() || text.contains(capped), "{name} did not complete its turn:\n{text}");
    }
    let _ = std::fs::remove_dir_all(&home);
}
