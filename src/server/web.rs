//! The web page at `/`: a chat client for the server's own `/v1/chat/completions` and a live
//! view of the engine, fed by `GET /v1/stats`.
//!
//! The page is a few static files compiled into the binary (no build step, nothing fetched
//! from elsewhere). They are served with an `ETag` of their content and `no-cache`, so a
//! browser revalidates each load and picks up a new binary's page at once, yet transfers
//! nothing while the files are unchanged.

use super::errors::OpenAiError;
use super::AppState;
use crate::engine::{EngineInfo, EngineStats};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};

/// One embedded file.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static str,
}

const INDEX: Asset = Asset { name: "index.html", content_type: "text/html; charset=utf-8", body: include_str!("web/index.html") };

/// The files under `/assets/`.
const ASSETS: &[Asset] = &[
    Asset { name: "app.js", content_type: "text/javascript; charset=utf-8", body: include_str!("web/app.js") },
    Asset { name: "chat.js", content_type: "text/javascript; charset=utf-8", body: include_str!("web/chat.js") },
    Asset { name: "dashboard.js", content_type: "text/javascript; charset=utf-8", body: include_str!("web/dashboard.js") },
    Asset { name: "style.css", content_type: "text/css; charset=utf-8", body: include_str!("web/style.css") },
];

/// The page's routes, which need no API key: the files hold nothing secret, and the page
/// asks for the key itself when the server has one.
pub fn pages() -> Router<AppState> {
    Router::new().route("/", get(index)).route("/assets/{name}", get(asset))
}

async fn index(headers: HeaderMap) -> Response {
    serve(&INDEX, &headers)
}

async fn asset(Path(name): Path<String>, headers: HeaderMap) -> Response {
    match ASSETS.iter().find(|a| a.name == name) {
        Some(a) => serve(a, &headers),
        None => (StatusCode::NOT_FOUND, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], format!("no asset {name}\n"))
            .into_response(),
    }
}

/// The file, or 304 when the browser already holds this version of it.
fn serve(a: &Asset, headers: &HeaderMap) -> Response {
    let etag = format!("\"{:016x}\"", fnv1a(a.body.as_bytes()));
    let fresh = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag || t.trim() == "*"));
    let mut resp = if fresh { StatusCode::NOT_MODIFIED.into_response() } else { a.body.into_response() };
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(a.content_type));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    if let Ok(v) = HeaderValue::from_str(&etag) {
        h.insert(header::ETAG, v);
    }
    resp
}

/// 64-bit FNV-1a: a stable content hash for the `ETag` without a dependency.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}

/// `GET /v1/stats`: what the engine counts, gathered in one JSON object for the dashboard.
/// Counters are totals since the engine started; rates over an interval are the difference of
/// two reads, which the page takes itself.
pub async fn stats(State(state): State<AppState>) -> Result<Json<Value>, OpenAiError> {
    let s = state.engine.stats().await?;
    Ok(Json(stats_json(&state.model_id, state.engine.info(), &s)))
}

fn ratio(num: f64, den: f64) -> Option<f64> {
    (den > 0.0).then_some(num / den)
}

fn stats_json(model: &str, info: &EngineInfo, s: &EngineStats) -> Value {
    let t = &s.total;
    let layers: Vec<Value> = s
        .layers
        .iter()
        .map(|(l, st)| {
            json!({"layer": l, "hits": st.hits, "misses": st.misses, "fetched": st.fetched,
                "cpu_computed": st.cpu_computed, "streamed": st.streamed})
        })
        .collect();
    let top_k = info.config.top_k;
    let r = &s.reuse;
    json!({
        "model": model,
        "backend": info.backend,
        "moe_mode": if s.moe_mode.is_empty() { info.moe_mode.as_str() } else { s.moe_mode.as_str() },
        "requests": {"completed": s.requests, "running": s.active, "waiting": s.queued},
        "tokens": {
            "generated": s.tokens_generated,
            "prompt": s.prompt_tokens,
            "prefilled": s.prefill_tokens,
            "decode_tokens": s.decode_tokens,
            "decode_seconds": s.decode_s,
            "decode_tokens_per_s": ratio(s.decode_tokens as f64, s.decode_s),
        },
        "steps": {
            "total": s.steps, "decode": s.decode_steps, "mixed": s.mixed_steps,
            "mean_batch": ratio(s.step_sequences as f64, s.steps as f64), "max_batch": s.max_batch,
            "max_step_seconds": s.max_step_s, "preemptions": s.preemptions,
            "actor_overhead_fraction": s.actor_overhead_fraction(),
            "expert_phase_fraction": s.expert_phase_fraction(),
        },
        "expert_cache": {
            "slots": s.cache_slots, "used": s.cache_used, "total_experts": info.memory.total_experts,
            "hits": t.hits, "misses": t.misses, "hit_rate": ratio(t.hits as f64, (t.hits + t.misses) as f64),
            "evictions": s.cache.evictions,
            "layers": layers,
        },
        "split": {
            "experts_per_token": top_k,
            "q_star_for_top_k_misses": crate::policy::q_star(top_k, info.b_p, info.b_h),
            "fetched": t.fetched, "cpu_computed": t.cpu_computed, "streamed": t.streamed,
        },
        "bandwidth": {
            "host_to_device_bytes_per_s": info.b_p,
            "cpu_expert_bytes_per_s": info.b_h,
            "source": info.bandwidth_source,
            "bytes_moved": t.bytes_moved,
            "fetch_wait_seconds": t.fetch_wait_s,
            "decode_weight_bytes": s.decode_weight_bytes,
            "decode_weight_bytes_per_s": ratio(s.decode_weight_bytes as f64, s.decode_s),
        },
        "kv": {"pool_bytes": s.kv_pool_bytes, "used_bytes": s.kv_used_bytes, "waiting": s.kv_waiting,
            "pages_used": s.kv_pages_used, "pages_allocated": s.kv_pages_allocated, "pages_max": s.kv_pages_max, "page_rows": s.kv_page_rows},
        "prefix_cache": {
            "enabled": r.index.budget > 0,
            "budget_bytes": r.index.budget, "bytes": r.index.bytes, "device_bytes": r.device_bytes,
            "anchors": r.index.anchors, "hits": r.index.hits, "misses": r.index.misses,
            "evictions": r.index.evictions, "reused_tokens": r.reused_tokens,
            "prompt_tokens": s.prompt_tokens,
            "reused_fraction": ratio(r.reused_tokens as f64, s.prompt_tokens as f64),
        },
    })
}
