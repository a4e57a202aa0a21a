//! Shared helpers for fish-core's integration tests.
#![allow(dead_code)]

use std::path::PathBuf;

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The default model; scripts/test.sh fetches it, so its absence is a failure.
pub fn default_model() -> PathBuf {
    let p = repo_root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        p.exists(),
        "{} is missing: run scripts/fetch-model.sh",
        p.display()
    );
    p
}

/// An optional test model: present -> Some; absent and named in
/// FISH_TEST_MODELS -> test failure; absent and not named -> None (skip).
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
        "skipping: {} not fetched (scripts/fetch-model.sh {key})",
        p.display()
    );
    None
}

pub fn reference_json(name: &str) -> serde_json::Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/reference")
        .join(name);
    serde_json::from_slice(&std::fs::read(&p).expect("reference file")).expect("reference json")
}

pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("id array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}
