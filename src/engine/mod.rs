//! The engine: a graph of actors on tokio that runs generations, and the handle an
//! application (or `ft-actor serve`) uses to talk to it.
//!
//! [`Engine::spawn`] loads the model, measures (or recalls) the bandwidths, plans device
//! memory and spawns the actors — inside the caller's tokio runtime and, if given, under the
//! caller's ractor supervisor. The returned [`EngineHandle`] is cheap to clone.

mod api;
mod driver;
pub mod memory;
mod start;

pub use api::*;

use crate::tokenizer::Tokenizer;
use driver::{EngineMsg, SeqId};
use ractor::{ActorRef, RpcReplyPort};
use std::sync::Arc;
use tokio::sync::mpsc;

/// Starts engines.
pub struct Engine;

impl Engine {
    /// Loads the model and spawns the actor graph in the current tokio runtime. With a
    /// `supervisor`, the engine's root actor is linked to it (its failure is reported there).
    pub async fn spawn(config: EngineConfig, supervisor: Option<ractor::ActorCell>) -> Result<EngineHandle, EngineError> {
        start::spawn(config, supervisor, Box::new(|_, _| {})).await
    }

    /// [`Engine::spawn`] reporting model loading as `progress(tensors_done, tensors_total)`.
    pub async fn spawn_with_progress(
        config: EngineConfig,
        supervisor: Option<ractor::ActorCell>,
        progress: Box<dyn FnMut(usize, usize) + Send>,
    ) -> Result<EngineHandle, EngineError> {
        start::spawn(config, supervisor, progress).await
    }
}

/// A handle to a running engine. Clones share the engine.
#[derive(Clone)]
pub struct EngineHandle {
    driver: ActorRef<EngineMsg>,
    info: Arc<EngineInfo>,
    tokenizer: Option<Arc<Tokenizer>>,
    faults: Arc<crate::actors::faults::FaultInjector>,
    /// The token trie for constrained decoding, built on first use.
    grammar: Arc<std::sync::OnceLock<Result<Arc<GrammarEnv>, GrammarError>>>,
}

use crate::sampling::grammar::{Constraint, GrammarEnv, GrammarError, GrammarSpec};

/// Tokens of one generation as they are produced. Dropping it cancels the generation.
pub struct GenerationStream {
    id: SeqId,
    rx: mpsc::UnboundedReceiver<GenEvent>,
    driver: ActorRef<EngineMsg>,
    finished: bool,
}

impl GenerationStream {
    /// The next event; `None` after `Done`/`Error`.
    pub async fn next(&mut self) -> Option<GenEvent> {
        let ev = self.rx.recv().await;
        if matches!(ev, None | Some(GenEvent::Done(_)) | Some(GenEvent::Error(_))) {
            self.finished = true;
        }
        ev
    }

    /// Stops the generation now (also what dropping the stream does).
    pub fn cancel(&mut self) {
        if !self.finished {
            self.finished = true;
            let _ = self.driver.cast(EngineMsg::Cancel { seq: self.id });
        }
    }

    /// Collects the whole generation: `(ids, text, completion)`.
    pub async fn collect(mut self) -> Result<(Vec<u32>, String, Completion), EngineError> {
        let (mut ids, mut text) = (vec![], String::new());
        while let Some(ev) = self.next().await {
            match ev {
                GenEvent::Token { id, text: t, .. } => {
                    ids.push(id);
                    text.push_str(&t);
                }
                GenEvent::Done(c) => return Ok((ids, text, c)),
                GenEvent::Error(e) => return Err(e),
            }
        }
        Err(EngineError::Stopped)
    }
}

impl Drop for GenerationStream {
    fn drop(&mut self) {
        self.cancel();
    }
}

async fn ask<T: Send + 'static>(
    driver: &ActorRef<EngineMsg>,
    msg: impl FnOnce(RpcReplyPort<T>) -> EngineMsg,
) -> Result<T, EngineError> {
    driver.call(msg, None).await.map_err(|_| EngineError::Stopped)?.success_or(EngineError::Stopped)
}

impl EngineHandle {
    /// Facts about the engine (model, context, bandwidths, memory plan).
    pub fn info(&self) -> &EngineInfo {
        &self.info
    }

    /// The model's tokenizer, if the checkpoint has one.
    pub fn tokenizer(&self) -> Option<&Arc<Tokenizer>> {
        self.tokenizer.as_ref()
    }

    /// Starts a generation; tokens arrive on the returned stream.
    pub async fn generate(&self, req: EngineRequest) -> Result<GenerationStream, EngineError> {
        let (tx, rx) = mpsc::unbounded_channel();
        let id = ask(&self.driver, |reply| EngineMsg::Submit { req: Box::new(req), events: tx, reply }).await??;
        Ok(GenerationStream { id, rx, driver: self.driver.clone(), finished: false })
    }

    /// Full-sequence logits `[prompt.len(), vocab]` of a prompt, through the pipeline.
    pub async fn logits(&self, prompt: Vec<u32>) -> Result<Vec<f32>, EngineError> {
        ask(&self.driver, |reply| EngineMsg::Logits { prompt, reply }).await?
    }

    /// Changes the expert cache capacity at the next step boundary; returns the new capacity.
    pub async fn resize_cache(&self, slots: u64) -> Result<u64, EngineError> {
        ask(&self.driver, |reply| EngineMsg::Resize { slots, reply }).await?
    }

    /// Arms faults in the expert pipeline (failing copies, kernels, allocations): for tests
    /// and `serve --fault-injection`, to check that a fault fails only its own request.
    pub fn inject_faults(&self, counts: crate::actors::faults::FaultCounts) {
        self.faults.arm(counts);
    }

    /// A matcher for `spec` over this model's tokenizer, for [`EngineRequest::constraint`].
    /// The first call builds the token trie (off the async runtime).
    pub async fn compile_grammar(&self, spec: GrammarSpec) -> Result<Constraint, EngineError> {
        let (cell, tok, info) = (self.grammar.clone(), self.tokenizer.clone(), self.info.clone());
        let job = move || {
            let env = cell.get_or_init(|| {
                let tok = tok.ok_or_else(|| GrammarError("constrained decoding needs the model's tokenizer".into()))?;
                let eos = tok.eos_token_id().or(info.eos_ids.first().copied()).ok_or_else(|| GrammarError("the model has no end-of-sequence id".into()))?;
                GrammarEnv::new(tok.token_bytes(), info.config.vocab_size, eos).map(Arc::new)
            });
            env.as_ref().map_err(|e| EngineError::Internal(e.to_string()))?.compile(&spec).map_err(|e| EngineError::InvalidRequest(e.to_string()))
        };
        tokio::task::spawn_blocking(job).await.map_err(|e| EngineError::Internal(e.to_string()))?
    }

    /// Disarms every fault not yet fired.
    pub fn clear_faults(&self) {
        self.faults.clear();
    }

    /// Faults armed and not yet fired.
    pub fn pending_faults(&self) -> crate::actors::faults::FaultCounts {
        self.faults.pending()
    }

    /// Current counters.
    pub async fn stats(&self) -> Result<EngineStats, EngineError> {
        ask(&self.driver, |reply| EngineMsg::Stats { reply }).await?
    }

    /// Resets the per-layer counters (e.g. between benchmark phases).
    pub async fn reset_stats(&self) -> Result<(), EngineError> {
        ask(&self.driver, |reply| EngineMsg::ResetStats { reply }).await
    }

    /// Stops the engine and all its actors.
    pub async fn shutdown(&self) {
        self.driver.stop(Some("shutdown".into()));
    }
}
