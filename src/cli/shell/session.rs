//! The conversation the shell holds, the figures it measures, and how both are saved.

use serde::Serialize;
use serde_json::{json, Value};
use std::time::Duration;

/// Who said a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The person at the terminal.
    User,
    /// The model.
    Assistant,
}

/// One message of the conversation.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Message {
    /// Who said it.
    pub role: Role,
    /// The visible text.
    pub content: String,
    /// The model's thinking before the answer, when it thought.
    #[serde(skip_serializing_if = "Option::is_none", rename = "reasoning_content")]
    pub reasoning: Option<String>,
}

/// A system prompt and the messages after it.
#[derive(Clone, Debug, Default)]
pub struct Conversation {
    /// The system prompt.
    pub system: Option<String>,
    /// User and assistant messages, oldest first.
    pub messages: Vec<Message>,
}

impl Conversation {
    /// The messages in the shape chat templates read (`reasoning_content` as transformers
    /// passes it, so a template that replays thinking renders the tokens the model wrote).
    pub fn template_messages(&self) -> Vec<Value> {
        let mut out = vec![];
        if let Some(s) = &self.system {
            out.push(json!({"role": "system", "content": s}));
        }
        for m in &self.messages {
            let mut v = json!({"role": m.role, "content": m.content});
            if let Some(r) = m.reasoning.as_deref().filter(|r| !r.is_empty()) {
                v["reasoning_content"] = json!(r);
            }
            out.push(v);
        }
        out
    }
}

/// Measured figures of one reply.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ReplyStats {
    /// Prompt tokens (the whole conversation so far).
    pub prompt_tokens: usize,
    /// Of which restored from an earlier turn instead of prefilled.
    pub reused_tokens: usize,
    /// Tokens generated.
    pub generated_tokens: usize,
    /// Of which thinking (with its markers).
    pub thinking_tokens: usize,
    /// Seconds from submitting the prompt to the first token.
    pub time_to_first_token_s: f64,
    /// Seconds from submitting the prompt to the end of the reply.
    pub total_s: f64,
    /// Why the reply ended: stop (end of turn), length, or interrupted.
    pub finish: String,
}

fn rate(tokens: f64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        tokens / seconds
    } else {
        0.0
    }
}

impl ReplyStats {
    /// Figures from the timings and counts of one generation.
    pub fn new(prompt: usize, reused: usize, generated: usize, ttft: Duration, total: Duration, finish: &str) -> Self {
        Self {
            prompt_tokens: prompt,
            reused_tokens: reused.min(prompt),
            generated_tokens: generated,
            thinking_tokens: 0,
            time_to_first_token_s: ttft.as_secs_f64(),
            total_s: total.as_secs_f64(),
            finish: finish.to_string(),
        }
    }

    /// Prompt tokens that went through the model (not restored).
    pub fn prefilled_tokens(&self) -> usize {
        self.prompt_tokens - self.reused_tokens
    }

    /// Seconds spent after the first token.
    pub fn decode_s(&self) -> f64 {
        (self.total_s - self.time_to_first_token_s).max(0.0)
    }

    /// Prefilled tokens per second until the first token.
    pub fn prefill_tok_s(&self) -> f64 {
        rate(self.prefilled_tokens() as f64, self.time_to_first_token_s)
    }

    /// Tokens per second after the first one (which prefill produced).
    pub fn decode_tok_s(&self) -> f64 {
        rate(self.generated_tokens.saturating_sub(1) as f64, self.decode_s())
    }

    /// The figures with the rates, as `/save` writes them.
    pub fn to_json(&self) -> Value {
        let mut v = serde_json::to_value(self).unwrap_or_default();
        v["prefill_tok_s"] = json!(self.prefill_tok_s());
        v["decode_tok_s"] = json!(self.decode_tok_s());
        v
    }
}

/// The sum of every reply of the session.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SessionStats {
    /// Replies generated.
    pub replies: usize,
    /// Prompt tokens over all replies.
    pub prompt_tokens: usize,
    /// Of which restored instead of prefilled.
    pub reused_tokens: usize,
    /// Tokens generated.
    pub generated_tokens: usize,
    /// Seconds to the first token, summed.
    pub prefill_s: f64,
    /// Seconds after the first token, summed.
    pub decode_s: f64,
    /// Tokens generated after each reply's first, summed (what the decode rate divides).
    #[serde(skip)]
    decoded_tokens: usize,
}

impl SessionStats {
    /// Adds one reply.
    pub fn add(&mut self, r: &ReplyStats) {
        self.replies += 1;
        self.prompt_tokens += r.prompt_tokens;
        self.reused_tokens += r.reused_tokens;
        self.generated_tokens += r.generated_tokens;
        self.prefill_s += r.time_to_first_token_s;
        self.decode_s += r.decode_s();
        self.decoded_tokens += r.generated_tokens.saturating_sub(1);
    }

    /// Prefilled tokens per second over the session.
    pub fn prefill_tok_s(&self) -> f64 {
        rate((self.prompt_tokens - self.reused_tokens) as f64, self.prefill_s)
    }

