//! Other architectures answer a factual question: qwen2 (Qwen2.5-Coder-0.5B,
//! q/k/v biases, Q5_0/Q6_K/Q4_K/Q8_0) through its chat template, and Gemma 3
//! 270M (a base model: q/k norm, GELU, sliding-window layers) by completion.

mod common;

use fish_core::chat::{ChatMessage, ChatTemplate, RenderOptions};
use fish_core::generate::{generate, Flow, GenerateOptions};
use fish_core::model::Model;
use fish_core::sampling::SamplerConfig;
use fish_core::session::Session;
use fish_core::tokenizer::{EncodeOptions, Tokenizer};

fn answer(
    path: &std::path::Path,
    prompt_text: impl FnOnce(&Model, &Tokenizer) -> String,
    n: usize,
) -> String {
    let model = Model::load(path).expect("load");
    let tok = Tokenizer::from_gguf(&model.gguf).expect("tokenizer");
    let prompt = tok.encode(&prompt_text(&model, &tok), EncodeOptions::PROMPT);
    let mut session = Session::new(&model, 512, 2).expect("session");
    let opts = GenerateOptions {
        n_predict: n,
        sampler: SamplerConfig::greedy(),
    };
    let mut out = Vec::new();
    generate(
        &mut session,
        &prompt,
        &opts,
        |t| tok.is_eog(t),
        |t| {
            out.push(t);
            Flow::Continue
        },
    )
    .expect("generate");
    tok.decode(&out).expect("decode")
}

#[test]
fn qwen2_answers_paris() {
    let Some(path) = common::optional_model("qwen05", "qwen2.5-coder-0.5b-instruct.gguf") else {
        return;
    };
    let text = answer(
        &path,
        |m, tok| {
            let t = ChatTemplate::from_gguf(&m.gguf, tok).expect("template");
            let msgs = [ChatMessage::new(
                "user",
                "What is the capital of France? Answer in one word.",
            )];
            t.render(
                &msgs,
                RenderOptions {
                    add_generation_prompt: true,
                },
            )
            .expect("render")
        },
        8,
    );
    assert!(text.contains("Paris"), "{text:?}");
}

#[test]
fn gemma3_answers_paris() {
    let Some(path) = common::optional_model("gemma3", "gemma-3-270m-q4_k_m.gguf") else {
        return;
    };
    let text = answer(
        &path,
        |_, _| "Question: What is the capital of France?\nAnswer:".to_owned(),
        6,
    );
    assert!(text.contains("Paris"), "{text:?}");
}
