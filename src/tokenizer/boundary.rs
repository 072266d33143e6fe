//! Which tokens mark semantic boundaries (end of a message, tool-call and tool-response
//! markers, end of thinking): where agent-aware reuse saves state.

use std::collections::HashSet;

/// Content strings of tokens that mark turn, reasoning or tool-call boundaries in the chat
/// formats of the supported model families. Only those present in a vocabulary are reported.
const BOUNDARY_CANDIDATES: &[&str] = &[
    // ChatML (Qwen) and generic end markers
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    // gpt-oss (harmony)
    "<|start|>",
    "<|end|>",
    "<|message|>",
    "<|channel|>",
    "<|return|>",
    "<|call|>",
    // DeepSeek-V3
    "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>",
    "<｜User｜>",
    "<｜Assistant｜>",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁sep｜>",
    "<｜tool▁outputs▁begin｜>",
    "<｜tool▁outputs▁end｜>",
    "<｜tool▁output▁begin｜>",
    "<｜tool▁output▁end｜>",
    // GLM-4.5
    "<|user|>",
    "<|assistant|>",
    "<|system|>",
    "<|observation|>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
    // Mistral / Mixtral
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "[TOOL_CALLS]",
];

/// A boundary token found in the vocabulary (see [`Tokenizer::boundary_tokens`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoundaryToken {
    /// The token's content string, e.g. `</think>`.
    pub content: String,
    /// Its id in this vocabulary.
    pub id: u32,
    /// Whether it is a special token (dropped by `decode(.., skip_special = true)`).
    pub special: bool,
}

/// The boundary tokens of a vocabulary: the known markers present in it, the EOS token, and
/// every special token the chat template itself writes (role headers, tool wrappers).
pub(super) fn find(
    inner: &tokenizers::Tokenizer,
    eos_content: Option<&str>,
    special_set: &HashSet<u32>,
    chat_templates: &[(String, String)],
) -> Vec<BoundaryToken> {
    let mut boundary: Vec<BoundaryToken> = Vec::new();
    for content in BOUNDARY_CANDIDATES.iter().copied().chain(eos_content) {
        if boundary.iter().any(|b| b.content == content) {
            continue;
        }
        if let Some(id) = inner.token_to_id(content) {
            boundary.push(BoundaryToken { content: content.to_string(), id, special: special_set.contains(&id) });
        }
    }
    let mut added: Vec<(u32, String)> = inner
        .get_added_tokens_decoder()
        .into_iter()
        .filter(|(_, t)| t.special && t.content.chars().count() > 1)
        .map(|(id, t)| (id, t.content))
        .collect();
    added.sort_unstable();
    for (id, content) in added {
        let in_template = chat_templates.iter().any(|(_, src)| src.contains(content.as_str()));
        if in_template && !boundary.iter().any(|b| b.id == id) {
            boundary.push(BoundaryToken { content, id, special: true });
        }
    }
    boundary
}

#[cfg(test)]
mod tests {
    use crate::tokenizer::Tokenizer;
    use serde_json::json;
    use std::path::Path;

    /// A special token the model's chat template writes is a boundary even when its name is
    /// unknown to the engine; one the template never writes is not.
    #[test]
    fn special_tokens_written_by_the_template_are_boundaries() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer");
        let dir = std::env::temp_dir().join(format!("ft-boundary-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for f in ["tokenizer_config.json", "special_tokens_map.json"] {
            std::fs::copy(src.join(f), dir.join(f)).unwrap();
        }
        let mut tj: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(src.join("tokenizer.json")).unwrap()).unwrap();
        for (id, content) in [(1024, "<|turn_end|>"), (1025, "<|unused_marker|>")] {
            let t = json!({"id": id, "content": content, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true});
            tj["added_tokens"].as_array_mut().unwrap().push(t);
        }
        std::fs::write(dir.join("tokenizer.json"), tj.to_string()).unwrap();
        let template = "{%- for m in messages %}{{- m.role + '\\n' + m.content + '<|turn_end|>' }}{%- endfor %}";
        std::fs::write(dir.join("chat_template.jinja"), template).unwrap();
        let tok = Tokenizer::from_dir(&dir).expect("tokenizer");
        let ids = tok.boundary_ids();
        assert!(ids.contains(&1024), "{:?}", tok.boundary_tokens());
        assert!(!ids.contains(&1025), "{:?}", tok.boundary_tokens());
        // The known markers are still found by name.
        assert!(ids.contains(&tok.token_to_id("<|im_end|>").unwrap()));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
