//! Model names: `--model org/name` (or `org/name:revision`, or `org/name/file.gguf`) resolved
//! in the Hugging Face cache, downloading what is missing.
//!
//! The cache is the one transformers and the other hub tools share (`$HF_HUB_CACHE`, else
//! `$HF_HOME/hub`, else `~/.cache/huggingface/hub`, laid out as
//! `models--org--name/{blobs,snapshots/<commit>,refs/<revision>}`), so a model downloaded by
//! any of them is found here without a second download, and the other way round. Downloads
//! go through the `hf-hub` crate: resumed from the partial blob after an interruption, with a
//! progress bar on a terminal, `HF_TOKEN` (or the token file `hf auth login` writes) for gated
//! models, `HF_ENDPOINT` for a mirror, and `HF_HUB_OFFLINE=1` to never touch the network.

use hf_hub::api::sync::{ApiBuilder, ApiRepo};
use hf_hub::{Cache, Repo, RepoType};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

/// Why a model name could not be resolved to local files.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    /// `HF_HUB_OFFLINE` is set and the cache lacks the model.
    #[error("{name} is no local path, is not in the Hugging Face cache ({cache}), and HF_HUB_OFFLINE is set: unset it to download, or download it once online")]
    OfflineAbsent {
        /// The model name as given.
        name: String,
        /// The cache folder searched.
        cache: PathBuf,
    },
    /// The hub could not be reached and the cache lacks the model.
    #[error("{name} is no local path; cannot reach {endpoint} for it ({source}), and the Hugging Face cache ({cache}) does not have it")]
    Unreachable {
        /// The model name as given.
        name: String,
        /// The hub address.
        endpoint: String,
        /// The cache folder searched.
        cache: PathBuf,
        /// What the request failed with.
        #[source]
        source: Box<hf_hub::api::sync::ApiError>,
    },
    /// The hub answered 401/403.
    #[error("{name}: access denied by {endpoint} (HTTP {status}); the repository is gated or private: accept its terms on the hub and set HF_TOKEN (or run `hf auth login`)")]
    Denied {
        /// The model name as given.
        name: String,
        /// The hub address.
        endpoint: String,
        /// 401 or 403.
        status: u16,
    },
    /// The hub answered 404.
    #[error("{name}: no such local path, and not found on {endpoint} (no such repository or revision{hint})")]
    NotFound {
        /// The model name as given.
        name: String,
        /// The hub address.
        endpoint: String,
        /// A hint on the spelling.
        hint: &'static str,
    },
    /// The repository has no file the engine can run.
    #[error("{name}: {why}")]
    NothingToRun {
        /// The model name as given.
        name: String,
        /// What the repository holds instead.
        why: String,
    },
    /// A download failed part way.
    #[error("{name}: downloading {file} failed: {source} (run the command again to resume)")]
    Download {
        /// The model name as given.
        name: String,
        /// The file being downloaded.
        file: String,
        /// What failed.
        #[source]
        source: Box<hf_hub::api::sync::ApiError>,
    },
    /// The client could not be set up.
    #[error("cannot set up the Hugging Face client: {0}")]
    Client(#[source] Box<hf_hub::api::sync::ApiError>),
}

/// A model named on the hub: `org/name[/path/in/repo.gguf][:revision]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelName {
    /// `org/name`.
    pub repo: String,
    /// A GGUF file inside the repository, when one was named.
    pub file: Option<String>,
    /// Branch, tag or commit (default `main`).
    pub revision: String,
}

impl ModelName {
    /// Parses a model name; `None` when the text is not one (a path, or malformed).
    pub fn parse(text: &str) -> Option<ModelName> {
        if text.starts_with(['/', '.', '~']) || text.contains('\\') || text.contains("//") {
            return None;
        }
        let (body, revision) = match text.rsplit_once(':') {
            Some((b, r)) if !r.is_empty() && !r.contains('/') => (b, r.to_string()),
            Some(_) => return None,
            None => (text, "main".to_string()),
        };
        let mut parts = body.splitn(3, '/');
        let (org, name) = (parts.next()?, parts.next()?);
        let file = parts.next().map(str::to_string);
        let ok = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')) && !s.starts_with(['.', '-']);
        if !ok(org) || !ok(name) {
            return None;
        }
        if let Some(f) = &file {
            // Only GGUF files are named inside a repository; a folder model is the whole repo.
            if !f.ends_with(".gguf") || f.split('/').any(|p| p.is_empty() || p == "..") {
                return None;
            }
        }
        Some(ModelName { repo: format!("{org}/{name}"), file, revision })
    }

