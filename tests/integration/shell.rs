//! `ft-actor shell` end to end: scripted sessions piped into the binary on the built-in demo
//! model (and on a copy of it whose template opens the thinking), and the terminal path
//! under a pseudo-terminal.

use crate::common::*;
use serde_json::Value;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn shell_command(args: &[&str], state: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ft-actor"));
    c.arg("shell")
        .args(["--max-tokens", "6", "--temperature", "0"])
        .args(args)
        .env("XDG_CACHE_HOME", std::env::temp_dir().join("ft-actor-test-cache"))
        .env("XDG_STATE_HOME", state)
        .env_remove("FT_MODEL");
    c
}

/// Runs the shell with `script` on its standard input (a pipe).
fn shell(args: &[&str], script: &str, state: &Path) -> Output {
    let mut child = shell_command(args, state)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run ft-actor shell");
    child.stdin.take().expect("stdin").write_all(script.as_bytes()).expect("write the script");
    child.wait_with_output().expect("ft-actor shell output")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn read_json(path: &Path) -> Value {
    let s = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&s).expect("saved conversation is JSON")
}

fn roles(saved: &Value) -> Vec<String> {
    saved["messages"].as_array().expect("messages").iter().map(|m| m["role"].as_str().unwrap_or("?").to_string()).collect()
}

/// The number before `label` in `line` (`"12 prompt tokens"` → 12 for `" prompt tokens"`).
fn number_before(line: &str, label: &str) -> f64 {
    let head = &line[..line.find(label).unwrap_or_else(|| panic!("no `{label}` in {line}"))];
    let num = head.rsplit(|c: char| c == ' ' || c == '(').next().unwrap_or("");
    num.parse().unwrap_or_else(|_| panic!("no number before `{label}` in {line}"))
}

#[test]
fn scripted_session_on_the_demo_model() {
    let dir = scratch_dir("ft-actor-shell-", "session");
    let p = |name: &str| dir.join(name).to_string_lossy().into_owned();
    let script = format!(
        "/system Be brief.\n/system\nhello there\nsecond \\\nline\n/stats\n/save {two}\n\
         \"\"\"\nblock line one\n/block line two\n\"\"\"\n/save {three}\n/frobnicate now\n/save\n\
         /reset\n/save {reset}\n/exit\nnever sent\n/save {after}\n",
        two = p("two.json"),
        three = p("three.json"),
        reset = p("reset.json"),
        after = p("after.json"),
    );
    let o = shell(&[], &script, &dir);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "exit {:?}\nstdout:\n{out}\nstderr:\n{err}", o.status);
    assert!(!err.contains("panicked"), "{err}");
    // A pipe gets no prompt and no terminal escapes.
    assert!(!out.contains(">>>") && !out.contains('\x1b'), "{out:?}");
    assert!(out.contains("system prompt: Be brief."), "{out}");

    // Two turns, each answered; the second resumed from the first's saved state.
    let two = read_json(&dir.join("two.json"));
    assert_eq!(two["system"], "Be brief.");
    assert_eq!(roles(&two), ["user", "assistant", "user", "assistant"]);
    assert_eq!(two["messages"][0]["content"], "hello there");
    assert_eq!(two["messages"][2]["content"], "second \nline", "a continued line is one message");
    let last = &two["stats"]["last_reply"];
    assert!(last["generated_tokens"].as_u64().unwrap() > 0, "{last}");
    assert!(last["reused_tokens"].as_u64().unwrap() > 0, "the second turn reuses the first's prefix: {last}");
    let session = &two["stats"]["session"];
    assert_eq!(session["replies"], 2);
    assert!(session["generated_tokens"].as_u64().unwrap() >= 2, "{session}");
    assert!(session["prefill_tok_s"].as_f64().unwrap() > 0.0, "{session}");

    // `/stats` printed measured figures: tokens, rates and the time to the first token.
    let last_line = out.lines().find(|l| l.starts_with("last reply:")).unwrap_or_else(|| panic!("no /stats output: {out}"));
    assert!(number_before(last_line, " prompt tokens") > 0.0, "{last_line}");
    assert!(number_before(last_line, " generated") > 0.0, "{last_line}");
    assert!(number_before(last_line, " s, prefill") > 0.0, "{last_line}");
    assert!(number_before(last_line, " tok/s, decode") > 0.0, "{last_line}");
    let session_line = out.lines().find(|l| l.starts_with("session:")).expect("session line");
    assert_eq!(number_before(session_line, " replies"), 2.0, "{session_line}");
    assert!(number_before(session_line, " tok/s, decode") > 0.0, "{session_line}");
    let decode = session_line.rsplit("decode ").next().unwrap_or("");
    assert!(number_before(decode, " tok/s") > 0.0, "{session_line}");

    // A `"""` block is one message, even with a line that looks like a command.
    let three = read_json(&dir.join("three.json"));
    assert_eq!(roles(&three).len(), 6);
    assert_eq!(three["messages"][4]["content"], "block line one\n/block line two");

    // Mistakes are explained and the shell goes on.
    assert!(err.contains("unknown command `/frobnicate`"), "{err}");
    assert!(err.contains("usage: /save FILE"), "{err}");

    // `/reset` keeps the system prompt and nothing else; `/exit` ends the session.
    let reset = read_json(&dir.join("reset.json"));
    assert_eq!(reset["system"], "Be brief.");
    assert_eq!(reset["messages"], serde_json::json!([]));
    assert!(!dir.join("after.json").exists(), "input after /exit was read");
    assert_eq!(out.matches("saved ").count(), 3, "{out}");
}

