//! Helpers shared by the tokenizer tests (included with `#[path]`).
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use fish_core::tokenizer::Tokenizer;
use fish_gguf::Gguf;

pub fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/tokenizer")
}

/// The default model is required: its absence is a failure, not a skip.
pub fn smollm2_path() -> PathBuf {
    crate::common::default_model()
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
