//! Token ids against independent reference tokenizers (Hugging Face
//! `tokenizers` for byte-level BPE, `sentencepiece` for Gemma), built from each
//! model's own vocabulary by data/tokenizer/make_expected.py, and round trips.

mod common;
#[path = "data/tokenizer/support.rs"]
mod support;

use std::path::Path;

use fish_core::tokenizer::{EncodeOptions, Tokenizer};

/// Checks every case of one expected-ids file; returns how many were checked.
fn check_cases(model: &Path, expected_file: &str) -> usize {
    let doc = support::read_json(&support::data_dir().join(expected_file));
    let file_name = model
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    assert_eq!(
        doc["model_file"].as_str(),
        Some(file_name),
        "{expected_file} is for another model"
    );
    let (_, tok) = support::open(model);
    let cases = doc["cases"].as_array().expect("cases");
    let mut failures = Vec::new();
    for case in cases {
        let text = case["text"].as_str().expect("text");
        let opts = EncodeOptions {
            add_special: case["add_special"].as_bool().expect("add_special"),
            parse_special: case["parse_special"].as_bool().expect("parse_special"),
        };
        let expected = support::ids_of(&case["ids"]);
        let got = tok.encode(text, opts);
        if got != expected {
            failures.push(format!(
                "{text:?}\n   got      {got:?}\n   expected {expected:?}"
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{expected_file}: {} of {} cases differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    cases.len()
}

/// Plain texts decode back to themselves.
fn check_round_trips(tok: &Tokenizer) {
    let doc = support::read_json(&support::data_dir().join("smollm2.json"));
    let mut texts: Vec<String> = doc["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .filter(|c| c["parse_special"] == false)
        .map(|c| c["text"].as_str().expect("text").to_string())
        .collect();
    texts.push("<|im_start|> written as plain text".into());
    texts.push("\u{1F1EB}\u{1F1F7} flags, \u{FEFF}BOM, \u{10FFFF} last code point".into());
    texts.push("x".repeat(5000));
    for text in &texts {
        let ids = tok.encode(text, EncodeOptions::PLAIN);
        assert_eq!(&tok.decode(&ids).expect("ids in range"), text);
        // The streaming decoder gives the same text token by token.
        let mut stream = tok.stream();
        let mut streamed = String::new();
        for &id in &ids {
            streamed.push_str(&stream.push(id).expect("id in range"));
        }
        streamed.push_str(&stream.finish());
        assert_eq!(&streamed, text);
    }
}

#[test]
fn smollm2_matches_reference_tokenizer() {
    let path = support::smollm2_path();
    assert!(check_cases(&path, "smollm2.json") > 20);
    check_round_trips(&support::open(&path).1);
}

#[test]
fn qwen2_matches_reference_tokenizer() {
    let Some(path) = common::optional_model("qwen05", "qwen2.5-coder-0.5b-instruct.gguf") else {
        return;
    };
    assert!(check_cases(&path, "qwen2.json") > 20);
    let (_, tok) = support::open(&path);
    check_round_trips(&tok);
    for text in [
        "<|im_end|>",
        "<|endoftext|>",
        "<|fim_pad|>",
        "<|repo_name|>",
        "<|file_sep|>",
    ] {
        let id = tok.token_id(text).expect("Qwen has this token");
        assert!(tok.is_eog(id), "{text} ends generation");
    }
    assert!(!tok.is_eog(tok.token_id("<|im_start|>").expect("token")));
}

#[test]
fn gemma3_matches_reference_tokenizer() {
    let Some(path) = common::optional_model("gemma3", "gemma-3-270m-q4_k_m.gguf") else {
        return;
    };
    assert!(check_cases(&path, "gemma3.json") > 20);
    let (_, tok) = support::open(&path);
    check_round_trips(&tok);
    assert!(tok.adds_bos());
    assert_eq!(tok.encode("", EncodeOptions::PROMPT), [2]);
    let end_of_turn = tok.token_id("<end_of_turn>").expect("token");
    assert!(tok.is_eog(end_of_turn) && tok.is_eog(1));
    // A character missing from the vocabulary falls back to byte tokens.
    let ids = tok.encode("\u{10FFFF}", EncodeOptions::PLAIN);
    assert_eq!(ids.len(), 4, "{ids:?}");
    assert!(ids
        .iter()
        .all(|&id| tok.token_text(id).is_some_and(|t| t.starts_with("<0x"))));
}