    /// The name as a user writes it.
    pub fn display(&self) -> String {
        let file = self.file.as_deref().map(|f| format!("/{f}")).unwrap_or_default();
        let rev = if self.revision == "main" { String::new() } else { format!(":{}", self.revision) };
        format!("{}{file}{rev}", self.repo)
    }
}

/// The hub cache folder the engine reads and writes (`$HF_HUB_CACHE`, `$HF_HOME/hub`, or
/// `~/.cache/huggingface/hub`).
pub fn cache_dir() -> PathBuf {
    match std::env::var_os("HF_HUB_CACHE") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => Cache::from_env().path().clone(),
    }
}

fn offline() -> bool {
    std::env::var("HF_HUB_OFFLINE").map(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on")).unwrap_or(false)
}

fn endpoint() -> String {
    std::env::var("HF_ENDPOINT").ok().filter(|e| !e.is_empty()).unwrap_or_else(|| "https://huggingface.co".into())
}

/// What `--model` names: a local path when one exists there, else a hub model name, else
/// the path as given (whose absence the loader reports).
pub fn resolve_model_arg(arg: &Path) -> Result<PathBuf, HubError> {
    if arg.exists() {
        return Ok(arg.to_path_buf());
    }
    match arg.to_str().and_then(ModelName::parse) {
        Some(name) => resolve(&name),
        None => Ok(arg.to_path_buf()),
    }
}

/// Local path of a hub model: its snapshot folder, or the GGUF file (the first part of a
/// split one). Downloads what the cache lacks unless `HF_HUB_OFFLINE` is set.
pub fn resolve(name: &ModelName) -> Result<PathBuf, HubError> {
    let cache = Cache::new(cache_dir());
    if offline() {
        return cached(&cache, name).ok_or_else(|| HubError::OfflineAbsent { name: name.display(), cache: cache.path().clone() });
    }
    let (api, _) = client(&cache, std::io::stderr().is_terminal())?;
    let info = match api.repo(Repo::with_revision(name.repo.clone(), RepoType::Model, name.revision.clone())).info() {
        Ok(i) => i,
        Err(e) => return offline_fallback(&cache, name, e),
    };
    let files: Vec<String> = info.siblings.into_iter().map(|s| s.rfilename).collect();
    let wanted = wanted_files(name, &files)?;
    // Every file from the one commit the revision points at now, so a branch that moves
    // during the download cannot mix two commits in one snapshot.
    let pinned = api.repo(Repo::with_revision(name.repo.clone(), RepoType::Model, info.sha.clone()));
    for (i, file) in wanted.iter().enumerate() {
        tracing::info!("{}: {file} ({}/{})", name.display(), i + 1, wanted.len());
        fetch(&pinned, name, file)?;
    }
    // The revision as named (a branch such as `main`) now points at that commit, which is
    // what a later offline run looks up.
    let named = cache.repo(Repo::with_revision(name.repo.clone(), RepoType::Model, name.revision.clone()));
    if let Err(e) = named.create_ref(&info.sha) {
        tracing::warn!("cannot record {} → {} in the cache: {e}", name.revision, info.sha);
    }
    let snapshot = cache.path().join(Repo::model(name.repo.clone()).folder_name()).join("snapshots").join(&info.sha);
    Ok(match &name.file {
        Some(f) => snapshot.join(f),
        None => snapshot,
    })
}

/// What `plan` reads of `--model`: a local path as it is; a hub model from the cache when
/// complete there, else its config and small files (into the cache) and only the headers of
/// its weight files (sparse files of the real size, in ft-actor's own cache folder).
pub fn resolve_index_arg(arg: &Path) -> Result<PathBuf, HubError> {
    if arg.exists() {
        return Ok(arg.to_path_buf());
    }
    let Some(name) = arg.to_str().and_then(ModelName::parse) else { return Ok(arg.to_path_buf()) };
    let cache = Cache::new(cache_dir());
    if let Some(p) = cached(&cache, &name) {
        return Ok(p);
    }
    if offline() {
        return Err(HubError::OfflineAbsent { name: name.display(), cache: cache.path().clone() });
    }
    if name.file.is_some() {
        return Err(HubError::NothingToRun {
            name: name.display(),
            why: "planning a GGUF file on the hub needs the file itself; download it first (any command that runs it does), or plan the repository's safetensors checkpoint".into(),
        });
    }
    let (api, token) = client(&cache, false)?;
    let info = match api.repo(Repo::with_revision(name.repo.clone(), RepoType::Model, name.revision.clone())).info() {
        Ok(i) => i,
        Err(e) => return offline_fallback(&cache, &name, e),
    };
    let files: Vec<String> = info.siblings.into_iter().map(|s| s.rfilename).collect();
    let wanted = wanted_files(&name, &files)?;
    let pinned = api.repo(Repo::with_revision(name.repo.clone(), RepoType::Model, info.sha.clone()));
    let base = crate::policy::profile::default_cache_dir().unwrap_or_else(std::env::temp_dir);
    let dir = base.join("ft-actor").join("plan-headers").join(Repo::model(name.repo.clone()).folder_name()).join(&info.sha);
    std::fs::create_dir_all(&dir).map_err(|e| header_err(&name, "(folder)", e.to_string()))?;
    let agent: ureq::Agent = ureq::Agent::config_builder().build().into();
    for file in &wanted {
        let dst = dir.join(file);
        if file.ends_with(".safetensors") {
            if !dst.is_file() {
                let url = format!("{}/{}/resolve/{}/{file}", endpoint(), name.repo, info.sha);
                write_header_only(&agent, &url, token.as_deref(), &dst).map_err(|why| header_err(&name, file, why))?;
            }
        } else {
            let src = fetch(&pinned, &name, file)?;
            std::fs::copy(&src, &dst).map_err(|e| header_err(&name, file, e.to_string()))?;
        }
    }
    Ok(dir)
}

fn header_err(name: &ModelName, file: &str, why: String) -> HubError {
    HubError::NothingToRun { name: name.display(), why: format!("cannot read the header of {file}: {why}") }
}

/// Bytes `[from, to]` of `url`, and the file's full size from `Content-Range`.
fn range(agent: &ureq::Agent, url: &str, token: Option<&str>, from: u64, to: u64) -> Result<(Vec<u8>, u64), String> {
    let mut req = agent.get(url).header("Range", &format!("bytes={from}-{to}"));
    if let Some(t) = token {
        req = req.header("Authorization", &format!("Bearer {t}"));
    }
    let resp = req.call().map_err(|e| e.to_string())?;
    let total = resp
        .headers()
        .get("content-range")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.rsplit('/').next())
        .and_then(|v| v.parse::<u64>().ok())
        .ok_or("the server sent no Content-Range (no range support?)")?;
    let mut body = Vec::new();
    std::io::Read::read_to_end(&mut resp.into_body().into_reader(), &mut body).map_err(|e| e.to_string())?;
    if body.len() as u64 != to - from + 1 {
        return Err(format!("asked for {} bytes, got {}", to - from + 1, body.len()));
    }
    Ok((body, total))
}

