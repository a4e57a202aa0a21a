//! Quantise/dequantise round trips: error bounds per format.

mod common;
use common::*;
use fish_quant::GgmlType;

/// Relative RMS error bounds on Gaussian data (the measured errors are
/// 70-95% of these, so a worse quantiser fails).
fn bound(ty: GgmlType) -> f64 {
    use GgmlType::*;
    match ty {
        F32 => 0.0,
        F16 => 5e-4,
        BF16 => 4e-3,
        Q8_0 => 0.006,
        Q6_K => 0.02,
        Q5_0 | Q5_1 | Q5_K => 0.045,
        Q4_0 | Q4_1 | Q4_K => 0.095,
        Q3_K => 0.2,
        Q2_K => 0.4,
        _ => unreachable!(),
    }
}

#[test]
fn round_trip_error_within_bounds() {
    let mut rng = Lcg(7);
    let x = rng.vec(256 * 64, 0.05);
    for ty in QUANTISABLE {
        let q = quantize(ty, &x);
        let y = dequant(ty, &q, x.len());
        let e = rel_rms(&y, &x);
        assert!(e <= bound(ty), "{ty}: relative RMS {e:.4} > {}", bound(ty));
        // Requantising decoded values must not drift much further.
        let q2 = quantize(ty, &y);
        let y2 = dequant(ty, &q2, x.len());
        let e2 = rel_rms(&y2, &x);
        assert!(e2 <= bound(ty) * 1.5 + 1e-6, "{ty}: second pass {e2:.4}");
        eprintln!("{ty}: {e:.5} then {e2:.5}");
    }
}

#[test]
fn zero_rows_quantise_to_zero() {
    let x = vec![0.0f32; 512];
    for ty in QUANTISABLE {
        let y = dequant(ty, &quantize(ty, &x), x.len());
        assert!(y.iter().all(|&v| v == 0.0), "{ty}");
    }
}

#[test]
fn constant_and_outlier_blocks_stay_finite() {
    let mut x = vec![0.25f32; 512];
    x[3] = -40.0;
    x[300] = 1e-6;
    for ty in QUANTISABLE {
        let y = dequant(ty, &quantize(ty, &x), x.len());
        assert!(y.iter().all(|v| v.is_finite()), "{ty}");
        // The outlier dominates each format's scale and must survive.
        assert!((y[3] + 40.0).abs() < 4.0, "{ty}: {}", y[3]);
    }
}

#[test]
fn bad_lengths_are_errors_not_panics() {
    let mut out = vec![0f32; 33];
    assert!(fish_quant::dequant_row(GgmlType::Q4_0, &[0u8; 18], &mut out).is_err());
    let mut out = vec![0f32; 32];
    assert!(fish_quant::dequant_row(GgmlType::Q4_0, &[0u8; 17], &mut out).is_err());
    assert!(fish_quant::dequant_row(GgmlType::IQ2_XS, &[0u8; 74], &mut vec![0f32; 256]).is_err());
    let mut bytes = vec![0u8; 143];
    assert!(fish_quant::quantize_row(GgmlType::Q4_K, &[0f32; 256], &mut bytes).is_err());
}

#[test]
fn supported_types_are_the_thirteen_weight_formats() {
    for ty in GgmlType::ALL {
        assert_eq!(
            fish_quant::is_supported(ty),
            QUANTISABLE.contains(&ty),
            "{ty}"
        );
    }
}
