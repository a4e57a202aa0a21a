//! Every weight type against llama.cpp: the default model is re-quantised
//! with `fish-cli quantize`, the result must be the very bytes llama.cpp
//! decoded (same sha256), and fish's greedy tokens on it must be llama.cpp's.
//! The expected data and how they were made: crates/fish-core/tests/data/formats/.

use std::path::{Path, PathBuf};
use std::process::Command;

use fish_core::model::{LogitsFor, Model};
use fish_core::sampling::argmax;
use fish_core::session::Session;
use sha2::{Digest, Sha256};

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn default_model() -> PathBuf {
    let p = repo_root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        p.exists(),
        "{} is missing: run scripts/fetch-model.sh",
        p.display()
    );
    p
}

fn reference(ty: &str) -> serde_json::Value {
    let p = repo_root().join(format!("crates/fish-core/tests/data/formats/{ty}.json"));
    serde_json::from_slice(&std::fs::read(&p).expect("reference file")).expect("reference json")
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("id array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

fn sha256_hex(path: &Path) -> String {
    let bytes = std::fs::read(path).expect("read quantised model");
    Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn quantize(ty: &str, out: &Path) {
    let run = Command::new(env!("CARGO_BIN_EXE_fish-cli"))
        .arg("quantize")
        .arg(default_model())
        .arg(out)
        .arg(ty)
        .output()
        .expect("run fish-cli");
    assert!(
        run.status.success(),
        "fish-cli quantize {ty}: {}",
        String::from_utf8_lossy(&run.stderr)
    );
}

/// `n` greedy tokens; llama.cpp's list ends at its first end-of-generation
/// token, so generating as many tokens as it lists compares the stop too.
fn greedy(session: &mut Session<'_>, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut logits = session.set_prompt(prompt).expect("prompt");
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let t = argmax(&logits);
        out.push(t);
        if out.len() < n {
            logits = session.eval(&[t], LogitsFor::Last).expect("decode");
        }
    }
    out
}

fn check_format(ty: &str) {
    let r = reference(ty);
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join(format!("{ty}.gguf"));
    quantize(ty, &path);
    assert_eq!(
        sha256_hex(&path),
        r["sha256"].as_str().expect("sha256"),
        "fish-cli quantize {ty} wrote other bytes than llama.cpp decoded"
    );

    let model = Model::load(&path).expect("load");
    let mut mismatches = Vec::new();
    for (name, case) in r["cases"].as_object().expect("cases") {
        let prompt = ids(&case["prompt_token_ids"]);
        let expected = ids(&case["greedy_token_ids"]);
        // A fresh session per case: the whole prompt goes through one batch,
        // as in llama.cpp's single decode of it.
        let mut session = Session::new(&model, 256, 2).expect("session");
        let got = greedy(&mut session, &prompt, expected.len());
        if got != expected {
            mismatches.push(format!(
                "{ty} {name}:\n  llama.cpp {expected:?}\n  fish      {got:?}"
            ));
        }
    }
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
}

macro_rules! format_tests {
    ($($(#[$attr:meta])* $name:ident: $ty:literal,)*) => {
        $(
            #[test]
            $(#[$attr])*
            fn $name() {
                check_format($ty);
            }
        )*

        #[test]
        fn every_reference_file_has_a_test() {
            let tested = [$($ty),*];
            let dir = repo_root().join("crates/fish-core/tests/data/formats");
            for entry in std::fs::read_dir(dir).expect("formats folder") {
                let path = entry.expect("entry").path();
                if path.extension().is_some_and(|e| e == "json") {
                    let stem = path.file_stem().and_then(|s| s.to_str()).expect("name");
                    assert!(tested.contains(&stem), "{} has no test", path.display());
                }
            }
        }
    };
}

format_tests! {
    f32_matches_llama_cpp: "f32",
    f16_matches_llama_cpp: "f16",
    bf16_matches_llama_cpp: "bf16",
    q4_0_matches_llama_cpp: "q4_0",
    q4_1_matches_llama_cpp: "q4_1",
    q5_0_matches_llama_cpp: "q5_0",
    q5_1_matches_llama_cpp: "q5_1",
    q8_0_matches_llama_cpp: "q8_0",
    q2_k_matches_llama_cpp: "q2_k",
    q3_k_matches_llama_cpp: "q3_k",
    q4_k_matches_llama_cpp: "q4_k",
    q5_k_matches_llama_cpp: "q5_k",
    q6_k_matches_llama_cpp: "q6_k",
    q4_k_m_matches_llama_cpp: "q4_k_m",
}
