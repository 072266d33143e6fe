//! Errors as each API writes them.
//!
//! One [`ApiError`] describes what went wrong (status, kind, message, offending parameter);
//! [`Flavor`] decides the JSON it is written as, because clients parse errors with their
//! own API's schema: OpenAI `{"error": {"message", "type", "param", "code"}}`, Anthropic
//! `{"type": "error", "error": {"type", "message"}}`.

use crate::engine::EngineError;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// Which API's error format to write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    /// OpenAI (chat completions, completions, responses, models) and the operations routes.
    OpenAi,
    /// Anthropic (messages, count_tokens).
    Anthropic,
}

/// The category of an error; each API names it its own way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The request is malformed or not supported (400).
    InvalidRequest,
    /// Missing or wrong API key (401).
    Authentication,
    /// Unknown model, route or stored object (404).
    NotFound,
    /// A route that exists, asked with a method it does not take (405).
    MethodNotAllowed,
    /// The request conflicts with the engine's state or limits (409).
    Conflict,
    /// The body is larger than the server accepts (413).
    TooLarge,
    /// The request queue is full (429).
    RateLimit,
    /// The engine cannot take work right now, e.g. while the cache is resized (503).
    Overloaded,
    /// A fault in the server or engine (500).
    Internal,
}

impl ErrorKind {
    /// The HTTP status of this kind.
    pub fn status(self) -> StatusCode {
        match self {
            ErrorKind::InvalidRequest => StatusCode::BAD_REQUEST,
            ErrorKind::Authentication => StatusCode::UNAUTHORIZED,
            ErrorKind::NotFound => StatusCode::NOT_FOUND,
            ErrorKind::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ErrorKind::Conflict => StatusCode::CONFLICT,
            ErrorKind::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorKind::RateLimit => StatusCode::TOO_MANY_REQUESTS,
            ErrorKind::Overloaded => StatusCode::SERVICE_UNAVAILABLE,
            ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn openai_type(self) -> &'static str {
        match self {
            ErrorKind::InvalidRequest | ErrorKind::NotFound | ErrorKind::MethodNotAllowed | ErrorKind::Conflict | ErrorKind::TooLarge => {
                "invalid_request_error"
            }
            ErrorKind::Authentication => "authentication_error",
            ErrorKind::RateLimit => "rate_limit_error",
            ErrorKind::Overloaded => "service_unavailable_error",
            ErrorKind::Internal => "server_error",
        }
    }

    fn anthropic_type(self) -> &'static str {
        match self {
            ErrorKind::InvalidRequest | ErrorKind::MethodNotAllowed | ErrorKind::Conflict => "invalid_request_error",
            ErrorKind::Authentication => "authentication_error",
            ErrorKind::NotFound => "not_found_error",
            ErrorKind::TooLarge => "request_too_large",
            ErrorKind::RateLimit => "rate_limit_error",
            ErrorKind::Overloaded => "overloaded_error",
            ErrorKind::Internal => "api_error",
        }
    }
}

/// An error to send to a client.
#[derive(Clone, Debug, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    /// Category (decides the status).
    pub kind: ErrorKind,
    /// Human-readable explanation.
    pub message: String,
    /// The request field at fault (`messages[2].content`), when there is one.
    pub param: Option<String>,
    /// A machine-readable code (`context_length_exceeded`, `model_not_found`...).
    pub code: Option<&'static str>,
}

