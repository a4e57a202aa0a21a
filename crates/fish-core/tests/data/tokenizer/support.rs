//! Helpers shared by the tokenizer tests (included with `#[path]`).
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use fish_core::tokenizer::Tokenizer;
use fish_gguf::Gguf;

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/tokenizer")
}

/// The default model is required: its absence is a failure, not a skip.
pub fn smollm2_path() -> PathBuf {
    let p = repo_root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        p.exists(),
        "{} is missing: run scripts/fetch-model.sh",
        p.display()
    );
    p
}

/// An optional model: `Some(path)` when fetched; when absent, a failure if
/// FISH_TEST_MODELS names `key`, otherwise `None` with a skip message.
pub fn optional_model(key: &str, file: &str) -> Option<PathBuf> {
    let p = repo_root().join("models").join(file);
    if p.exists() {
        return Some(p);
    }
    let wanted = std::env::var("FISH_TEST_MODELS").unwrap_or_default();
    assert!(
        !wanted.split_whitespace().any(|m| m == key),
        "FISH_TEST_MODELS names {key} but {} is missing: run scripts/fetch-model.sh {key}",
        p.display()
    );
    eprintln!(
        "skipping: {} not fetched (scripts/fetch-model.sh {key}; FISH_TEST_MODELS={key} makes this a failure)",
        p.display()
    );
    None
}

pub fn open(path: &Path) -> (Gguf, Tokenizer) {
    let g = Gguf::open(path).expect("model opens");
    let t = Tokenizer::from_gguf(&g).expect("tokenizer builds");
    (g, t)
}

pub fn read_json(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("bad JSON in {}: {e}", path.display()))
}

pub fn ids_of(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("an array of ids")
        .iter()
        .map(|x| x.as_u64().expect("an id") as u32)
        .collect()
}
