//! `ft-actor launch`: run a coding agent against the local server, starting one if needed.

use super::serve::ConfigArgs;
use crate::launch::{http_get, plan, Agent, Target};
use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Arguments of `launch`.
#[derive(Args, Debug)]
pub struct LaunchArgs {
    /// The agent to run.
    #[arg(value_enum)]
    agent: Agent,
    /// Print what would be set and run, and run nothing.
    #[arg(long)]
    dry_run: bool,
    /// Use the server at this URL (default: host and port from the configuration).
    #[arg(long, value_name = "URL")]
    url: Option<String>,
    /// The agent's program (default: claude, codex, opencode or qwen from PATH).
    #[arg(long, value_name = "PATH")]
    agent_bin: Option<String>,
    /// Seconds to wait for a server this command starts to load its model.
    #[arg(long, default_value_t = 900, value_name = "SECS")]
    start_timeout: u64,
    /// Settings for the server, used to find it and to start it when none is running.
    #[command(flatten)]
    cfg: ConfigArgs,
    /// Arguments passed to the agent (after `--`).
    #[arg(last = true)]
    agent_args: Vec<String>,
}

/// A server this command started; stopped when the agent exits.
struct Started {
    child: Child,
    log: PathBuf,
}

impl Drop for Started {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `ft-actor launch`.
pub fn run(a: LaunchArgs) -> Result<()> {
    // Before anything starts: a missing agent should not cost a model load.
    let program = a.agent_bin.as_deref().unwrap_or(a.agent.program());
    if !a.dry_run && crate::launch::find_program(program, std::env::var_os("PATH").as_deref()).is_none() {
        bail!(
            "`{program}` is not installed (not on PATH); install it with `npm install -g {}`, or give its path with --agent-bin",
            a.agent.npm_package()
        );
    }
    let cfg = a.cfg.load()?;
    let base = a.url.clone().unwrap_or_else(|| cfg.server.base_url());
    let base = base.trim_end_matches('/').trim_end_matches("/v1").to_string();
    let key = cfg.server.api_key.clone();
    let quick = Duration::from_secs(2);
    let running = probe(&base, quick);
    let mut started = None;
    let (model, context, origin) = if running {
        let (m, c) = served_model(&base, key.as_deref(), quick)?;
        let line = format!("# server: {base} is running; model `{m}` from /v1/models");
        (m, c, line)
    } else if a.dry_run {
        let argv = serve_argv(&a.cfg, &base)?;
        let model = cfg.server.model_id_for(cfg.engine.model.as_deref());
        let line = format!("# server: none at {base}; would start: {}", shell_join(&argv));
        (model, cfg.engine.ctx_size, line)
    } else {
        let s = start_server(&a.cfg, &base, Duration::from_secs(a.start_timeout))?;
        let (m, c) = served_model(&base, key.as_deref(), quick)?;
        let line = format!("# server: started at {base} (log: {})", s.log.display());
        started = Some(s);
        (m, c, line)
    };
    let target = Target { base_url: base.clone(), model, api_key: key, context };
    let p = plan(a.agent, &target, a.agent_bin.as_deref(), &a.agent_args, &|v| std::env::var_os(v).is_some());
    if a.dry_run {
        println!("# ft-actor launch {} (dry run)", a.agent.program());
        println!("{origin}");
        print!("{}", p.shell());
        return Ok(());
    }
    eprintln!("{origin}");
    let status = p
        .command()
        .status()
        .with_context(|| format!("cannot run `{}`; is it installed and on PATH? (or give --agent-bin)", p.program))?;
    drop(started);
    if !status.success() {
        bail!("{} exited with {status}", p.program);
    }
    Ok(())
}

/// True when an ft-actor server answers `/health` at `base`.
fn probe(base: &str, timeout: Duration) -> bool {
    matches!(http_get(base, "/health", None, timeout), Ok((200, body)) if body.contains("\"status\""))
}

/// The model id and context length the server reports.
fn served_model(base: &str, key: Option<&str>, timeout: Duration) -> Result<(String, Option<usize>)> {
    let (status, body) = http_get(base, "/v1/models", key, timeout).with_context(|| format!("cannot reach {base}/v1/models"))?;
    if status == 401 {
        bail!("the server at {base} wants an API key: give the same --api-key (or FT_API_KEY) to launch");
    }
    if status != 200 {
        bail!("{base}/v1/models answered {status}: {body}");
    }
    let v: serde_json::Value = serde_json::from_str(&body).context("the server's model list is not JSON")?;
    let card = v.pointer("/data/0").context("the server lists no model")?;
    let id = card.get("id").and_then(|i| i.as_str()).context("the model has no id")?;
    let ctx = card.get("context_length").and_then(|c| c.as_u64()).map(|c| c as usize);
    Ok((id.to_string(), ctx))
}

/// `ft-actor serve` with the settings given to launch, on the port launch will use.
fn serve_argv(cfg: &ConfigArgs, base: &str) -> Result<Vec<String>> {
    let exe = std::env::current_exe().context("cannot find the ft-actor executable")?;
    let mut argv = vec![exe.display().to_string(), "serve".to_string()];
    argv.extend(cfg.to_argv());
    // An explicit --url decides where the started server listens.
    if let Some(port) = base.rsplit(':').next().and_then(|p| p.parse::<u16>().ok()) {
        if cfg.port.is_none() {
            argv.extend(["--port".into(), port.to_string()]);
        }
    }
    Ok(argv)
}

fn shell_join(argv: &[String]) -> String {
    argv.iter().map(|a| crate::launch::shell_quote(a)).collect::<Vec<_>>().join(" ")
}

fn start_server(cfg: &ConfigArgs, base: &str, timeout: Duration) -> Result<Started> {
    let argv = serve_argv(cfg, base)?;
    let dir = crate::demo::demo_model_dir()
        .ok()
        .and_then(|d| d.parent().map(|p| p.to_path_buf()))
        .unwrap_or_else(std::env::temp_dir);
    let log = dir.join("launch-server.log");
    let file = std::fs::File::create(&log).with_context(|| format!("cannot write {}", log.display()))?;
    let err = file.try_clone().context("cannot duplicate the log file handle")?;
    eprintln!("starting the server: {} (log: {})", shell_join(&argv), log.display());
    let child = Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::from(file))
        .stderr(Stdio::from(err))
        .spawn()
        .context("cannot start ft-actor serve")?;
    let mut s = Started { child, log };
    let t0 = Instant::now();
    while t0.elapsed() < timeout {
        if let Ok(Some(status)) = s.child.try_wait() {
            let tail = std::fs::read_to_string(&s.log).unwrap_or_default();
            let tail: Vec<&str> = tail.lines().rev().take(10).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            bail!("the server exited ({status}) before it was ready:\n{}", tail.join("\n"));
        }
        if probe(base, Duration::from_secs(1)) {
            return Ok(s);
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    bail!("the server did not become ready within {} s (log: {})", timeout.as_secs(), s.log.display())
}
