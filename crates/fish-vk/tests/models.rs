//! The blk.0 projections of real models against the CPU reference: SmolLM2
//! (Q4_1, the default test model) always when present, Qwen2.5-Coder-1.5B
//! (Q4_K, Q6_K) when FISH_TEST_MODELS names qwen15.

mod common;

use common::*;
use fish_gguf::Gguf;
use std::path::PathBuf;

const PROJECTIONS: [&str; 7] = [
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_output",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
];

fn model_path(file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models")
        .join(file)
}

/// Checks every blk.0 projection; returns the types seen.
fn check_block0(file: &str) -> Vec<fish_gguf::GgmlType> {
    let Some(gpu) = gpu_or_skip() else {
        return Vec::new();
    };
    let path = model_path(file);
    if !path.exists() {
        eprintln!(
            "skipped: {} not found (scripts/fetch-model.sh)",
            path.display()
        );
        return Vec::new();
    }
    let gguf = Gguf::open(&path).expect("open model");
    let mut types = Vec::new();
    for name in PROJECTIONS {
        let t = gguf
            .tensor(&format!("blk.0.{name}.weight"))
            .unwrap_or_else(|| panic!("{file}: no blk.0.{name}.weight"));
        let (n_in, n_out) = (t.row_len() as usize, t.n_rows() as usize);
        let bytes = gguf.tensor_data(t);
        assert!(
            fish_vk::supports(t.ty),
            "{file} {name}: {:?} unsupported",
            t.ty
        );
        let h = gpu.upload(t.ty, bytes, n_in, n_out).expect("upload");
        let w = Weights {
            ty: t.ty,
            bytes,
            n_in,
            n_out,
        };
        for n_tok in [1usize, 3, 37] {
            let x = random_values(n_in * n_tok, 21 + n_tok as u64);
            let y = gpu.matmul(h, &x, n_tok).expect("matmul");
            check_auto(
                gpu,
                &w,
                &x,
                n_tok,
                &y,
                &format!("{file} {name} {:?} n_tok={n_tok}", t.ty),
            );
        }
        gpu.free(h).expect("free");
        types.push(t.ty);
    }
    assert_no_validation_messages(gpu);
    types
}

#[test]
fn smollm2_block0_projections_match_the_cpu() {
    let types = check_block0("SmolLM2-135M-Instruct.Q4_1.gguf");
    if !types.is_empty() {
        assert!(types.contains(&fish_gguf::GgmlType::Q4_1));
    }
}

#[test]
fn qwen15_block0_projections_match_the_cpu() {
    let wanted = std::env::var("FISH_TEST_MODELS").unwrap_or_default();
    if !wanted.split([',', ' ']).any(|m| m == "qwen15") {
        eprintln!("skipped: FISH_TEST_MODELS does not name qwen15");
        return;
    }
    let types = check_block0("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf");
    assert!(
        types.contains(&fish_gguf::GgmlType::Q4_K) && types.contains(&fish_gguf::GgmlType::Q6_K),
        "{types:?}"
    );
}