/// A copy of the demo model whose template opens `<think>` for the reply, so whatever the
/// random model writes is thinking.
fn thinking_demo(dir: &Path) -> PathBuf {
    let model = dir.join("model");
    std::fs::create_dir_all(&model).expect("model folder");
    for e in std::fs::read_dir(repo_dir().join("models/demo")).expect("models/demo").flatten() {
        std::fs::copy(e.path(), model.join(e.file_name())).expect("copy the demo model");
    }
    let path = model.join("chat_template.jinja");
    let template = std::fs::read_to_string(&path).expect("chat template");
    let opener = "{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}";
    assert!(template.contains(opener), "the demo template changed");
    std::fs::write(&path, template.replace(opener, "{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n<think>\\n' }}"))
        .expect("write the template");
    model
}

#[test]
fn thinking_is_shown_in_full_or_as_a_summary() {
    let dir = scratch_dir("ft-actor-shell-", "thinking");
    let model = thinking_demo(&dir);
    let save = dir.join("t.json");
    let script = format!("hi\n/think\nagain\n/save {}\n", save.display());
    let o = shell(&["--model", model.to_str().expect("utf-8 path")], &script, &dir);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.starts_with("[thinking]\n"), "the first reply shows its thinking in full: {out}");
    assert!(out.contains("thinking: one-line summary"), "{out}");
    let summary = out.lines().find(|l| l.starts_with("[thinking: ")).unwrap_or_else(|| panic!("no summary line: {out}"));
    assert!(number_before(summary, " tokens]") > 0.0, "{summary}");
    let saved = read_json(&save);
    assert_eq!(roles(&saved), ["user", "assistant", "user", "assistant"]);
    for reply in [&saved["messages"][1], &saved["messages"][3]] {
        assert!(reply["reasoning_content"].as_str().is_some_and(|r| !r.is_empty()), "{reply}");
    }
}

#[test]
fn terminal_session_starts_and_exits() {
    let script_ok = Command::new("script").arg("--version").output().is_ok_and(|o| o.status.success());
    if !script_ok {
        eprintln!("skipping the terminal test: `script` (util-linux) is not installed");
        return;
    }
    let dir = scratch_dir("ft-actor-shell-", "tty");
    let inner = format!("'{}' shell --max-tokens 4 --temperature 0", env!("CARGO_BIN_EXE_ft-actor"));
    let mut child = Command::new("script")
        .args(["-q", "-e", "-c", &inner, "/dev/null"])
        .env("XDG_CACHE_HOME", std::env::temp_dir().join("ft-actor-test-cache"))
        .env("XDG_STATE_HOME", &dir)
        .env("TERM", "xterm")
        .env_remove("FT_MODEL")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run script");
    // Stdin stays open until the shell has gone, so only `/exit` can end it.
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(b"/stats\n/exit\n").expect("type into the terminal");
    stdin.flush().expect("flush");
    let started = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if started.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            panic!("the shell did not exit on /exit");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    drop(stdin);
    let o = child.wait_with_output().expect("script output");
    let screen = text(&o.stdout);
    assert!(status.success(), "exit {status:?}; screen:\n{screen}\nstderr:\n{}", text(&o.stderr));
    assert!(!screen.contains("panicked"), "{screen}");
    assert!(screen.contains("ft-actor shell") && screen.contains(">>> "), "no banner or prompt: {screen:?}");
    assert!(screen.contains("last reply: none yet"), "{screen:?}");
    let history = std::fs::read_to_string(dir.join("ft-actor/shell_history")).expect("the history file");
    assert!(history.lines().any(|l| l == "/exit"), "{history:?}");
}