/// A safetensors file with its real header and size whose data is a hole: the tensor index
/// without the weights.
fn write_header_only(agent: &ureq::Agent, url: &str, token: Option<&str>, dst: &Path) -> Result<(), String> {
    let (len, total) = range(agent, url, token, 0, 7)?;
    let n = u64::from_le_bytes(len.as_slice().try_into().map_err(|_| "short length prefix")?);
    if n == 0 || n > 100 << 20 || 8 + n > total {
        return Err(format!("header length {n} does not fit a file of {total} bytes"));
    }
    let (header, _) = range(agent, url, token, 8, 8 + n - 1)?;
    let tmp = dst.with_extension("part");
    let mut f = std::fs::File::create(&tmp).map_err(|e| e.to_string())?;
    use std::io::Write;
    f.write_all(&len).and_then(|_| f.write_all(&header)).and_then(|_| f.set_len(total)).map_err(|e| e.to_string())?;
    std::fs::rename(&tmp, dst).map_err(|e| e.to_string())
}

/// The hub client for `cache` and the token it sends (`HF_TOKEN`, else the saved token file).
fn client(cache: &Cache, progress: bool) -> Result<(hf_hub::api::sync::Api, Option<String>), HubError> {
    let token = std::env::var("HF_TOKEN").ok().filter(|t| !t.trim().is_empty()).or_else(|| cache.token());
    let api = ApiBuilder::from_cache(cache.clone())
        .with_endpoint(endpoint())
        .with_token(token.clone())
        .with_progress(progress)
        .build()
        .map_err(|e| HubError::Client(Box::new(e)))?;
    Ok((api, token))
}

