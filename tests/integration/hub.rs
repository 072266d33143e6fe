//! Model names end to end: `ft-actor generate --model org/name` against a local HTTP server
//! laid out as the Hugging Face hub (`/api/models/{repo}/revision/{rev}`,
//! `/{repo}/resolve/{rev}/{file}` with ranges, `x-repo-commit` and etags), into a scratch
//! `HF_HOME`. Checks: only the files the engine reads are fetched, the tokens equal those of
//! the local folder, a second run needs no network, `HF_HUB_OFFLINE` and a dead hub give clear
//! errors or use the cache, a partial download resumes with a range request, gated
//! repositories take `HF_TOKEN`, revisions and GGUF files inside a repository resolve.

use crate::common::*;
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// One repository the fake hub serves.
struct FakeRepo {
    sha: String,
    files: Vec<(String, Vec<u8>)>,
    /// Requests must carry `Authorization: Bearer <token>`.
    token: Option<String>,
}

/// A request the hub saw.
#[derive(Debug, Clone)]
struct Seen {
    path: String,
    range: Option<String>,
    auth: Option<String>,
}

struct FakeHub {
    base: String,
    seen: Arc<Mutex<Vec<Seen>>>,
    stop: Arc<AtomicBool>,
    port: u16,
}

impl FakeHub {
    fn start(repos: HashMap<String, FakeRepo>) -> FakeHub {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let repos = Arc::new(repos);
        let (s, st) = (seen.clone(), stop.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if st.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let (repos, s) = (repos.clone(), s.clone());
                std::thread::spawn(move || serve(conn, &repos, &s));
            }
        });
        FakeHub { base: format!("http://127.0.0.1:{port}"), seen, stop, port }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    fn downloads(&self) -> Vec<String> {
        let mut files: Vec<String> = self.seen().into_iter().filter(|r| r.path.contains("/resolve/")).map(|r| r.path).collect();
        files.sort();
        files.dedup();
        files
    }
}

impl Drop for FakeHub {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

fn etag(bytes: &[u8]) -> String {
    // FNV-1a, hex: a content hash is all the cache needs of an etag.
    let h = bytes.iter().fold(0xcbf29ce484222325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x100000001b3));
    format!("{h:016x}{:08x}", bytes.len())
}

fn respond(mut conn: TcpStream, status: &str, headers: &[(&str, String)], body: &[u8]) {
    let mut head = format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n", body.len());
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let _ = conn.write_all(head.as_bytes());
    let _ = conn.write_all(body);
    let _ = conn.flush();
}

