//! Importance-weighted re-quantisation: it lowers the error the weights say
//! matters, reports the plain error of its bytes, and checks its arguments.

mod common;
use common::*;
use fish_quant::fq3::dequant_row_fq3;
use fish_quant::requant::{requantize, requantize_weighted, RequantTarget};
use fish_quant::GgmlType;

fn decode(target: RequantTarget, bytes: &[u8], n: usize) -> Vec<f32> {
    let mut out = vec![0f32; n];
    match target {
        RequantTarget::Q4K => fish_quant::dequant_row(GgmlType::Q4_K, bytes, &mut out).unwrap(),
        RequantTarget::Fq3 => dequant_row_fq3(bytes, &mut out).unwrap(),
    }
    out
}

/// Column weights like activation energy: mostly small, a few columns large.
fn column_weights(n_in: usize) -> Vec<f32> {
    (0..n_in)
        .map(|c| {
            if c % 29 == 5 {
                50.0
            } else {
                0.5 + (c % 7) as f32 * 0.1
            }
        })
        .collect()
}

fn weighted_error(a: &[f32], b: &[f32], w: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .enumerate()
        .map(|(i, (x, y))| w[i % w.len()] as f64 * ((x - y) as f64).powi(2))
        .sum()
}

#[test]
fn weighted_fit_lowers_the_weighted_error_and_reports_the_plain_one() {
    let (n_in, n_rows) = (512, 32);
    let x = Lcg(11).vec(n_in * n_rows, 0.02);
    let w = column_weights(n_in);
    for (src_ty, target) in [
        (GgmlType::Q4_K, RequantTarget::Fq3),
        (GgmlType::Q6_K, RequantTarget::Q4K),
    ] {
        let src = quantize(src_ty, &x);
        let source = dequant(src_ty, &src, x.len());
        let plain = requantize(src_ty, &src, n_in, n_rows, target).unwrap();
        let weighted = requantize_weighted(src_ty, &src, n_in, n_rows, target, &w).unwrap();
        assert_eq!(weighted.bytes.len(), plain.bytes.len());
        let (yp, yw) = (
            decode(target, &plain.bytes, x.len()),
            decode(target, &weighted.bytes, x.len()),
        );
        let (ep, ew) = (
            weighted_error(&source, &yp, &w),
            weighted_error(&source, &yw, &w),
        );
        assert!(ew < 0.85 * ep, "{src_ty}->{target:?}: {ew} vs {ep}");
        assert!((rel_rms(&yw, &source) - weighted.rel_rms).abs() < 1e-4);
    }
}

#[test]
fn weights_of_the_wrong_length_or_bad_values_are_handled() {
    let x = Lcg(5).vec(256 * 4, 0.02);
    let src = quantize(GgmlType::Q4_K, &x);
    let short = vec![1.0; 255];
    assert!(requantize_weighted(GgmlType::Q4_K, &src, 256, 4, RequantTarget::Fq3, &short).is_err());
    // Non-finite and negative weights count as zero; all-zero still fits.
    let mut odd = vec![0.0f32; 256];
    odd[0] = f32::NAN;
    odd[1] = -3.0;
    odd[2] = f32::INFINITY;
    let r = requantize_weighted(GgmlType::Q4_K, &src, 256, 4, RequantTarget::Fq3, &odd).unwrap();
    assert!(r.rel_rms < 0.2, "{}", r.rel_rms);
}