/// One file from the cache, or downloaded into it.
fn fetch(repo: &ApiRepo, name: &ModelName, file: &str) -> Result<PathBuf, HubError> {
    repo.get(file).map_err(|e| match status_of(&e) {
        Some(s @ (401 | 403)) => HubError::Denied { name: name.display(), endpoint: endpoint(), status: s },
        _ => HubError::Download { name: name.display(), file: file.to_string(), source: Box::new(e) },
    })
}

fn status_of(e: &hf_hub::api::sync::ApiError) -> Option<u16> {
    match e {
        hf_hub::api::sync::ApiError::RequestError(r) => match r.as_ref() {
            ureq::Error::StatusCode(s) => Some(*s),
            _ => None,
        },
        _ => None,
    }
}

/// When the repository listing fails: HTTP errors are reported as such; an unreachable hub
/// still runs a model the cache holds.
fn offline_fallback(cache: &Cache, name: &ModelName, e: hf_hub::api::sync::ApiError) -> Result<PathBuf, HubError> {
    match status_of(&e) {
        Some(s @ (401 | 403)) => Err(HubError::Denied { name: name.display(), endpoint: endpoint(), status: s }),
        Some(404) => Err(HubError::NotFound {
            name: name.display(),
            endpoint: endpoint(),
            hint: if name.revision == "main" { "; names are case-sensitive" } else { "; check the revision" },
        }),
        _ => match cached(cache, name) {
            Some(p) => {
                tracing::warn!("cannot reach {} ({e}); using the cached copy of {}", endpoint(), name.display());
                Ok(p)
            }
            None => Err(HubError::Unreachable { name: name.display(), endpoint: endpoint(), cache: cache.path().clone(), source: Box::new(e) }),
        },
    }
}

/// The cached copy of a model, when it is complete enough to run: the named GGUF file, or a
/// snapshot with a `config.json` and weights.
fn cached(cache: &Cache, name: &ModelName) -> Option<PathBuf> {
    let repo_dir = cache.path().join(Repo::model(name.repo.clone()).folder_name());
    let commit = std::fs::read_to_string(repo_dir.join("refs").join(&name.revision))
        .map(|s| s.trim().to_string())
        // A commit hash names its snapshot directly.
        .unwrap_or_else(|_| name.revision.clone());
    let snapshot = repo_dir.join("snapshots").join(commit);
    match &name.file {
        Some(f) => Some(snapshot.join(f)).filter(|p| p.is_file()),
        None => {
            let has_weights = std::fs::read_dir(&snapshot).ok()?.flatten().any(|e| {
                let n = e.file_name();
                let n = n.to_string_lossy();
                n.ends_with(".safetensors")
            });
            Some(snapshot).filter(|s| s.join("config.json").is_file() && has_weights)
        }
    }
}

/// Files a folder model needs besides its weights (the rest of a repository — other weight
/// formats, `original/` copies, ONNX exports, images — is never downloaded).
const FOLDER_FILES: &[&str] = &[
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "hf_quant_config.json",
    "model.safetensors.index.json",
];

