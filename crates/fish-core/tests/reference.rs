//! The CPU engine against llama.cpp's outputs for the default model: same
//! greedy tokens, last-position logits within 1% of max |logit|.

mod common;

use fish_core::model::{LogitsFor, Model};
use fish_core::sampling::argmax;
use fish_core::session::Session;

/// Greedy decoding from token ids, stopping after an end token (included, as the reference does).
fn greedy(session: &mut Session<'_>, prompt: &[u32], n: usize, eog: &[u32]) -> Vec<u32> {
    let mut logits = session.set_prompt(prompt).expect("prompt");
    let mut out = Vec::new();
    for _ in 0..n {
        let t = argmax(&logits);
        out.push(t);
        if eog.contains(&t) || out.len() == n {
            break;
        }
        logits = session.eval(&[t], LogitsFor::Last).expect("decode");
    }
    out
}

#[test]
fn raw_prompt_matches_llama_cpp_tokens_and_logits() {
    let model = Model::load(common::default_model()).expect("load");
    let r = common::reference_json("q4_1_capital_of_france.json");
    let prompt = common::ids(&r["prompt_token_ids"]);
    let expected = common::ids(&r["greedy_token_ids"]);
    let mut session = Session::new(&model, 256, 2).expect("session");

    let logits = session.set_prompt(&prompt).expect("prompt");
    let bytes = std::fs::read(
        common::repo_root()
            .join("crates/fish-core/tests/data/reference/q4_1_france_last_logits.f32"),
    )
    .expect("logits file");
    let reference: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_eq!(reference.len(), logits.len());
    let max_abs = reference.iter().fold(0f32, |m, v| m.max(v.abs()));
    let max_diff = reference
        .iter()
        .zip(&logits)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    eprintln!(
        "max |dlogit| {max_diff} (max |logit| {max_abs}, {:.3}%)",
        100.0 * max_diff / max_abs
    );
    assert_eq!(argmax(&logits), 7042, "\" Paris\"");
    let got = greedy(&mut session, &prompt, expected.len(), &[]);
    assert_eq!(got, expected);
    assert!(
        max_diff <= 0.01 * max_abs,
        "logits differ by {max_diff} > 1% of {max_abs}"
    );
}

#[test]
fn chat_prompts_match_llama_cpp_tokens() {
    let model = Model::load(common::default_model()).expect("load");
    let r = common::reference_json("q4_1_chat_capital_of_france.json");
    let mut session = Session::new(&model, 512, 2).expect("session");
    for (name, case) in r["cases"].as_object().expect("cases") {
        let prompt = common::ids(&case["prompt_token_ids"]);
        let expected = common::ids(&case["greedy_token_ids"]);
        // <|im_end|> (2) and <|endoftext|> (0) end generation for SmolLM2.
        let got = greedy(&mut session, &prompt, expected.len(), &[0, 2]);
        assert_eq!(got, expected, "case {name}");
    }
}

#[test]
fn prompt_longer_than_context_is_refused_before_compute() {
    let model = Model::load(common::default_model()).expect("load");
    let mut session = Session::new(&model, 8, 1).expect("session");
    let err = session.set_prompt(&[1; 9]).expect_err("too long");
    assert!(err.to_string().contains("context"), "{err}");
    assert_eq!(session.n_past(), 0);
}

#[test]
fn cached_prefix_gives_the_same_logits_as_a_fresh_run() {
    let model = Model::load(common::default_model()).expect("load");
    let mut a = Session::new(&model, 64, 2).expect("session");
    let mut b = Session::new(&model, 64, 2).expect("session");
    a.set_prompt(&[504, 3575, 282, 4649, 314, 7042])
        .expect("first prompt");
    // Shares 4 tokens with the cached context: only the tail is evaluated.
    let reused = a
        .set_prompt(&[504, 3575, 282, 4649, 260])
        .expect("second prompt");
    let fresh = b.set_prompt(&[504, 3575, 282, 4649, 260]).expect("fresh");
    assert_eq!(reused, fresh);
    assert_eq!(a.tokens(), &[504, 3575, 282, 4649, 260]);
}
