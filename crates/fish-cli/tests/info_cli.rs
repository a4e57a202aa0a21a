//! `fish-cli info` end to end: every malformed corpus file is refused with
//! `error: ...` and exit status 1 (never a panic's 101); the default model
//! prints its tensor table, and `--json` parses with the same totals.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value as Json;

const DEFAULT_MODEL: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
const DEFAULT_MODEL_TENSORS: usize = 272;

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn info(args: &[&str], model: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fish-cli"))
        .arg("info")
        .args(args)
        .arg(model)
        .output()
        .expect("fish-cli runs")
}

fn default_model() -> PathBuf {
    let path = repo_root().join("models").join(DEFAULT_MODEL);
    assert!(
        path.exists(),
        "{} is missing: run scripts/fetch-model.sh",
        path.display()
    );
    path
}

#[test]
fn every_malformed_file_exits_with_status_1_and_an_error_line() {
    let dir = repo_root().join("crates/fish-gguf/tests/malformed");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("malformed corpus folder")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "gguf"))
        .collect();
    files.sort();
    assert!(files.len() >= 20, "corpus has only {} files", files.len());
    for file in &files {
        for args in [&[][..], &["--json"][..]] {
            let out = info(args, file);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(
                out.status.code(),
                Some(1),
                "{} {args:?}: status {:?}, stderr: {stderr}",
                file.display(),
                out.status
            );
            assert!(
                stderr.starts_with("error: "),
                "{}: stderr {stderr:?}",
                file.display()
            );
            assert!(
                stderr.contains("byte "),
                "{}: no byte offset in {stderr:?}",
                file.display()
            );
            assert!(
                out.stdout.is_empty(),
                "{}: printed to stdout",
                file.display()
            );
        }
    }
}

#[test]
fn a_missing_file_is_an_error_not_a_panic() {
    let out = info(&[], Path::new("/nonexistent/model.gguf"));
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("error: "));
}

#[test]
fn the_default_model_prints_its_tensor_table() {
    let out = info(&[], &default_model());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "stderr: {stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&format!("tensors ({DEFAULT_MODEL_TENSORS})")),
        "{stdout}"
    );
    assert!(stdout.contains("token_embd.weight"), "{stdout}");
    assert!(stdout.contains("general.architecture"), "{stdout}");
}

#[test]
fn the_default_model_json_has_272_tensors_and_matching_totals() {
    let out = info(&["--json"], &default_model());
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: Json = serde_json::from_slice(&out.stdout).expect("--json prints valid JSON");

    let tensors = json["tensors"].as_array().expect("tensors array");
    assert_eq!(tensors.len(), DEFAULT_MODEL_TENSORS);
    assert_eq!(json["metadata"]["general.architecture"], "llama");

    // Totals per type must agree with the table they summarise.
    let mut from_table: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for t in tensors {
        let ty = t["type"].as_str().expect("type name").to_owned();
        let bytes = t["bytes"].as_u64().expect("bytes");
        let e = from_table.entry(ty).or_default();
        e.0 += 1;
        e.1 += bytes;
    }
    let totals = json["totals"].as_object().expect("totals object");
    assert_eq!(totals.len(), from_table.len());
    for (ty, (count, bytes)) in &from_table {
        assert_eq!(totals[ty]["tensors"].as_u64(), Some(*count), "{ty} count");
        assert_eq!(totals[ty]["bytes"].as_u64(), Some(*bytes), "{ty} bytes");
    }
    // SmolLM2 Q4_1: the matmul weights are Q4_1, norms F32, the tied embedding Q8_0.
    for ty in ["Q4_1", "F32", "Q8_0"] {
        assert!(totals.contains_key(ty), "no {ty} in {totals:?}");
    }
    let all: u64 = from_table.values().map(|(_, b)| b).sum();
    assert!(all > 90_000_000 && all < json["file_bytes"].as_u64().expect("file_bytes"));
}
