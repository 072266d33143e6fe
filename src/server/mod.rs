//! `ft-actor serve`: OpenAI- and Anthropic-compatible HTTP APIs over a running engine.
//!
//! [`app`] builds the router from an [`AppState`] (an [`EngineHandle`] plus the server's
//! settings), so tests drive it without a socket and [`serve`] runs it on one. Handlers do
//! no model work themselves: prompt rendering and tokenization run on the blocking pool,
//! generation runs in the engine, and a handler only converts between the wire formats and
//! the engine's token stream.
//!
//! - [`openai`]: `/v1/chat/completions` and `/v1/models`; [`completions`]: `/v1/completions`
//! - [`responses`]: `/v1/responses` and `/v1/responses/{id}`
//! - [`anthropic`]: `/v1/messages` and `/v1/messages/count_tokens`
//! - [`ops`]: `/health`, `/metrics`, `/v1/cache/status`, `/v1/cache/resize`
//! - [`web`]: the chat page and engine dashboard at `/` (assets embedded), and `/v1/stats`
//! - [`parsers`]: reasoning and tool calls out of the model's text, streamed

pub mod anthropic;
pub mod completions;
pub mod errors;
#[cfg(test)]
mod encoder_tests;
mod constrain;
mod generation;
pub mod metrics;
pub mod openai;
pub mod ops;
pub mod parsers;
mod prompt;
pub mod responses;
mod settings;
mod sse;
pub mod store;
#[cfg(test)]
mod template_tests;
#[cfg(test)]
mod template_round_trip_tests;
mod web;
mod wire;

pub use errors::{ApiError, ErrorKind, Flavor};
pub use settings::{ReasoningParser, ServerSettings, ToolParser};
pub use prompt::{opens_think, ModelFormat};

use crate::chat::ChatTemplate;
use crate::engine::EngineHandle;
use crate::model::generation_config::GenerationConfig;
use crate::sampling::SamplingParams;
use crate::tokenizer::Tokenizer;
use axum::extract::{Request, State};
use axum::http::HeaderMap;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The model has no tokenizer: text APIs cannot work.
    #[error("the model in {0} has no tokenizer.json; the HTTP APIs need one")]
    NoTokenizer(String),
    /// `generation_config.json` is malformed.
    #[error(transparent)]
    GenerationConfig(#[from] crate::model::generation_config::GenerationConfigError),
    /// The chat template does not compile.
    #[error("the model's chat template does not compile: {0}")]
    Template(#[from] crate::chat::ChatError),
    /// Binding or serving failed.
    #[error("cannot serve on {addr}: {source}")]
    Io {
        /// The address.
        addr: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// Everything handlers share. Cheap to clone.
#[derive(Clone)]
pub struct AppState(Arc<Inner>);

/// The shared part of [`AppState`].
pub struct Inner {
    /// The engine.
    pub engine: EngineHandle,
    /// The model's tokenizer.
    pub tokenizer: Arc<Tokenizer>,
    /// The compiled chat template (`None`: a base model; chat APIs answer 400).
    pub template: Option<Arc<ChatTemplate>>,
    /// The id clients use for the model.
    pub model_id: String,
    /// When the server started (unix seconds), reported as the model's `created`.
    pub created: u64,
    /// The model's default sampling (`generation_config.json`).
    pub sampling: SamplingParams,
    /// Server settings.
    pub settings: ServerSettings,
    /// Output markup the model uses.
    pub format: prompt::ModelFormat,
    /// Stored responses for `GET /v1/responses/{id}` and `previous_response_id`.
    pub responses: Arc<store::Store>,
    /// Counters for `/metrics`.
    pub metrics: metrics::Metrics,
}

impl std::ops::Deref for AppState {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.0
    }
}

impl AppState {
    /// Prepares the server state for a running engine.
    pub fn new(engine: EngineHandle, settings: ServerSettings) -> Result<AppState, ServerError> {
        let info = engine.info();
        let dir = info.model_dir.clone();
        let tokenizer = engine
            .tokenizer()
            .cloned()
            .ok_or_else(|| ServerError::NoTokenizer(dir.display().to_string()))?;
        let template = match ChatTemplate::from_tokenizer(&tokenizer) {
            Ok(t) => Some(Arc::new(t)),
            Err(crate::chat::ChatError::NoTemplate) => {
                tracing::warn!("the model has no chat template: only /v1/completions will work");
                None
            }
            Err(e) => return Err(e.into()),
        };
        let sampling = GenerationConfig::from_dir(&dir)?.sampling();
        let format = prompt::ModelFormat::detect(&tokenizer, template.as_deref(), &settings);
        let model_id = settings.model_id(engine.info().model_dir.as_path(), is_demo(&dir));
        let created = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        let responses = Arc::new(store::Store::new(settings.max_stored_responses));
        Ok(AppState(Arc::new(Inner {
            engine,
            tokenizer,
            template,
            model_id,
            created,
            sampling,
            settings,
            format,
            responses,
            metrics: metrics::Metrics::default(),
        })))
    }

    /// Checks the `model` a request names; `None` means "the served model".
    pub fn check_model(&self, model: Option<&str>) -> Result<(), ApiError> {
        match model {
            None => Ok(()),
            Some(m) if m == self.model_id || self.settings.model_aliases.iter().any(|a| a == m) => Ok(()),
            Some(m) => Err(ApiError::new(
                ErrorKind::NotFound,
                format!("the model `{m}` does not exist; this server serves `{}`", self.model_id),
            )
            .with_code("model_not_found")),
        }
    }
}

/// True when `dir` is the built-in demo model's folder.
fn is_demo(dir: &std::path::Path) -> bool {
    crate::demo::demo_model_dir().is_ok_and(|d| d == dir)
}

/// The router with every route of the server.
pub fn app(state: AppState) -> Router {
    let api = Router::new()
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/v1/completions", post(completions::create))
        .route("/v1/models", get(openai::list_models))
        .route("/v1/models/{*id}", get(openai::get_model))
        .route("/v1/responses", post(responses::create))
        .route("/v1/responses/{id}", get(responses::retrieve).delete(responses::delete))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/metrics", get(ops::metrics))
        .route("/v1/cache/status", get(ops::cache_status))
        .route("/v1/cache/resize", post(ops::cache_resize))
        .route("/v1/stats", get(web::stats));
    let api = if state.settings.fault_injection { api.route("/v1/debug/faults", post(ops::inject_faults)) } else { api };
    let api = api
        .route_layer(middleware::from_fn_with_state(state.clone(), require_key));
    Router::new()
        .route("/health", get(ops::health))
        .merge(web::pages())
        .merge(api)
        .method_not_allowed_fallback(method_not_allowed)
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(state.clone(), metrics::count_requests))
        .with_state(state)
}

/// Which error format a request expects, judged from its path and headers.
pub fn flavor_of(path: &str, headers: &HeaderMap) -> Flavor {
    if path.starts_with("/v1/messages") || headers.contains_key("anthropic-version") {
        Flavor::Anthropic
    } else {
        Flavor::OpenAi
    }
}

async fn not_found(req: Request) -> Response {
    let flavor = flavor_of(req.uri().path(), req.headers());
    let msg = format!("no route for {} {}", req.method(), req.uri().path());
    ApiError::new(ErrorKind::NotFound, msg).response(flavor)
}

/// A route asked with a method it does not take: 405 in the API's own error shape (axum's
/// default answers with an empty body, which clients report as an unparsable error).
async fn method_not_allowed(req: Request) -> Response {
    let flavor = flavor_of(req.uri().path(), req.headers());
    let msg = format!("{} does not take {} requests", req.uri().path(), req.method());
    ApiError::new(ErrorKind::MethodNotAllowed, msg).response(flavor)
}

/// `--api-key`: every route but `/health` needs `Authorization: Bearer KEY` or `x-api-key`.
async fn require_key(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let Some(key) = state.settings.api_key.as_deref() else {
        return next.run(req).await;
    };
    let h = req.headers();
    let given = h
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .or_else(|| {
            h.get("authorization")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        })
        .map(str::trim);
    if given.is_some_and(|g| constant_time_eq(g.as_bytes(), key.as_bytes())) {
        return next.run(req).await;
    }
    let flavor = flavor_of(req.uri().path(), req.headers());
    let msg = if given.is_some() { "invalid API key" } else { "missing API key (send Authorization: Bearer KEY or x-api-key)" };
    ApiError::new(ErrorKind::Authentication, msg).with_code("invalid_api_key").response(flavor)
}

/// Compares without an early exit, so response timing does not reveal the key prefix.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = (a.len() != b.len()) as u8;
    for (i, x) in a.iter().enumerate() {
        diff |= x ^ b.get(i % b.len().max(1)).copied().unwrap_or(0);
    }
    diff == 0
}

