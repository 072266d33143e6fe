//! Driving a model for one request: prefill, sampled decode, stop conditions and
//! incremental detokenisation.

use crate::kv::SequenceState;
use crate::model::{Logits, Model, ModelError};
use crate::sampling::{Sampler, SamplingError, SamplingParams, StopChecker};
use crate::tokenizer::{Tokenizer, TokenizerError};
use std::time::{Duration, Instant};

/// Why a generation failed.
#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    /// The prompt does not fit the context.
    #[error("prompt has {prompt} tokens but the context holds {context}; shorten the prompt or raise --ctx-size (the model supports {max})")]
    PromptTooLong { prompt: usize, context: usize, max: usize },
    /// Empty prompt.
    #[error("the prompt is empty")]
    EmptyPrompt,
    /// Bad sampling parameters.
    #[error(transparent)]
    Sampling(#[from] SamplingError),
    /// Model failure.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// Detokenisation failure.
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
}

/// What to generate.
#[derive(Clone, Debug)]
pub struct GenerateRequest {
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Most new tokens.
    pub max_tokens: usize,
    /// Sampling.
    pub sampling: SamplingParams,
    /// Ids that end generation (not emitted as text).
    pub eos_ids: Vec<u32>,
    /// Strings that end generation (not emitted).
    pub stop: Vec<String>,
    /// Context length (tokens of state allocated at most).
    pub context: usize,
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-sequence id.
    Eos,
    /// A stop string.
    StopString,
    /// `max_tokens` or the context was reached.
    Length,
}

/// The result of a generation.
#[derive(Clone, Debug)]
pub struct GenerateOutput {
    /// New token ids (including a final eos id, if one ended it).
    pub ids: Vec<u32>,
    /// Text emitted (without stop strings or eos).
    pub text: String,
    /// Why it ended.
    pub finish: FinishReason,
    /// Time to process the prompt.
    pub prefill_time: Duration,
    /// Time spent producing the tokens after the first.
    pub decode_time: Duration,
}

/// Runs `req` on `model`, calling `on_text` with each piece of text as it completes
/// (when a tokenizer is given).
pub fn generate(
    model: &Model,
    tokenizer: Option<&Tokenizer>,
    req: &GenerateRequest,
    on_text: &mut dyn FnMut(&str),
) -> Result<GenerateOutput, GenerateError> {
    if req.prompt.is_empty() {
        return Err(GenerateError::EmptyPrompt);
    }
    if req.prompt.len() >= req.context {
        return Err(GenerateError::PromptTooLong {
            prompt: req.prompt.len(),
            context: req.context,
            max: model.config().max_position_embeddings,
        });
    }
    let mut sampler = Sampler::new(req.sampling.clone())?;
    let budget = req.max_tokens.min(req.context - req.prompt.len());
    let mut state = SequenceState::new(model, req.prompt.len() + budget)?;
    let mut stops = StopChecker::new(req.stop.iter().cloned());
    let mut decoder = tokenizer.map(|t| t.stream_decoder(true));
    let mut history = req.prompt.clone();
    let mut out = GenerateOutput {
        ids: vec![],
        text: String::new(),
        finish: FinishReason::Length,
        prefill_time: Duration::ZERO,
        decode_time: Duration::ZERO,
    };
    let start = Instant::now();
    let mut logits = model.forward(&mut state, &req.prompt, Logits::Last)?;
    out.prefill_time = start.elapsed();
    let decode_start = Instant::now();
    let mut emit = |s: &str, out: &mut GenerateOutput| {
        if !s.is_empty() {
            out.text.push_str(s);
            on_text(s);
        }
    };
    for i in 0..budget {
        let next = sampler.sample(&logits, &history);
        out.ids.push(next);
        history.push(next);
        if req.eos_ids.contains(&next) {
            out.finish = FinishReason::Eos;
            break;
        }
        if let (Some(dec), Some(tok)) = (decoder.as_mut(), tokenizer) {
            if let Some(piece) = dec.step(tok, next)? {
                let s = stops.push(&piece);
                emit(&s.text, &mut out);
                if s.stopped {
                    out.finish = FinishReason::StopString;
                    break;
                }
            }
        }
        if i + 1 < budget {
            logits = model.forward(&mut state, &[next], Logits::Last)?;
        }
    }
    if out.finish != FinishReason::StopString {
        if let (Some(dec), Some(tok)) = (decoder.as_mut(), tokenizer) {
            if let Some(piece) = dec.flush(tok)? {
                let s = stops.push(&piece);
                emit(&s.text, &mut out);
                if s.stopped {
                    out.finish = FinishReason::StopString;
                }
            }
        }
        if out.finish != FinishReason::StopString {
            let rest = stops.flush();
            emit(&rest, &mut out);
        }
    }
    out.decode_time = decode_start.elapsed();
    Ok(out)
}
