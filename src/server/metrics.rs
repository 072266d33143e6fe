//! Request and token counters, and their Prometheus text form together with the engine's.

use super::generation::Usage;
use super::AppState;
use crate::engine::EngineStats;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Server-side counters.
#[derive(Default)]
pub struct Metrics {
    /// `(route, status) → count`; routes are normalised so ids do not blow up the map.
    requests: Mutex<BTreeMap<(&'static str, u16), u64>>,
    generations: AtomicU64,
    prompt_tokens: AtomicU64,
    cached_tokens: AtomicU64,
    completion_tokens: AtomicU64,
}

/// The known routes (anything else is counted as `other`).
const ROUTES: &[&str] = &[
    "/health", "/metrics", "/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/responses",
    "/v1/messages", "/v1/messages/count_tokens", "/v1/cache/status", "/v1/cache/resize", "/v1/stats", "/",
];

fn route_label(path: &str) -> &'static str {
    if let Some(r) = ROUTES.iter().find(|r| **r == path) {
        return r;
    }
    if path.starts_with("/v1/responses/") {
        "/v1/responses/{id}"
    } else if path.starts_with("/v1/models/") {
        "/v1/models/{id}"
    } else {
        "other"
    }
}

impl Metrics {
    /// Counts one finished generation.
    pub fn record_generation(&self, u: &Usage) {
        self.generations.fetch_add(1, Ordering::Relaxed);
        self.prompt_tokens.fetch_add(u.prompt as u64, Ordering::Relaxed);
        self.cached_tokens.fetch_add(u.cached as u64, Ordering::Relaxed);
        self.completion_tokens.fetch_add(u.completion as u64, Ordering::Relaxed);
    }

    fn record_request(&self, route: &'static str, status: u16) {
        let mut m = self.requests.lock().unwrap_or_else(|p| p.into_inner());
        *m.entry((route, status)).or_default() += 1;
    }

    /// Requests answered with `status` on `route` so far.
    pub fn requests(&self, route: &str, status: u16) -> u64 {
        let m = self.requests.lock().unwrap_or_else(|p| p.into_inner());
        m.iter().filter(|((r, s), _)| *r == route && *s == status).map(|(_, n)| *n).sum()
    }

