//! Chat templates rendered by minijinja against Python jinja2 renderings
//! (data/tokenizer/make_chat_expected.py), and the built-in fallbacks.

mod common;
#[path = "data/tokenizer/support.rs"]
mod support;

use fish_core::chat::{
    ChatMessage, ChatTemplate, ChatTemplateError, RenderOptions, TemplateOrigin, TemplateTokens,
};
use fish_core::tokenizer::EncodeOptions;

fn messages(v: &serde_json::Value) -> Vec<ChatMessage> {
    v.as_array()
        .expect("messages")
        .iter()
        .map(|m| {
            ChatMessage::new(
                m["role"].as_str().expect("role"),
                m["content"].as_str().expect("content"),
            )
        })
        .collect()
}

#[test]
fn templates_render_like_jinja2() {
    let doc = support::read_json(&support::data_dir().join("chat_templates.json"));
    let cases = doc["cases"].as_array().expect("cases");
    let mut templates_seen = std::collections::BTreeSet::new();
    for case in cases {
        let name = case["template"].as_str().expect("template");
        templates_seen.insert(name);
        let source =
            std::fs::read_to_string(support::data_dir().join(name)).expect("template file");
        let tokens = TemplateTokens {
            bos: case["bos_token"].as_str().expect("bos").into(),
            eos: case["eos_token"].as_str().expect("eos").into(),
            ..TemplateTokens::default()
        };
        let template = ChatTemplate::new(&source, tokens).expect("compiles");
        let opts = RenderOptions {
            add_generation_prompt: case["add_generation_prompt"].as_bool().expect("flag"),
        };
        let got = template.render(&messages(&case["messages"]), opts);
        match (case["expected"].as_str(), got) {
            (Some(expected), Ok(text)) => assert_eq!(text, expected, "{name}"),
            (None, Err(ChatTemplateError::Raised(msg))) => {
                assert_eq!(Some(msg.as_str()), case["raises"].as_str(), "{name}")
            }
            (expected, got) => panic!("{name}: expected {expected:?}, got {got:?}"),
        }
    }
    assert_eq!(
        templates_seen.len(),
        3,
        "SmolLM2, Qwen 2.5 and Gemma 3 templates"
    );
}

#[test]
fn gemma3_file_without_template_gets_the_builtin_gemma_turns() {
    let Some(path) = common::optional_model("gemma3", "gemma-3-270m-q4_k_m.gguf") else {
        return;
    };
    let (g, tok) = support::open(&path);
    let template = ChatTemplate::from_gguf(&g, &tok).expect("template");
    assert_eq!(template.origin(), TemplateOrigin::BuiltinGemma);
    let doc = support::read_json(&support::data_dir().join("chat_templates.json"));
    let mut checked = 0;
    for case in doc["cases"].as_array().expect("cases") {
        let (Some(expected), "gemma3_chat_template.jinja") = (
            case["expected"].as_str(),
            case["template"].as_str().expect("template"),
        ) else {
            continue;
        };
        let opts = RenderOptions {
            add_generation_prompt: case["add_generation_prompt"].as_bool().expect("flag"),
        };
        let text = template
            .render(&messages(&case["messages"]), opts)
            .expect("renders");
        // The tokenizer adds BOS itself, so the rendered text leaves it out.
        assert_eq!(Some(text.as_str()), expected.strip_prefix("<bos>"));
        let ids = tok.encode(&text, EncodeOptions::PROMPT);
        assert_eq!(ids[0], 2);
        assert_eq!(
            ids.iter().filter(|&&id| id == 2).count(),
            1,
            "exactly one BOS"
        );
        checked += 1;
    }
    assert!(checked >= 4);
}

#[test]
fn qwen2_template_comes_from_the_model_file() {
    let Some(path) = common::optional_model("qwen05", "qwen2.5-coder-0.5b-instruct.gguf") else {
        return;
    };
    let (g, tok) = support::open(&path);
    let template = ChatTemplate::from_gguf(&g, &tok).expect("template");
    assert_eq!(template.origin(), TemplateOrigin::Model);
    let text = template
        .render(
            &[ChatMessage::new("user", "hi")],
            RenderOptions {
                add_generation_prompt: true,
            },
        )
        .expect("renders");
    assert!(
        text.ends_with("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"),
        "{text}"
    );
    let ids = tok.encode(&text, EncodeOptions::PROMPT);
    assert_eq!(ids[0], tok.token_id("<|im_start|>").expect("token"));
}
