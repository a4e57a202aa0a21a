//! Re-quantisation to Q4_K and FQ3: reported error, output layout, and the
//! targets on real tensors when the models are present.

mod common;
use common::*;
use fish_quant::fq3::dequant_row_fq3;
use fish_quant::requant::{requantize, RequantTarget};
use fish_quant::GgmlType;
use std::path::PathBuf;

fn decode(target: RequantTarget, bytes: &[u8], n: usize) -> Vec<f32> {
    let mut out = vec![0f32; n];
    match target {
        RequantTarget::Q4K => fish_quant::dequant_row(GgmlType::Q4_K, bytes, &mut out).unwrap(),
        RequantTarget::Fq3 => dequant_row_fq3(bytes, &mut out).unwrap(),
    }
    out
}

#[test]
fn reported_error_matches_the_returned_bytes() {
    let (n_in, n_rows) = (512, 64);
    let mut rng = Lcg(3);
    let x = rng.vec(n_in * n_rows, 0.02);
    for (src_ty, target, bound) in [
        (GgmlType::Q6_K, RequantTarget::Q4K, 0.08),
        (GgmlType::Q4_K, RequantTarget::Fq3, 0.17),
        (GgmlType::F16, RequantTarget::Fq3, 0.16),
        (GgmlType::Q8_0, RequantTarget::Q4K, 0.08),
    ] {
        let src = quantize(src_ty, &x);
        let r = requantize(src_ty, &src, n_in, n_rows, target).unwrap();
        assert_eq!(r.bytes.len(), n_rows * n_in / 256 * target.block_bytes());
        let source = dequant(src_ty, &src, x.len());
        let decoded = decode(target, &r.bytes, x.len());
        let measured = rel_rms(&decoded, &source);
        assert!(
            (measured - r.rel_rms).abs() < 1e-4,
            "{src_ty}->{target:?}: {measured} vs {}",
            r.rel_rms
        );
        assert!(r.rel_rms <= bound, "{src_ty}->{target:?}: {}", r.rel_rms);
    }
}

#[test]
fn shape_errors_are_reported() {
    let src = vec![0u8; 210];
    assert!(requantize(GgmlType::Q6_K, &src, 256, 2, RequantTarget::Q4K).is_err());
    assert!(requantize(GgmlType::Q4_1, &[0u8; 20], 32, 1, RequantTarget::Fq3).is_err());
    assert!(requantize(GgmlType::IQ2_XS, &[0u8; 74], 256, 1, RequantTarget::Fq3).is_err());
}

/// Targets from the design (measured there on another model's K-quant
/// tensors): Q4_K -> FQ3 at most 14.6%, Q6_K -> Q4_K at most 7.5% relative
/// RMS. Here they are checked over all of blk.0 of Qwen2.5-Coder 1.5B
/// Q4_K_M (when the file is present); single tensors may exceed the FQ3
/// figure slightly (attn_q measures 15.0%), so those are bounded at 15.5%.
#[test]
fn real_tensors_meet_the_requant_targets() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf");
    let Ok(file) = fish_gguf::Gguf::open(&path) else {
        eprintln!("skipped: {} not present", path.display());
        return;
    };
    // Per target: (sum of squared errors, sum of squared source values).
    let mut totals = [(0.0f64, 0.0f64); 2];
    for t in file.tensors() {
        if !t.name.starts_with("blk.0.") || t.dims.len() != 2 {
            continue;
        }
        let (target, per_tensor_bound, slot) = match t.ty {
            GgmlType::Q4_K => (RequantTarget::Fq3, 0.155, 0),
            GgmlType::Q6_K => (RequantTarget::Q4K, 0.075, 1),
            _ => continue,
        };
        let (n_in, n_rows) = (t.dims[0] as usize, t.dims[1] as usize);
        let data = file.tensor_data(t);
        let r = requantize(t.ty, data, n_in, n_rows, target).unwrap();
        eprintln!(
            "{} {} -> {target:?}: relative RMS {:.4}",
            t.name, t.ty, r.rel_rms
        );
        assert!(r.rel_rms <= per_tensor_bound, "{}: {}", t.name, r.rel_rms);
        let source = dequant(t.ty, data, n_in * n_rows);
        let energy: f64 = source.iter().map(|v| (*v as f64).powi(2)).sum();
        totals[slot].0 += r.rel_rms.powi(2) * energy;
        totals[slot].1 += energy;
    }
    assert!(
        totals.iter().all(|t| t.1 > 0.0),
        "expected Q4_K and Q6_K tensors in blk.0"
    );
    let fq3 = (totals[0].0 / totals[0].1).sqrt();
    let q4k = (totals[1].0 / totals[1].1).sqrt();
    eprintln!("blk.0 overall: Q4_K -> FQ3 {fq3:.4}, Q6_K -> Q4_K {q4k:.4}");
    assert!(fq3 <= 0.146, "Q4_K -> FQ3 {fq3}");
    assert!(q4k <= 0.075, "Q6_K -> Q4_K {q4k}");
}
