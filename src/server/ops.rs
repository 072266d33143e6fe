//! Operations routes: health, Prometheus metrics, and the elastic expert cache.

use super::errors::OpenAiError;
use super::prompt::parse_request;
use super::{read_json, ApiError, AppState};
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

/// `GET /health`: 200 while the engine answers, 503 when it does not. Needs no key.
pub async fn health(State(state): State<AppState>) -> Response {
    match state.engine.stats().await {
        Ok(s) => Json(json!({
            "status": "ok", "model": state.model_id, "running": s.active, "waiting": s.queued,
        }))
        .into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"status": "unavailable", "error": e.to_string()}))).into_response(),
    }
}

/// `GET /metrics`: Prometheus text format.
pub async fn metrics(State(state): State<AppState>) -> Response {
    let stats = state.engine.stats().await.ok();
    let body = state.metrics.render(stats.as_ref());
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], body).into_response()
}

/// `GET /v1/cache/status`: expert cache capacity, use and traffic, per layer and in total.
pub async fn cache_status(State(state): State<AppState>) -> Result<Json<Value>, OpenAiError> {
    let s = state.engine.stats().await?;
    let info = state.engine.info();
    let layers: Vec<Value> = s
        .layers
        .iter()
        .map(|(l, st)| {
            json!({"layer": l, "hits": st.hits, "misses": st.misses, "hit_rate": st.hit_rate(),
                "fetched": st.fetched, "cpu_computed": st.cpu_computed, "streamed": st.streamed, "bytes_moved": st.bytes_moved})
        })
        .collect();
    let t = &s.total;
    Ok(Json(json!({
        "slots": s.cache_slots,
        "used": s.cache_used,
        "total_experts": info.memory.total_experts,
        "moe_mode": if s.moe_mode.is_empty() { info.moe_mode.clone() } else { s.moe_mode.clone() },
        "leased": s.cache_leased,
        "max_slots": info.memory.max_cache_slots,
        "hits": t.hits, "misses": t.misses, "hit_rate": t.hit_rate(),
        "fetched": t.fetched, "cpu_computed": t.cpu_computed, "streamed": t.streamed, "bytes_moved": t.bytes_moved,
        "evictions": s.cache.evictions,
        "bandwidth": {"host_to_device_bytes_per_s": info.b_p, "cpu_expert_bytes_per_s": info.b_h, "source": info.bandwidth_source},
        "layers": layers,
        "prefix_cache": prefix_cache_json(&s),
    })))
}

/// The agent-aware prefix reuse part of `/v1/cache/status`.
fn prefix_cache_json(s: &crate::engine::EngineStats) -> Value {
    let r = &s.reuse;
    json!({
        "enabled": r.index.budget > 0,
        "budget_bytes": r.index.budget,
        "device_budget_bytes": r.device_budget,
        "bytes": r.index.bytes,
        "device_bytes": r.device_bytes,
        "host_bytes": r.index.bytes.saturating_sub(r.device_bytes),
        "anchors": r.index.anchors,
        "hits": r.index.hits,
        "misses": r.index.misses,
        "evictions": r.index.evictions,
        "demoted_to_host": r.demoted,
        "reused_tokens": r.reused_tokens,
        "prefill_tokens": s.prefill_tokens,
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Resize {
    slots: u64,
}

/// `POST /v1/cache/resize` with `{"slots": N}`: the engine applies it at the next step
/// boundary, without disturbing generations in flight.
pub async fn cache_resize(State(state): State<AppState>, body: Body) -> Result<Json<Value>, OpenAiError> {
    let body = read_json(&state, body).await?;
    let req: Resize = parse_request(body)?;
    let before = state.engine.stats().await.map(|s| s.cache_slots).ok();
    let total = state.engine.info().memory.total_experts;
    if total > 0 && req.slots > total {
        return Err(ApiError::invalid("slots", format!("the model has {total} routed experts; at most {total} slots are useful")).into());
    }
    let slots = state.engine.resize_cache(req.slots).await.map_err(|e| match e {
        crate::engine::EngineError::InvalidRequest(m) => ApiError::invalid("slots", m),
        e => ApiError::from(e),
    })?;
    if slots != req.slots {
        tracing::info!("cache resize to {} slots gave {slots}", req.slots);
    }
    let moe_mode = state.engine.stats().await.map(|s| s.moe_mode).ok();
    Ok(Json(json!({"slots": slots, "previous": before, "requested": req.slots, "moe_mode": moe_mode})))
}

/// `POST /v1/debug/faults` (only with `fault_injection` on): arms faults in the expert
/// pipeline, e.g. `{"copy": 1}`, and answers the faults still armed.
pub async fn inject_faults(State(state): State<AppState>, body: Body) -> Result<Json<Value>, OpenAiError> {
    let body = read_json(&state, body).await?;
    let counts: crate::actors::faults::FaultCounts = parse_request(body)?;
    state.engine.inject_faults(counts);
    Ok(Json(json!({"armed": state.engine.pending_faults()})))
}
