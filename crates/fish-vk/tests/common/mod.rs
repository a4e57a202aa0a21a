//! Shared helpers of the fish-vk integration tests.
#![allow(dead_code)]

use fish_gguf::GgmlType;
use fish_vk::Gpu;
use rand::{Rng, SeedableRng};

/// The process-wide device, or None (test skipped) when there is none; with
/// FISH_REQUIRE_GPU=1 a missing device fails the test instead.
pub fn gpu_or_skip() -> Option<&'static Gpu> {
    match fish_vk::global() {
        Some(gpu) => {
            if std::env::var("FISH_VK_VALIDATE").as_deref() == Ok("1") && require_gpu() {
                assert!(
                    gpu.validation_enabled(),
                    "FISH_VK_VALIDATE=1 but no validation layer"
                );
            }
            Some(gpu)
        }
        None if require_gpu() => panic!("FISH_REQUIRE_GPU=1 but {}", fish_vk::status()),
        None => {
            eprintln!("skipped: {}", fish_vk::status());
            None
        }
    }
}

pub fn require_gpu() -> bool {
    std::env::var("FISH_REQUIRE_GPU").as_deref() == Ok("1")
}

/// Asserts that the validation layer reported nothing on `gpu`.
pub fn assert_no_validation_messages(gpu: &Gpu) {
    assert_eq!(
        gpu.validation_messages(),
        0,
        "validation layer messages (see stderr)"
    );
}

pub fn random_values(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect()
}

/// Random weights quantised to `ty`: n_out rows of n_in values.
pub fn synthetic_weights(ty: GgmlType, n_in: usize, n_out: usize, seed: u64) -> Vec<u8> {
    let values = random_values(n_in * n_out, seed);
    let row = fish_quant::row_bytes(ty, n_in).expect("row bytes");
    let mut out = vec![0u8; row * n_out];
    for (src, dst) in values.chunks_exact(n_in).zip(out.chunks_exact_mut(row)) {
        fish_quant::quantize_row(ty, src, dst).expect("quantise");
    }
    out
}

/// A weight matrix in CPU memory: n_out rows of n_in values stored as `ty`.
pub struct Weights<'a> {
    pub ty: GgmlType,
    pub bytes: &'a [u8],
    pub n_in: usize,
    pub n_out: usize,
}

/// Checks y against the f32 product of the dequantised weights with x, per
/// element within 1e-3 * (sum_i |w_i||x_i|) / n_out.
pub fn check_against_cpu(w: &Weights<'_>, x: &[f32], n_tok: usize, y: &[f32], what: &str) {
    let (n_in, n_out) = (w.n_in, w.n_out);
    assert_eq!(y.len(), n_out * n_tok, "{what}: output length");
    let row = fish_quant::row_bytes(w.ty, n_in).expect("row bytes");
    let mut deq = vec![0f32; n_in];
    let mut worst = 0f64;
    for o in 0..n_out {
        fish_quant::dequant_row(w.ty, &w.bytes[o * row..(o + 1) * row], &mut deq).expect("dequant");
        for t in 0..n_tok {
            let xt = &x[t * n_in..(t + 1) * n_in];
            let (mut dot, mut mag) = (0f64, 0f64);
            for (a, b) in deq.iter().zip(xt) {
                dot += f64::from(*a) * f64::from(*b);
                mag += (f64::from(*a) * f64::from(*b)).abs();
            }
            let bound = 1e-3 * mag / n_out as f64;
            let got = f64::from(y[t * n_out + o]);
            let err = (got - dot).abs();
            assert!(
                err <= bound,
                "{what}: y[t={t}, o={o}] = {got}, expected {dot} (error {err:e} > bound {bound:e})"
            );
            worst = worst.max(err / bound.max(f64::MIN_POSITIVE));
        }
    }
    eprintln!("{what}: worst error {:.3}% of the bound", worst * 100.0);
}
