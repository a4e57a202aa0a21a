//! `--requant` and `fish-cli quality` end to end on the GPU (lavapipe in CI,
//! FISH_GPU=cpu): re-quantised weights let more layers fit under the same
//! budget, and the quality tool reports agreement and fails below its bar.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn default_model() -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        p.exists(),
        "{} is missing: run scripts/fetch-model.sh",
        p.display()
    );
    p
}

fn fish(args: &[&str], envs: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fish-cli"))
        .args(args)
        .envs(envs.iter().copied())
        .env_remove("FISH_GPU_REQUANT")
        .output()
        .expect("run fish-cli")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn gpu_required() -> bool {
    std::env::var("FISH_REQUIRE_GPU").is_ok_and(|v| v == "1")
}

/// The `gpu` string of `run --json`, None (skip) without a device unless CI requires one.
fn placement(model: &Path, requant: &str, budget_mb: &str) -> Option<String> {
    let out = fish(
        &[
            "run",
            model.to_str().unwrap(),
            "-p",
            "hello",
            "-n",
            "1",
            "--temp",
            "0",
            "-c",
            "64",
            "--json",
            "--requant",
            requant,
        ],
        &[("FISH_VRAM_BUDGET_MB", budget_mb)],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let gpu = v["gpu"].as_str().map(str::to_owned);
    assert!(
        gpu.is_some() || !gpu_required(),
        "FISH_REQUIRE_GPU=1 but the run used no GPU: {}",
        stderr(&out)
    );
    gpu
}

/// N of `N/30 layers` in a placement note.
fn layers_placed(gpu: &str) -> usize {
    let before = gpu.split("/30 layers").next().expect("a layer count");
    let digits: String = before
        .chars()
        .rev()
        .take_while(char::is_ascii_digit)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    digits
        .parse()
        .unwrap_or_else(|_| panic!("no layer count in {gpu}"))
}

#[test]
fn mode_2_fits_more_layers_under_the_same_budget() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("q8.gguf");
    // Q8_0 everywhere: the 1536-wide ffn_down rows can become Q4_K, the
    // 576-wide rest cannot (and is counted as kept).
    let out = fish(
        &[
            "synth",
            "--shape",
            "smollm-135m",
            "--type",
            "q8_0",
            model.to_str().unwrap(),
        ],
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let Some(plain) = placement(&model, "0", "100") else {
        return;
    };
    let requantized = placement(&model, "2", "100").expect("a GPU for the second run too");
    let (n0, n2) = (layers_placed(&plain), layers_placed(&requantized));
    assert!(n0 < 30, "the budget must bind: {plain}");
    assert!(
        n2 > n0,
        "mode 2 placed {n2} layers, mode 0 {n0}: {requantized}"
    );
    assert!(requantized.contains("Q8_0->Q4_K"), "{requantized}");
    assert!(
        requantized.contains("Q8_0 kept (rows not a multiple of 256)"),
        "{requantized}"
    );
    assert!(!plain.contains("->"), "{plain}");
}

#[test]
fn quality_reports_agreement_and_fails_below_the_bar() {
    let m = default_model();
    let m = m.to_str().unwrap();
    let out = fish(&["quality", m, "-n", "16", "--requant", "2", "--json"], &[]);
    if !out.status.success() && !gpu_required() && stderr(&out).contains("nothing was placed") {
        eprintln!("skipping: no GPU");
        return;
    }
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["steps"], 16);
    assert_eq!(v["requant"], 2);
    let top1 = v["top1"].as_f64().expect("top1");
    let kl = v["mean_kl"].as_f64().expect("mean_kl");
    assert!(top1 >= 0.95, "{v}");
    // The GPU computes in f32 with f16 KV, the CPU with int8 activations:
    // close but not identical distributions.
    assert!(kl > 0.0 && kl < 0.05, "{v}");
    assert!(v["gpu"].as_str().unwrap().contains("30/30 layers"), "{v}");

    // An unreachable bar: the same comparison exits with status 1.
    let out = fish(&["quality", m, "-n", "4", "--min-top1", "1.01"], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("top-1 agreement"), "{}", stderr(&out));
}

/// Mode 1 re-quantisation is weighed by a calibration run by default, the
/// other modes only with FISH_GPU_REQUANT_IMATRIX=1; =0 turns it off, and
/// without re-quantisation nothing is calibrated.
#[test]
fn calibration_runs_for_mode_1_or_when_asked() {
    let m = default_model();
    let m = m.to_str().unwrap();
    let run = |requant: &str, imatrix: Option<&str>| {
        let mut envs = vec![("FISH_GPU_VERBOSE", "1")];
        envs.extend(imatrix.map(|v| ("FISH_GPU_REQUANT_IMATRIX", v)));
        let out = fish(
            &[
                "run",
                m,
                "-p",
                "hello",
                "-n",
                "1",
                "--temp",
                "0",
                "--requant",
                requant,
            ],
            &envs,
        );
        assert!(out.status.success(), "{}", stderr(&out));
        stderr(&out)
    };
    let mode1 = run("1", None);
    if !mode1.contains("gpu: ") && !gpu_required() {
        eprintln!("skipping: no GPU");
        return;
    }
    let calibrated = |s: &str| s.contains("fish: calibration: ");
    assert!(calibrated(&mode1), "{mode1}");
    for (requant, imatrix, want) in [
        ("1", Some("0"), false),
        ("2", None, false),
        ("2", Some("1"), true),
        ("0", Some("1"), false),
    ] {
        let err = run(requant, imatrix);
        assert_eq!(
            calibrated(&err),
            want,
            "--requant {requant} {imatrix:?}: {err}"
        );
    }
}