    /// Prometheus text for the server counters and `stats` from the engine.
    pub fn render(&self, stats: Option<&EngineStats>) -> String {
        let mut out = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, lines: Vec<(String, f64)>| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (labels, v) in lines {
                let _ = writeln!(out, "{name}{labels} {v}");
            }
        };
        let plain = |v: f64| vec![(String::new(), v)];
        let reqs: Vec<(String, f64)> = {
            let m = self.requests.lock().unwrap_or_else(|p| p.into_inner());
            m.iter().map(|((r, s), n)| (format!("{{route=\"{r}\",status=\"{s}\"}}"), *n as f64)).collect()
        };
        metric("ft_http_requests_total", "counter", "HTTP requests by route and status.", reqs);
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
        metric("ft_generations_total", "counter", "Generations finished.", plain(load(&self.generations)));
        metric("ft_prompt_tokens_total", "counter", "Prompt tokens of finished generations.", plain(load(&self.prompt_tokens)));
        metric(
            "ft_prompt_tokens_reused_total",
            "counter",
            "Prompt tokens whose state was reused instead of prefilled.",
            plain(load(&self.cached_tokens)),
        );
        metric("ft_generated_tokens_total", "counter", "Tokens generated.", plain(load(&self.completion_tokens)));
        let Some(s) = stats else { return out };
        let t = &s.total;
        let tok_s = if s.decode_s > 0.0 { s.decode_tokens as f64 / s.decode_s } else { 0.0 };
        metric("ft_decode_tokens_per_second", "gauge", "Average decode speed (tokens of decode-only steps per second of their time; a step decodes one token per running sequence).", plain(tok_s));
        metric("ft_requests_running", "gauge", "Sequences generating now.", plain(s.active as f64));
        metric("ft_requests_waiting", "gauge", "Requests waiting in the engine queue.", plain(s.queued as f64));
        metric("ft_engine_steps_total", "counter", "Batched forward steps run.", plain(s.steps as f64));
        metric("ft_engine_step_sequences_total", "counter", "Sequences advanced, summed over steps (÷ steps: mean batch size).", plain(s.step_sequences as f64));
        metric("ft_engine_step_tokens_total", "counter", "Tokens run, summed over steps (÷ steps: tokens per step).", plain(s.step_tokens as f64));
        metric("ft_engine_mixed_steps_total", "counter", "Steps that ran prompt chunks beside decodes.", plain(s.mixed_steps as f64));
        metric("ft_engine_max_batch", "gauge", "Most sequences one step advanced.", plain(s.max_batch as f64));
        metric("ft_engine_recomputes_total", "counter", "Sequences recomputed after a batched step they were in failed.", plain(s.recomputes as f64));
        metric("ft_engine_max_step_seconds", "gauge", "Wall time of the longest batched step (a running stream's longest wait for a token while a prompt chunk runs).", plain(s.max_step_s));
        metric("ft_engine_preemptions_total", "counter", "Running sequences preempted (state saved, then rebuilt) because the KV pool was full.", plain(s.preemptions as f64));
        metric("ft_kv_pool_bytes", "gauge", "Bytes of the KV pool the sequences' caches share.", plain(s.kv_pool_bytes as f64));
        metric("ft_kv_used_bytes", "gauge", "Bytes of the KV pool held after the last step.", plain(s.kv_used_bytes as f64));
        metric("ft_kv_pages_used", "gauge", "KV pool pages held by sequences and saved prefixes (a shared page counts once).", plain(s.kv_pages_used as f64));
        metric("ft_kv_pages_free", "gauge", "KV pool pages free: up to the most the pool may grow to.", plain(s.kv_pages_max.saturating_sub(s.kv_pages_used) as f64));
        metric("ft_kv_pages_allocated", "gauge", "KV pool pages its buffers have room for now.", plain(s.kv_pages_allocated as f64));
        metric("ft_kv_waiting_sequences", "gauge", "Sequences waiting for room in the KV pool.", plain(s.kv_waiting as f64));
        metric("ft_expert_cache_slots", "gauge", "Expert cache capacity in slots.", plain(s.cache_slots as f64));
        metric("ft_expert_cache_used_slots", "gauge", "Expert cache slots in use.", plain(s.cache_used as f64));
        metric("ft_expert_cache_hits_total", "counter", "Routed experts found in the cache.", plain(t.hits as f64));
        metric("ft_expert_cache_misses_total", "counter", "Routed experts not in the cache.", plain(t.misses as f64));
        metric("ft_expert_cache_hit_rate", "gauge", "Hits over lookups since the start.", plain(t.hit_rate()));
        metric("ft_expert_fetched_total", "counter", "Cache misses fetched into slots.", plain(t.fetched as f64));
        metric("ft_expert_cpu_computed_total", "counter", "Cache misses computed on the CPU.", plain(t.cpu_computed as f64));
        metric("ft_expert_bytes_moved_total", "counter", "Bytes copied host to device for experts.", plain(t.bytes_moved as f64));
        let r = &s.reuse;
        metric("ft_prefill_tokens_total", "counter", "Prompt tokens run through the model (after reuse).", plain(s.prefill_tokens as f64));
        metric("ft_prefix_cache_budget_bytes", "gauge", "Budget for saved conversation state (prefix reuse).", plain(r.index.budget as f64));
        metric("ft_prefix_cache_device_budget_bytes", "gauge", "Part of that budget kept in device memory.", plain(r.device_budget as f64));
        metric("ft_prefix_cache_bytes", "gauge", "Bytes of saved conversation state.", plain(r.index.bytes as f64));
        metric("ft_prefix_cache_device_bytes", "gauge", "Bytes of saved state in device memory.", plain(r.device_bytes as f64));
        metric("ft_prefix_cache_anchors", "gauge", "Saved anchors (restore points).", plain(r.index.anchors as f64));
        metric("ft_prefix_cache_hits_total", "counter", "Prompts that resumed from saved state.", plain(r.index.hits as f64));
        metric("ft_prefix_cache_misses_total", "counter", "Prompts with no saved state to resume.", plain(r.index.misses as f64));
        metric("ft_prefix_cache_evictions_total", "counter", "Anchors evicted under the budget.", plain(r.index.evictions as f64));
        metric(
            "ft_actor_overhead_ratio",
            "gauge",
            "Share of decode time spent in actor messaging.",
            plain(s.actor_overhead_fraction()),
        );
        out
    }
}

/// Middleware counting every request by route and status.
pub async fn count_requests(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let route = route_label(req.uri().path());
    let resp = next.run(req).await;
    state.metrics.record_request(route, resp.status().as_u16());
    resp
}