fn serve(conn: TcpStream, repos: &HashMap<String, FakeRepo>, seen: &Mutex<Vec<Seen>>) {
    let mut reader = BufReader::new(conn.try_clone().expect("clone"));
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() || line.is_empty() {
        return;
    }
    let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
    let (mut range, mut auth) = (None, None);
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).is_err() || h.trim().is_empty() {
            break;
        }
        let (k, v) = h.split_once(':').unwrap_or((&h, ""));
        match k.trim().to_ascii_lowercase().as_str() {
            "range" => range = Some(v.trim().to_string()),
            "authorization" => auth = Some(v.trim().to_string()),
            _ => {}
        }
    }
    seen.lock().unwrap().push(Seen { path: path.clone(), range: range.clone(), auth: auth.clone() });
    let not_found = |c| respond(c, "404 Not Found", &[], b"{\"error\":\"Repository not found\"}");
    // `/api/models/{org}/{name}/revision/{rev}` or `/{org}/{name}/resolve/{rev}/{file…}`.
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let (repo_id, rest, api) = if parts.first() == Some(&"api") && parts.len() >= 6 && parts[1] == "models" && parts[4] == "revision" {
        (format!("{}/{}", parts[2], parts[3]), parts[5..].to_vec(), true)
    } else if parts.len() >= 5 && parts[2] == "resolve" {
        (format!("{}/{}", parts[0], parts[1]), parts[3..].to_vec(), false)
    } else {
        return not_found(conn);
    };
    let Some(repo) = repos.get(&repo_id) else { return not_found(conn) };
    if let Some(t) = &repo.token {
        if auth.as_deref() != Some(&format!("Bearer {t}")) {
            return respond(conn, "401 Unauthorized", &[], b"{\"error\":\"Access to this repository is restricted\"}");
        }
    }
    let rev = rest[0];
    if rev != "main" && rev != repo.sha && rev != "v1" {
        return not_found(conn);
    }
    if api {
        let siblings: Vec<serde_json::Value> = repo.files.iter().map(|(n, _)| serde_json::json!({ "rfilename": n })).collect();
        let body = serde_json::json!({ "sha": repo.sha, "siblings": siblings }).to_string();
        return respond(conn, "200 OK", &[("Content-Type", "application/json".into())], body.as_bytes());
    }
    let file = rest[1..].join("/");
    let Some((_, bytes)) = repo.files.iter().find(|(n, _)| *n == file) else { return not_found(conn) };
    let total = bytes.len();
    let (start, end) = match range.as_deref().and_then(|r| r.strip_prefix("bytes=")) {
        Some(r) => {
            let (a, b) = r.split_once('-').unwrap_or((r, ""));
            let a: usize = a.parse().unwrap_or(0);
            let b: usize = if b.is_empty() { total.saturating_sub(1) } else { b.parse().unwrap_or(total - 1).min(total - 1) };
            (a, b)
        }
        None => (0, total.saturating_sub(1)),
    };
    let tag = format!("\"{}\"", etag(bytes));
    let headers = [
        ("x-repo-commit", repo.sha.clone()),
        ("ETag", tag.clone()),
        ("x-linked-etag", tag),
        ("Content-Range", format!("bytes {start}-{end}/{total}")),
        ("Accept-Ranges", "bytes".into()),
    ];
    let status = if range.is_some() { "206 Partial Content" } else { "200 OK" };
    respond(conn, status, &headers, if start <= end && end < total { &bytes[start..=end] } else { &[] });
}

fn checkpoint_files(fixture_name: &str) -> Vec<(String, Vec<u8>)> {
    let dir = fixture(fixture_name).join("checkpoint");
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&p).unwrap()))
        .collect();
    files.sort();
    files
}

/// The fixture as published: its checkpoint plus files the engine must not fetch.
fn repo_of(fixture_name: &str, sha: &str, token: Option<&str>) -> FakeRepo {
    let mut files = checkpoint_files(fixture_name);
    files.push(("README.md".into(), b"# a model card".to_vec()));
    files.push(("pytorch_model.bin".into(), vec![7u8; 4096]));
    files.push(("original/consolidated.safetensors".into(), vec![9u8; 4096]));
    FakeRepo { sha: sha.into(), files, token: token.map(String::from) }
}

struct Home(PathBuf);