impl ApiError {
    /// An error of `kind`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self { kind, message: message.into(), param: None, code: None }
    }

    /// A 400 naming the offending field.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self { param: Some(param.into()), ..Self::new(ErrorKind::InvalidRequest, message) }
    }

    /// Adds a machine-readable code.
    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    /// A 500 for a real fault; the details go to the log as well.
    pub fn internal(message: impl Into<String>) -> Self {
        let message = message.into();
        tracing::error!("internal error: {message}");
        Self::new(ErrorKind::Internal, message)
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.kind.status()
    }

    /// The JSON body in `flavor`'s format.
    pub fn body(&self, flavor: Flavor) -> serde_json::Value {
        match flavor {
            Flavor::OpenAi => json!({"error": {
                "message": self.message,
                "type": self.kind.openai_type(),
                "param": self.param,
                "code": self.code,
            }}),
            Flavor::Anthropic => {
                // Anthropic messages name the field first (`max_tokens: Field required`).
                let message = match &self.param {
                    Some(p) if !self.message.starts_with(p.as_str()) => format!("{p}: {}", self.message),
                    _ => self.message.clone(),
                };
                json!({"type": "error", "error": {"type": self.kind.anthropic_type(), "message": message}})
            }
        }
    }

    /// The full HTTP response in `flavor`'s format.
    pub fn response(&self, flavor: Flavor) -> Response {
        let mut resp = (self.status(), axum::Json(self.body(flavor))).into_response();
        if matches!(self.kind, ErrorKind::RateLimit | ErrorKind::Overloaded) {
            // Clients (both SDKs) honour Retry-After when they back off.
            resp.headers_mut().insert("retry-after", HeaderValue::from_static("1"));
        }
        resp
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::InvalidRequest(m) => ApiError::new(ErrorKind::InvalidRequest, m),
            EngineError::PromptTooLong { prompt, context } => prompt_too_long(prompt, context),
            EngineError::QueueFull(n) => ApiError::new(
                ErrorKind::RateLimit,
                format!("the server is busy: the request queue is full ({n} waiting); retry later"),
            ),
            EngineError::Resizing => ApiError::new(
                ErrorKind::Overloaded,
                "the expert cache is being resized; retry in a moment",
            ),
            EngineError::Stopped => ApiError::new(ErrorKind::Overloaded, "the engine is not running"),
            EngineError::OutOfMemory(m) => {
                tracing::warn!("request failed for lack of device memory: {m}");
                ApiError::new(ErrorKind::Overloaded, format!("{m}; retry shortly")).with_code("out_of_memory")
            }
            EngineError::Conflict(m) => ApiError::new(ErrorKind::Conflict, m),
            e @ (EngineError::Start(_) | EngineError::Internal(_)) => ApiError::internal(e.to_string()),
        }
    }
}

/// The error for a prompt that does not fit the context. The wording starts with "prompt
/// is too long", which agents (Claude Code among them) look for to compact their history.
pub fn prompt_too_long(prompt: usize, context: usize) -> ApiError {
    ApiError::invalid(
        "messages",
        format!("prompt is too long: {prompt} tokens > {} maximum (the context holds {context} tokens)", context.saturating_sub(1)),
    )
    .with_code("context_length_exceeded")
}

/// An [`ApiError`] bound to the OpenAI format, for handlers' `Result` types.
#[derive(Debug)]
pub struct OpenAiError(pub ApiError);

/// An [`ApiError`] bound to the Anthropic format.
#[derive(Debug)]
pub struct AnthropicError(pub ApiError);

impl IntoResponse for OpenAiError {
    fn into_response(self) -> Response {
        self.0.response(Flavor::OpenAi)
    }
}

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        self.0.response(Flavor::Anthropic)
    }
}

impl<E: Into<ApiError>> From<E> for OpenAiError {
    fn from(e: E) -> Self {
        OpenAiError(e.into())
    }
}

impl<E: Into<ApiError>> From<E> for AnthropicError {
    fn from(e: E) -> Self {
        AnthropicError(e.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_errors_map_to_statuses() {
        let cases = [
            (EngineError::QueueFull(3), 429, "rate_limit_error"),
            (EngineError::Resizing, 503, "overloaded_error"),
            (EngineError::PromptTooLong { prompt: 9000, context: 4096 }, 400, "invalid_request_error"),
            (EngineError::InvalidRequest("x".into()), 400, "invalid_request_error"),
            (EngineError::Internal("boom".into()), 500, "api_error"),
            (EngineError::OutOfMemory("1 GiB requested".into()), 503, "overloaded_error"),
            (EngineError::Conflict("too many slots".into()), 409, "invalid_request_error"),
        ];
        for (e, status, anthropic_type) in cases {
            let a = ApiError::from(e);
            assert_eq!(a.status().as_u16(), status);
            assert_eq!(a.body(Flavor::Anthropic)["error"]["type"], anthropic_type);
            assert!(a.body(Flavor::OpenAi)["error"]["message"].is_string());
        }
        let r = ApiError::from(EngineError::QueueFull(1)).response(Flavor::OpenAi);
        assert_eq!(r.headers().get("retry-after").and_then(|v| v.to_str().ok()), Some("1"));
    }

    #[test]
    fn anthropic_messages_name_the_field_first() {
        let e = ApiError::invalid("max_tokens", "Field required");
        assert_eq!(e.body(Flavor::Anthropic)["error"]["message"], "max_tokens: Field required");
        assert_eq!(e.body(Flavor::OpenAi)["error"]["param"], "max_tokens");
    }
}