/// Which of a repository's files to fetch for `name`, config first (so a listing with a bad
/// config fails before gigabytes arrive).
pub fn wanted_files(name: &ModelName, files: &[String]) -> Result<Vec<String>, HubError> {
    let nothing = |why: String| HubError::NothingToRun { name: name.display(), why };
    if let Some(file) = &name.file {
        if !files.iter().any(|f| f == file) {
            let ggufs: Vec<&str> = files.iter().filter(|f| f.ends_with(".gguf")).map(String::as_str).collect();
            return Err(nothing(if ggufs.is_empty() {
                format!("the repository has no file {file} and no GGUF files")
            } else {
                format!("the repository has no file {file}; its GGUF files are: {}", ggufs.join(", "))
            }));
        }
        // A split GGUF (`…-00001-of-00003.gguf`) needs all of its parts.
        let path = Path::new(file.as_str());
        let Some((prefix, _, count, ext)) = crate::model::gguf::split_name(path) else { return Ok(vec![file.clone()]) };
        let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let mut parts: Vec<String> = files
            .iter()
            .filter(|f| {
                let p = Path::new(f.as_str());
                p.parent().map(Path::to_path_buf).unwrap_or_default() == dir
                    && crate::model::gguf::split_name(p).is_some_and(|(pre, _, c, e)| pre == prefix && c == count && e == ext)
            })
            .cloned()
            .collect();
        parts.sort();
        return Ok(parts);
    }
    let root = |f: &&String| !f.contains('/');
    let weights: Vec<String> = files.iter().filter(root).filter(|f| f.ends_with(".safetensors")).cloned().collect();
    if !files.iter().any(|f| f == "config.json") || weights.is_empty() {
        let ggufs: Vec<&str> = files.iter().filter(|f| f.ends_with(".gguf")).map(String::as_str).collect();
        return Err(nothing(if !ggufs.is_empty() {
            format!("the repository holds GGUF files; name one, as {}/{}", name.repo, ggufs[0])
        } else if weights.is_empty() {
            "the repository has no safetensors weights at its top level (ft-actor runs safetensors checkpoints and GGUF files)".into()
        } else {
            "the repository has no config.json".into()
        }));
    }
    let mut out: Vec<String> = FOLDER_FILES.iter().filter(|w| files.iter().any(|f| f == *w)).map(|w| w.to_string()).collect();
    out.extend(weights);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names_and_leaves_paths() {
        let n = ModelName::parse("Qwen/Qwen3-30B-A3B-FP8").unwrap();
        assert_eq!((n.repo.as_str(), n.file.as_deref(), n.revision.as_str()), ("Qwen/Qwen3-30B-A3B-FP8", None, "main"));
        let n = ModelName::parse("org/name:v1.0").unwrap();
        assert_eq!((n.repo.as_str(), n.revision.as_str()), ("org/name", "v1.0"));
        let n = ModelName::parse("unsloth/Qwen3-GGUF/Q4_K_M/model-Q4_K_M.gguf:abc123").unwrap();
        assert_eq!((n.file.as_deref(), n.revision.as_str()), (Some("Q4_K_M/model-Q4_K_M.gguf"), "abc123"));
        assert_eq!(n.display(), "unsloth/Qwen3-GGUF/Q4_K_M/model-Q4_K_M.gguf:abc123");
        for path in ["/abs/path", "./rel", "~/models/x", "models", "a/b/c", "a/b/../x.gguf", "a//b", "a/b:", "a/b:x/y", ".hidden/x"] {
            assert_eq!(ModelName::parse(path), None, "{path}");
        }
    }

    #[test]
    fn picks_only_what_the_engine_reads() {
        let files: Vec<String> = [
            "config.json", "tokenizer.json", "tokenizer_config.json", "README.md", "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "original/consolidated.safetensors",
            "chat_template.jinja", "onnx/model.onnx",
        ]
        .map(String::from)
        .to_vec();
        let name = ModelName::parse("org/m").unwrap();
        let w = wanted_files(&name, &files).unwrap();
        assert_eq!(w[0], "config.json");
        assert!(w.contains(&"model-00002-of-00002.safetensors".to_string()) && w.contains(&"chat_template.jinja".to_string()));
        assert!(!w.iter().any(|f| f.contains("original/") || f.ends_with(".bin") || f.ends_with(".md") || f.contains("onnx")), "{w:?}");

        let gguf_repo: Vec<String> = ["README.md", "m-Q4_K_M-00001-of-00002.gguf", "m-Q4_K_M-00002-of-00002.gguf", "m-Q8_0.gguf"].map(String::from).to_vec();
        let e = wanted_files(&name, &gguf_repo).unwrap_err().to_string();
        assert!(e.contains("name one, as org/m/m-Q4_K_M-00001-of-00002.gguf"), "{e}");
        let split = ModelName::parse("org/m/m-Q4_K_M-00001-of-00002.gguf").unwrap();
        assert_eq!(wanted_files(&split, &gguf_repo).unwrap(), ["m-Q4_K_M-00001-of-00002.gguf", "m-Q4_K_M-00002-of-00002.gguf"]);
        let one = ModelName::parse("org/m/m-Q8_0.gguf").unwrap();
        assert_eq!(wanted_files(&one, &gguf_repo).unwrap(), ["m-Q8_0.gguf"]);
        let missing = ModelName::parse("org/m/m-Q2_K.gguf").unwrap();
        assert!(wanted_files(&missing, &gguf_repo).unwrap_err().to_string().contains("its GGUF files are"));
        let bin_only: Vec<String> = ["config.json", "pytorch_model.bin"].map(String::from).to_vec();
        assert!(wanted_files(&name, &bin_only).unwrap_err().to_string().contains("no safetensors weights"));
    }
}