impl Home {
    fn new(tag: &str) -> Home {
        let p = std::env::temp_dir().join(format!("ft-hub-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Home(p)
    }
    fn repo_dir(&self, repo: &str) -> PathBuf {
        self.0.join("hub").join(format!("models--{}", repo.replace('/', "--")))
    }
}

impl Drop for Home {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn ft(args: &[&str], home: &Home, endpoint: &str, env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ft-actor"))
        .args(args)
        .env("XDG_CACHE_HOME", std::env::temp_dir().join("ft-actor-test-cache"))
        .env("HF_HOME", &home.0)
        .env("HF_ENDPOINT", endpoint)
        .env_remove("FT_MODEL")
        .env_remove("HF_TOKEN")
        .env_remove("HF_HUB_OFFLINE")
        .env_remove("HF_HUB_CACHE")
        .envs(env.iter().copied())
        .output()
        .expect("run ft-actor")
}

fn generate(model: &str, home: &Home, endpoint: &str, env: &[(&str, &str)]) -> Output {
    ft(&["generate", "--model", model, "--backend", "cpu", "--prompt-ids", "1,2,3,4", "--max-tokens", "6", "--temperature", "0", "--output-ids", "--ignore-eos"], home, endpoint, env)
}

fn ok_stdout(o: &Output) -> String {
    assert!(o.status.success(), "failed: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

fn clean_error(o: &Output, needles: &[&str]) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "expected a clean failure: {err}");
    assert!(!err.contains("panicked"), "{err}");
    for n in needles {
        assert!(err.contains(n), "error lacks `{n}`: {err}");
    }
}

const SHA: &str = "4f1c0dd5e2a14b7e9b0c3e5f6a7b8c9d0e1f2a3b";

#[test]
fn a_model_name_downloads_what_the_engine_reads_then_runs_offline() {
    let hub = FakeHub::start(HashMap::from([("tiny/qwen3-moe".to_string(), repo_of("qwen3_moe", SHA, None))]));
    let home = Home::new("name");
    let local = fixture("qwen3_moe").join("checkpoint");
    let want = ok_stdout(&generate(local.to_str().unwrap(), &home, &hub.base, &[]));

    let got = ok_stdout(&generate("tiny/qwen3-moe", &home, &hub.base, &[]));
    assert_eq!(got, want, "tokens from the downloaded model differ from the local folder's");
    let fetched = hub.downloads();
    assert!(fetched.iter().any(|p| p.ends_with("/model-00002-of-00002.safetensors")), "{fetched:?}");
    for junk in ["README.md", "pytorch_model.bin", "original/"] {
        assert!(!fetched.iter().any(|p| p.contains(junk)), "fetched {junk}: {fetched:?}");
    }
    // The shared cache layout: a blob per file, a snapshot of links, `refs/main`.
    let repo_dir = home.repo_dir("tiny/qwen3-moe");
    assert_eq!(std::fs::read_to_string(repo_dir.join("refs/main")).unwrap().trim(), SHA);
    assert!(repo_dir.join("snapshots").join(SHA).join("config.json").is_file());

    // Offline: the cache alone (the hub is gone).
    drop(hub);
    let dead = "http://127.0.0.1:9";
    assert_eq!(ok_stdout(&generate("tiny/qwen3-moe", &home, dead, &[("HF_HUB_OFFLINE", "1")])), want);
    // Unreachable but cached: runs, with a warning.
    assert_eq!(ok_stdout(&generate("tiny/qwen3-moe", &home, dead, &[])), want);
    // Offline and absent; unreachable and absent.
    clean_error(&generate("tiny/other", &home, dead, &[("HF_HUB_OFFLINE", "1")]), &["tiny/other", "HF_HUB_OFFLINE", "not in the Hugging Face cache"]);
    clean_error(&generate("tiny/other", &home, dead, &[]), &["cannot reach", "tiny/other", "does not have it"]);
}

#[test]
fn a_partial_download_resumes_with_a_range_request() {
    let repo = repo_of("qwen3_moe", SHA, None);
    let (name, bytes) = repo.files.iter().find(|(n, _)| n == "model-00001-of-00002.safetensors").cloned().unwrap();
    let hub = FakeHub::start(HashMap::from([("tiny/resume".to_string(), repo)]));
    let home = Home::new("resume");
    // What an interrupted download leaves: the first part of the blob in `<etag>.part`.
    let blobs = home.repo_dir("tiny/resume").join("blobs");
    std::fs::create_dir_all(&blobs).unwrap();
    let half = bytes.len() / 2;
    std::fs::write(blobs.join(format!("{}.part", etag(&bytes))), &bytes[..half]).unwrap();
    ok_stdout(&generate("tiny/resume", &home, &hub.base, &[]));
    let ranges: Vec<Option<String>> = hub.seen().into_iter().filter(|r| r.path.ends_with(&name)).map(|r| r.range).collect();
    assert!(ranges.contains(&Some(format!("bytes={half}-"))), "no resuming range request: {ranges:?}");
    let blob = std::fs::read(home.repo_dir("tiny/resume").join("snapshots").join(SHA).join(&name)).unwrap();
    assert!(blob == bytes, "resumed file differs from the original");
}

#[test]
fn gated_repositories_take_hf_token() {
    let hub = FakeHub::start(HashMap::from([("org/gated".to_string(), repo_of("qwen3_moe", SHA, Some("hf_secret")))]));
    let home = Home::new("gated");
    clean_error(&generate("org/gated", &home, &hub.base, &[]), &["org/gated", "401", "HF_TOKEN"]);
    ok_stdout(&generate("org/gated", &home, &hub.base, &[("HF_TOKEN", "hf_secret")]));
    assert!(hub.seen().iter().any(|r| r.auth.as_deref() == Some("Bearer hf_secret")));
}

#[test]
fn revisions_gguf_files_and_bad_names() {
    let Some(py) = gguf_python() else { return };
    let (gguf, _) = gguf_convert(&py, &fixture("qwen3_moe").join("checkpoint"), "hub", "q8_0", &[]);
    let mut repo = repo_of("qwen3_moe", SHA, None);
    repo.files.push(("gguf/tiny-Q8_0.gguf".into(), std::fs::read(&gguf).unwrap()));
    let hub = FakeHub::start(HashMap::from([("tiny/mixed".to_string(), repo)]));
    let home = Home::new("rev");
    let want = ok_stdout(&generate(gguf.to_str().unwrap(), &home, &hub.base, &[]));
    assert_eq!(ok_stdout(&generate("tiny/mixed/gguf/tiny-Q8_0.gguf", &home, &hub.base, &[])), want);
    let fetched = hub.downloads();
    assert!(fetched.iter().all(|p| p.ends_with(".gguf")), "a GGUF name fetches only the GGUF: {fetched:?}");
    // A tag resolves to its commit, recorded as its own ref.
    ok_stdout(&generate("tiny/mixed:v1", &home, &hub.base, &[]));
    assert_eq!(std::fs::read_to_string(home.repo_dir("tiny/mixed").join("refs/v1")).unwrap().trim(), SHA);
    clean_error(&generate("tiny/mixed:nope", &home, &hub.base, &[]), &["tiny/mixed:nope", "not found", "revision"]);
    clean_error(&generate("tiny/absent", &home, &hub.base, &[]), &["tiny/absent", "not found"]);
    clean_error(&generate("tiny/mixed/gguf/other.gguf", &home, &hub.base, &[]), &["no file gguf/other.gguf", "gguf/tiny-Q8_0.gguf"]);
}

#[test]
fn plan_reads_only_the_headers_of_a_hub_model() {
    let hub = FakeHub::start(HashMap::from([("tiny/plan".to_string(), repo_of("qwen3_moe", SHA, None))]));
    let home = Home::new("plan");
    let xdg = home.0.join("xdg");
    let env = [("XDG_CACHE_HOME", xdg.to_str().unwrap())];
    let local = fixture("qwen3_moe").join("checkpoint");
    let plan_json = |model: &str, endpoint: &str| -> serde_json::Value {
        let o = ft(&["plan", "--model", model, "--json", "--cpu-bandwidth", "20", "--ram", "8GiB"], &home, endpoint, &env);
        serde_json::from_str(&ok_stdout(&o)).expect("plan JSON")
    };
    let want = plan_json(local.to_str().unwrap(), &hub.base);
    let got = plan_json("tiny/plan", &hub.base);
    assert_eq!(got["footprint"], want["footprint"], "sizes from the headers differ from the local folder's");
    assert_eq!(got["memory_plan"], want["memory_plan"]);
    // Weight files: two small ranges each (length prefix, header), never the data.
    for r in hub.seen().iter().filter(|r| r.path.ends_with(".safetensors")) {
        let range = r.range.as_deref().unwrap_or("none");
        let end: u64 = range.rsplit('-').next().and_then(|e| e.parse().ok()).unwrap_or(u64::MAX);
        assert!(range.starts_with("bytes=") && end < 64 * 1024, "a weight file was read past its header: {range}");
    }
    // The hub's cache has the config but no weights: `generate` would still download them.
    let snap = home.repo_dir("tiny/plan").join("snapshots").join(SHA);
    assert!(snap.join("config.json").is_file() && !snap.join("model-00001-of-00002.safetensors").exists());
}
