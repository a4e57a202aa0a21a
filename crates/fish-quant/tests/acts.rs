//! The activation quantisation schemes of ggml's CPU path.

use fish_quant::blocks::{BlockQ8K, BlockQ8_0, BlockQ8_1};
use fish_quant::{quantize_acts, GgmlType};

#[test]
fn q8_0_scale_is_amax_over_127_with_nearest_even_codes() {
    // amax 127 makes the multiplier exactly 1, so the ties below are exact.
    let mut x = [0.0f32; 32];
    x[0] = 127.0;
    x[1] = 62.5;
    x[2] = 0.5;
    x[3] = 1.5;
    x[4] = -2.5;
    let acts = quantize_acts(GgmlType::Q8_0, &x, 1, 32).unwrap();
    let b: &[BlockQ8_0] = acts.blocks().unwrap();
    assert_eq!(b[0].d.to_f32(), 1.0);
    assert_eq!(&b[0].qs[..5], &[127, 62, 0, 2, -2]);
}

#[test]
fn q8_1_carries_the_scaled_code_sum() {
    let x: Vec<f32> = (0..64).map(|i| (i as f32 - 20.0) * 0.1).collect();
    let acts = quantize_acts(GgmlType::Q8_1, &x, 1, 64).unwrap();
    let b: &[BlockQ8_1] = acts.blocks().unwrap();
    for (blk, xs) in b.iter().zip(x.chunks(32)) {
        let amax = xs.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let sum: i32 = blk.qs.iter().map(|&q| q as i32).sum();
        let expected = half::f16::from_f32(amax / 127.0 * sum as f32);
        assert_eq!(blk.s.to_f32(), expected.to_f32());
    }
}

#[test]
fn q8_k_scale_follows_the_signed_extreme() {
    let mut x = vec![0.5f32; 256];
    x[10] = -3.0;
    x[20] = 2.0;
    let acts = quantize_acts(GgmlType::Q8_K, &x, 1, 256).unwrap();
    let b: &[BlockQ8K] = acts.blocks().unwrap();
    let b = &b[0];
    // iscale = -127 / -3, d = 1 / iscale.
    let iscale = -127.0f32 / -3.0;
    assert_eq!(b.d, 1.0 / iscale);
    assert_eq!(b.qs[10], -127);
    assert_eq!(b.qs[20], (2.0 * iscale).round_ties_even() as i8);
    for j in 0..16 {
        let s: i32 = b.qs[16 * j..16 * j + 16].iter().map(|&q| q as i32).sum();
        assert_eq!(b.bsums[j] as i32, s);
    }
    // A positive extreme gives a negative scale: codes flip sign with it.
    let y: Vec<f32> = x.iter().map(|v| -v).collect();
    let acts = quantize_acts(GgmlType::Q8_K, &y, 1, 256).unwrap();
    let c = &acts.blocks::<BlockQ8K>().unwrap()[0];
    assert_eq!(c.d, -b.d);
    assert_eq!(c.qs, b.qs);
}

#[test]
fn q8_k_extreme_maps_to_minus_127() {
    // The first value of largest magnitude sets the scale and becomes -127;
    // the same magnitude with the other sign becomes +127.
    let mut x = vec![0.0f32; 256];
    x[0] = 1.0;
    x[1] = -1.0;
    let acts = quantize_acts(GgmlType::Q8_K, &x, 1, 256).unwrap();
    let b = &acts.blocks::<BlockQ8K>().unwrap()[0];
    assert_eq!(b.qs[0], -127);
    assert_eq!(b.qs[1], 127);
    assert!(b.d < 0.0);
}