/// Reads a JSON body of at most `max_body_bytes`; errors are the API's 413 or 400.
pub(crate) async fn read_json(state: &AppState, body: axum::body::Body) -> Result<serde_json::Value, ApiError> {
    use http_body_util::{BodyExt, LengthLimitError, Limited};
    let limit = usize::try_from(state.settings.max_body_bytes).unwrap_or(usize::MAX);
    let bytes = match Limited::new(body, limit).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.is::<LengthLimitError>() => {
            return Err(ApiError::new(
                ErrorKind::TooLarge,
                format!(
                    "the request body is larger than this server's limit of {} bytes (setting max_body_bytes)",
                    state.settings.max_body_bytes
                ),
            ))
        }
        Err(e) => return Err(ApiError::invalid("body", format!("cannot read the request body: {e}"))),
    };
    if bytes.is_empty() {
        return Err(ApiError::invalid("body", "the request body is empty; expected a JSON object"));
    }
    let value: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::invalid("body", format!("the request body is not valid JSON: {e}")))?;
    if !value.is_object() {
        return Err(ApiError::invalid("body", "the request body must be a JSON object"));
    }
    Ok(value)
}

static ID_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A fresh id such as `chatcmpl-3f9a…`: unique in this process and hard to guess.
pub(crate) fn new_id(prefix: &str) -> String {
    let seed = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
        ^ ((std::process::id() as u64) << 32);
    let mut s = seed ^ ID_COUNTER.fetch_add(1, Ordering::Relaxed).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let a = crate::sampling::splitmix64(&mut s);
    let b = crate::sampling::splitmix64(&mut s);
    format!("{prefix}{a:016x}{:08x}", b as u32)
}

/// Seconds since the epoch.
pub(crate) fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// Runs the server on `listener` until `shutdown` resolves; in-flight streams are ended
/// when the process exits.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    let addr = listener.local_addr().map(|a| a.to_string()).unwrap_or_default();
    axum::serve(listener, app(state))
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(|source| ServerError::Io { addr, source })
}
