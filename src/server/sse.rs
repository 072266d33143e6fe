//! Server-sent events: framing, and the loop that turns a [`Run`] into a response body.

use super::generation::{Outcome, Run, Step};
use super::parsers::Parsed;
use super::ApiError;
use axum::body::Body;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use std::convert::Infallible;

/// One event with a name (Anthropic and Responses streams name every event).
pub fn named(event: &str, data: &serde_json::Value) -> String {
    format!("event: {event}\ndata: {data}\n\n")
}

/// One unnamed event (OpenAI chat and completions streams).
pub fn data(data: &serde_json::Value) -> String {
    format!("data: {data}\n\n")
}

/// How one API writes a run as events.
pub trait Encoder: Send + 'static {
    /// Events before any output.
    fn start(&mut self) -> String;
    /// Events for new output.
    fn output(&mut self, items: Vec<Parsed>) -> String;
    /// Events that end the stream.
    fn done(&mut self, outcome: Outcome) -> String;
    /// Events for a failure after the stream started (it ends after them).
    fn failed(&mut self, err: ApiError) -> String;
    /// Log-probabilities of the tokens behind the next output (streams that report them
    /// attach them to their next chunk).
    fn logprobs(&mut self, entries: Vec<super::generation::LogprobEntry>) {
        let _ = entries;
    }
    /// A keep-alive while nothing happens (an SSE comment unless the API has a ping).
    fn idle(&mut self) -> String {
        ": keep-alive\n\n".into()
    }
}

/// Streams `run` through `enc`. When the client disconnects, the body is dropped, which
/// drops the run and cancels the generation.
pub fn response<E: Encoder>(run: Run, enc: E) -> Response {
    // One choice: its encoder's own end closes the stream.
    response_many(vec![run], vec![enc], |_| String::new())
}

/// Streams several runs (the choices of one request), each through its own encoder, their
/// events interleaved as they come; after the last one ends, `end` writes the closing events
/// from every outcome (in choice order). A failure ends the whole stream: dropping the other
/// runs cancels them, as a disconnect does.
pub fn response_many<E: Encoder>(runs: Vec<Run>, encs: Vec<E>, end: impl FnOnce(Vec<Outcome>) -> String + Send + 'static) -> Response {
    use futures_util::StreamExt;
    let steps = futures_util::stream::select_all(runs.into_iter().enumerate().map(|(i, run)| {
        futures_util::stream::unfold(Some(run), move |run| async move {
            let mut run = run?;
            let step = run.next().await?;
            let lp = run.take_logprobs();
            let last = matches!(step, Step::Done(_) | Step::Failed(_));
            Some(((i, step, lp), (!last).then_some(run)))
        })
        .boxed()
    }));
    let outcomes = encs.iter().map(|_| None).collect();
    let many = Many { steps, encs, outcomes, end: Some(end), started: false, over: false };
    let stream = futures_util::stream::unfold(many, |mut d| async move {
        if d.over {
            return None;
        }
        if !d.started {
            d.started = true;
            let s: String = d.encs.iter_mut().map(|e| e.start()).collect();
            return Some((Ok::<_, Infallible>(s), d));
        }
        loop {
            let frame = match d.steps.next().await? {
                (i, Step::Output(items), lp) => {
                    if !lp.is_empty() {
                        d.encs[i].logprobs(lp);
                    }
                    d.encs[i].output(items)
                }
                (i, Step::Idle, _) => d.encs[i].idle(),
                (i, Step::Done(o), _) => {
                    let mut s = d.encs[i].done(o.clone());
                    d.outcomes[i] = Some(o);
                    if d.outcomes.iter().all(Option::is_some) {
                        d.over = true;
                        if let Some(end) = d.end.take() {
                            s.push_str(&end(d.outcomes.iter_mut().filter_map(Option::take).collect()));
                        }
                    }
                    s
                }
                (i, Step::Failed(e), _) => {
                    d.over = true;
                    d.encs[i].failed(e)
                }
            };
            if !frame.is_empty() {
                return Some((Ok(frame), d));
            }
        }
    });
    event_stream(Body::from_stream(stream))
}

/// The choices' steps of [`response_many`], tagged with the choice.
type Steps = futures_util::stream::SelectAll<futures_util::stream::BoxStream<'static, (usize, Step, Vec<super::generation::LogprobEntry>)>>;

struct Many<E, F> {
    steps: Steps,
    encs: Vec<E>,
    outcomes: Vec<Option<Outcome>>,
    end: Option<F>,
    started: bool,
    over: bool,
}

/// A `200 text/event-stream` response around `body`.
fn event_stream(body: Body) -> Response {
    let mut resp = Response::new(body);
    *resp.status_mut() = StatusCode::OK;
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream; charset=utf-8"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    // Reverse proxies (nginx) would otherwise buffer the stream.
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    resp
}