    /// Decoded tokens per second over the session.
    pub fn decode_tok_s(&self) -> f64 {
        rate(self.decoded_tokens as f64, self.decode_s)
    }

    /// Mean time to the first token.
    pub fn mean_ttft_s(&self) -> f64 {
        if self.replies == 0 {
            0.0
        } else {
            self.prefill_s / self.replies as f64
        }
    }

    /// The figures with the rates, as `/save` writes them.
    pub fn to_json(&self) -> Value {
        let mut v = serde_json::to_value(self).unwrap_or_default();
        v["prefill_tok_s"] = json!(self.prefill_tok_s());
        v["decode_tok_s"] = json!(self.decode_tok_s());
        v["mean_time_to_first_token_s"] = json!(self.mean_ttft_s());
        v
    }
}

/// The `/stats` text: the last reply, the session and, when known, the expert cache.
pub fn stats_text(last: Option<&ReplyStats>, session: &SessionStats, expert_hit_rate: Option<f64>) -> String {
    let mut out = String::new();
    match last {
        Some(r) => out.push_str(&format!(
            "last reply: {} prompt tokens ({} reused), {} generated ({} thinking, {}), first token after {:.3} s, \
             prefill {:.1} tok/s, decode {:.1} tok/s\n",
            r.prompt_tokens,
            r.reused_tokens,
            r.generated_tokens,
            r.thinking_tokens,
            r.finish,
            r.time_to_first_token_s,
            r.prefill_tok_s(),
            r.decode_tok_s()
        )),
        None => out.push_str("last reply: none yet\n"),
    }
    out.push_str(&format!(
        "session: {} replies, {} prompt tokens ({} reused), {} generated, mean first token after {:.3} s, \
         prefill {:.1} tok/s, decode {:.1} tok/s",
        session.replies,
        session.prompt_tokens,
        session.reused_tokens,
        session.generated_tokens,
        session.mean_ttft_s(),
        session.prefill_tok_s(),
        session.decode_tok_s()
    ));
    if let Some(h) = expert_hit_rate {
        out.push_str(&format!("\nexpert cache hit rate: {:.1}%", h * 100.0));
    }
    out
}

/// What `/save` writes.
pub fn saved_json(model: &str, conv: &Conversation, last: Option<&ReplyStats>, session: &SessionStats) -> Value {
    json!({
        "model": model,
        "system": conv.system,
        "messages": conv.messages,
        "stats": {
            "last_reply": last.map(ReplyStats::to_json),
            "session": session.to_json(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(prompt: usize, reused: usize, generated: usize, ttft_ms: u64, total_ms: u64) -> ReplyStats {
        ReplyStats::new(prompt, reused, generated, Duration::from_millis(ttft_ms), Duration::from_millis(total_ms), "stop")
    }

    #[test]
    fn rates_come_from_the_measured_times() {
        let r = reply(120, 20, 11, 500, 1500);
        assert_eq!(r.prefilled_tokens(), 100);
        assert!((r.prefill_tok_s() - 200.0).abs() < 1e-9);
        assert!((r.decode_tok_s() - 10.0).abs() < 1e-9);
        let mut s = SessionStats::default();
        s.add(&r);
        s.add(&reply(200, 100, 1, 100, 100));
        assert_eq!((s.replies, s.prompt_tokens, s.reused_tokens, s.generated_tokens), (2, 320, 120, 12));
        assert!((s.prefill_tok_s() - 200.0 / 0.6).abs() < 1e-6);
        assert!((s.decode_tok_s() - 10.0).abs() < 1e-9);
        assert_eq!(reply(5, 0, 0, 0, 0).decode_tok_s(), 0.0);
        let text = stats_text(Some(&r), &s, Some(0.5));
        assert!(text.contains("120 prompt tokens (20 reused), 11 generated (0 thinking, stop)") && text.contains("50.0%"), "{text}");
    }

    #[test]
    fn template_messages_and_save_shape() {
        let conv = Conversation {
            system: Some("Be brief.".into()),
            messages: vec![
                Message { role: Role::User, content: "hi".into(), reasoning: None },
                Message { role: Role::Assistant, content: "hello".into(), reasoning: Some("greet".into()) },
            ],
        };
        let t = conv.template_messages();
        assert_eq!(t.len(), 3);
        assert_eq!(t[0], json!({"role": "system", "content": "Be brief."}));
        assert_eq!(t[2], json!({"role": "assistant", "content": "hello", "reasoning_content": "greet"}));
        let saved = saved_json("demo", &conv, None, &SessionStats::default());
        assert_eq!(saved["system"], "Be brief.");
        assert_eq!(saved["messages"][1]["role"], "assistant");
        assert_eq!(saved["messages"][0].get("reasoning_content"), None);
        assert!(saved["stats"]["last_reply"].is_null());
        assert_eq!(saved["stats"]["session"]["replies"], 0);
    }
}
