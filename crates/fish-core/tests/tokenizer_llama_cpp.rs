//! SmolLM2's tokenizer and chat template against llama.cpp's own prompt
//! token ids (../shared/reference, recorded with llama.cpp b11312).

mod common;
#[path = "data/tokenizer/support.rs"]
mod support;

use fish_core::chat::{ChatMessage, ChatTemplate, RenderOptions, TemplateOrigin};
use fish_core::tokenizer::{EncodeOptions, PreTokenizerKind, TokenizerModel};

fn reference(name: &str) -> serde_json::Value {
    common::reference_json(name)
}

#[test]
fn raw_prompt_matches_llama_cpp() {
    let r = reference("q4_1_capital_of_france.json");
    let (_, tok) = support::open(&support::smollm2_path());
    assert_eq!(tok.model(), TokenizerModel::ByteLevelBpe);
    assert_eq!(tok.pre_tokenizer(), Some(PreTokenizerKind::StarCoder));
    assert_eq!(
        tok.n_vocab() as u64,
        r["n_vocab"].as_u64().expect("n_vocab")
    );
    let prompt = r["prompt"].as_str().expect("prompt");
    let ids = tok.encode(prompt, EncodeOptions::PROMPT);
    assert_eq!(ids, support::ids_of(&r["prompt_token_ids"]));
    // The recorded pieces are what each token prints as.
    for (id, piece) in ids
        .iter()
        .zip(r["prompt_token_pieces"].as_array().expect("pieces"))
    {
        assert_eq!(
            tok.token_bytes(*id).expect("in range"),
            piece.as_str().expect("piece").as_bytes()
        );
    }
    // And the greedy continuation decodes to llama.cpp's text.
    let text = tok
        .decode(&support::ids_of(&r["greedy_token_ids"]))
        .expect("ids in range");
    assert_eq!(text, r["greedy_text"].as_str().expect("greedy_text"));
}

#[test]
fn chat_prompts_match_llama_cpp() {
    let r = reference("q4_1_chat_capital_of_france.json");
    let (g, tok) = support::open(&support::smollm2_path());
    let template = ChatTemplate::from_gguf(&g, &tok).expect("template compiles");
    assert_eq!(template.origin(), TemplateOrigin::Model);
    let user = r["user_message"].as_str().expect("user_message");
    let cases = r["cases"].as_object().expect("cases");
    assert_eq!(cases.len(), 2);
    for (name, case) in cases {
        let prompt = case["prompt"].as_str().expect("prompt");
        let expected = support::ids_of(&case["prompt_token_ids"]);
        assert_eq!(
            tok.encode(prompt, EncodeOptions::PROMPT),
            expected,
            "case {name}"
        );
        if name.starts_with("embedded_template") {
            let rendered = template
                .render(
                    &[ChatMessage::new("user", user)],
                    RenderOptions {
                        add_generation_prompt: true,
                    },
                )
                .expect("renders");
            assert_eq!(rendered, prompt, "case {name}");
        }
        // Generated text stops at an end-of-generation token; the text before
        // it decodes as llama.cpp printed it.
        let greedy = support::ids_of(&case["greedy_token_ids"]);
        let end = greedy
            .iter()
            .position(|&id| tok.is_eog(id))
            .unwrap_or(greedy.len());
        let shown = case["greedy_text"].as_str().expect("greedy_text");
        let decoded = tok.decode(&greedy[..end]).expect("ids in range");
        assert!(
            shown.starts_with(&decoded),
            "case {name}: {decoded:?} vs {shown:?}"
        );
    }
}

#[test]
fn smollm2_special_roles() {
    let (_, tok) = support::open(&support::smollm2_path());
    assert_eq!(tok.bos(), Some(1));
    assert_eq!(tok.eos(), Some(2));
    assert!(!tok.adds_bos(), "SmolLM2 sets add_bos_token = false");
    for id in [0, 2] {
        assert!(tok.is_eog(id), "{:?} ends generation", tok.token_text(id));
    }
    assert!(!tok.is_eog(1), "<|im_start|> does not end generation");
    assert!(!tok.is_eog(504));
    assert!(!tok.is_eog(u32::MAX));
    // Control tokens print nothing in generated text but keep their text.
    assert_eq!(tok.token_bytes(2), Some(&b""[..]));
    assert_eq!(tok.token_text(2), Some("<|im_end|>"));
}
