//! Shared helpers of the fish-vk integration tests.
#![allow(dead_code)]

use fish_gguf::GgmlType;
use fish_vk::{Gpu, Kernel, TensorHandle};
use rand::{Rng, SeedableRng};

/// The GGUF types with matmul kernels (FQ3, not a GGUF type, has its own tests).
pub const KERNEL_TYPES: [GgmlType; 10] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

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

/// Runs `f` on synthetic weights of `ty` (seed `seed`) uploaded to `gpu`,
/// and frees them after.
pub fn with_uploaded<R>(
    gpu: &Gpu,
    ty: GgmlType,
    (n_in, n_out): (usize, usize),
    seed: u64,
    f: impl FnOnce(&Weights<'_>, TensorHandle) -> R,
) -> R {
    let bytes = synthetic_weights(ty, n_in, n_out, seed);
    let h = gpu.upload(ty, &bytes, n_in, n_out).expect("upload");
    let weights = Weights {
        ty,
        bytes: &bytes,
        n_in,
        n_out,
    };
    let result = f(&weights, h);
    gpu.free(h).expect("free");
    result
}

/// Runs `f` once per kernel type on synthetic weights (seed `seed` plus the
/// type's index in KERNEL_TYPES) uploaded to `gpu`, and frees them after.
pub fn for_each_kernel_type(
    gpu: &Gpu,
    n_in: usize,
    n_out: usize,
    seed: u64,
    mut f: impl FnMut(&Weights<'_>, TensorHandle),
) {
    for (i, ty) in KERNEL_TYPES.into_iter().enumerate() {
        with_uploaded(gpu, ty, (n_in, n_out), seed + i as u64, &mut f);
    }
}

/// The product of the resident tensor `h` with `n_tok` rows of `x` through
/// `kernel`.
pub fn matmul_one(gpu: &Gpu, h: TensorHandle, x: &[f32], n_tok: usize, kernel: Kernel) -> Vec<f32> {
    gpu.matmul_group_with(&[h], x, n_tok, kernel)
        .unwrap_or_else(|e| panic!("{kernel:?} matmul of {n_tok} tokens: {e}"))
        .remove(0)
}

/// Checks y against the f32 product of the dequantised weights with x, per
/// element within 1e-3 * (sum_i |w_i||x_i|) / n_out.
pub fn check_against_cpu(w: &Weights<'_>, x: &[f32], n_tok: usize, y: &[f32], what: &str) {
    check_decoded(&decode(w), w.n_in, x, n_tok, y, what, |_, _| 0.0);
}

/// Checks y from the int8 matvec against the dequantised weights times the
/// int8 activations (`fish_vk::int8_activations`), with the float bound of
/// `check_against_cpu` plus one quant step of the largest weight (the
/// device may round a value that sits on a tie the other way).
pub fn check_int8_product(w: &Weights<'_>, x: &[f32], n_tok: usize, y: &[f32], what: &str) {
    check_int8_decoded(&decode(w), w.n_in, x, n_tok, y, what);
}

/// `check_int8_product` on weights already decoded to f32 (rows of n_in).
pub fn check_int8_decoded(w: &[f32], n_in: usize, x: &[f32], n_tok: usize, y: &[f32], what: &str) {
    check_int8_decoded_plus(w, n_in, x, n_tok, y, what, 0.0);
}

/// `check_int8_product` for the matrix kernel's f16 form (Q4_K and Q6_K,
/// shaders/matvec_i8mm_h16.glsl): weights and scaled int8 activations are
/// rounded to f16 before each product, which adds up to 2^-10 of
/// sum |w x| (two roundings of 2^-11 per term) to the int8 bound.
pub fn check_int8_f16_product(w: &Weights<'_>, x: &[f32], n_tok: usize, y: &[f32], what: &str) {
    check_int8_decoded_plus(&decode(w), w.n_in, x, n_tok, y, what, 1.0 / 1024.0);
}

/// Checks y from the matrix kernel's Q4_K / Q6_K form on x in f16
/// (`MatmulInput::F16`) against the exact product of the dequantised
/// weights with x: the float bound of `check_against_cpu` plus the f16
/// roundings of x and of each weight (2^-10 of sum |w x|) and of the
/// weights' scales and mins, which the product with a code q can carry
/// (up to 3 2^-11 of the largest weight per |x|).
pub fn check_f16_x_matrix_product(w: &Weights<'_>, x: &[f32], n_tok: usize, y: &[f32], what: &str) {
    let n_in = w.n_in;
    let extra = |row: &[f32], t: usize| {
        let xt = &x[t * n_in..(t + 1) * n_in];
        let w_max = row.iter().fold(0f64, |m, v| m.max(f64::from(v.abs())));
        let (mut magnitude, mut x_sum) = (0f64, 0f64);
        for (a, b) in row.iter().zip(xt) {
            magnitude += (f64::from(*a) * f64::from(*b)).abs();
            x_sum += f64::from(b.abs());
        }
        magnitude / 1024.0 + 3.0 * w_max * x_sum / 2048.0
    };
    check_decoded(&decode(w), n_in, x, n_tok, y, what, extra);
}

/// The int8 bound of `check_int8_decoded` plus `per_magnitude` times
/// sum |w x| (w times the int8 activations) per row and token.
fn check_int8_decoded_plus(
    w: &[f32],
    n_in: usize,
    x: &[f32],
    n_tok: usize,
    y: &[f32],
    what: &str,
    per_magnitude: f64,
) {
    let (xq, scales) = fish_vk::int8_activations(x);
    let per_token = n_in / fish_vk::INT8_BLOCK;
    let extra = |row: &[f32], t: usize| {
        let w_max = row.iter().fold(0f64, |m, v| m.max(f64::from(v.abs())));
        let d_max = scales[t * per_token..(t + 1) * per_token]
            .iter()
            .fold(0f64, |m, d| m.max(f64::from(*d)));
        if per_magnitude == 0.0 {
            return w_max * d_max;
        }
        let magnitude: f64 = row
            .iter()
            .zip(&xq[t * n_in..(t + 1) * n_in])
            .map(|(a, b)| (f64::from(*a) * f64::from(*b)).abs())
            .sum();
        w_max * d_max + per_magnitude * magnitude
    };
    check_decoded(w, n_in, &xq, n_tok, y, what, extra);
}

/// The rows of `w` decoded to f32.
fn decode(w: &Weights<'_>) -> Vec<f32> {
    let row = fish_quant::row_bytes(w.ty, w.n_in).expect("row bytes");
    let mut deq = vec![0f32; w.n_in * w.n_out];
    for (src, dst) in w.bytes.chunks_exact(row).zip(deq.chunks_exact_mut(w.n_in)) {
        fish_quant::dequant_row(w.ty, src, dst).expect("dequant");
    }
    deq
}

/// y against w x (w: rows of n_in decoded values), each element within
/// 1e-3 * (sum_i |w_i||x_i|) / n_out plus `extra(row, token)`.
fn check_decoded(
    w: &[f32],
    n_in: usize,
    x: &[f32],
    n_tok: usize,
    y: &[f32],
    what: &str,
    extra: impl Fn(&[f32], usize) -> f64,
) {
    let n_out = w.len() / n_in;
    assert_eq!(y.len(), n_out * n_tok, "{what}: output length");
    let mut worst = 0f64;
    for (o, row) in w.chunks_exact(n_in).enumerate() {
        for t in 0..n_tok {
            let xt = &x[t * n_in..(t + 1) * n_in];
            let (mut dot, mut mag) = (0f64, 0f64);
            for (a, b) in row.iter().zip(xt) {
                dot += f64::from(*a) * f64::from(*b);
                mag += (f64::from(*a) * f64::from(*b)).abs();
            }
            let bound = 1e-3 * mag / n_out as f64 + extra(row, t);
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

/// Whether `kernel` at `n_tok` tokens runs the int8 matvec on `gpu` for
/// weights of type `ty`.
pub fn runs_int8(
    gpu: &Gpu,
    kernel: fish_vk::Kernel,
    ty: fish_vk::WeightFormat,
    n_tok: usize,
) -> bool {
    matches!(
        kernel,
        fish_vk::Kernel::MatvecInt8 | fish_vk::Kernel::MatvecInt8Prequantised
    ) || (kernel == fish_vk::Kernel::Auto
        && n_tok <= fish_vk::MATVEC_MAX_TOKENS
        && gpu.int8_matvec(ty))
}

pub fn f16_round(v: f32) -> f64 {
    f64::from(half::f16::from_f32(v).to_f32())
}

/// Checks y (n_tok x n_out) from a kernel that rounds its inputs to f16
/// (cooperative matrices): against the product of the f16-rounded values
/// with the usual bound, and against the exact product with the bound f16
/// rounding itself guarantees (2^-10 sum |w||x|). Returns the worst error
/// against the f16 reference as a fraction of its bound.
pub fn check_f16_product(w: &Weights<'_>, x: &[f32], n_tok: usize, y: &[f32], what: &str) -> f64 {
    let (n_in, n_out) = (w.n_in, w.n_out);
    assert_eq!(y.len(), n_out * n_tok, "{what}: output length");
    let row = fish_quant::row_bytes(w.ty, n_in).expect("row bytes");
    let x16: Vec<f64> = x.iter().map(|&v| f16_round(v)).collect();
    let mut deq = vec![0f32; n_in];
    let mut worst = 0f64;
    for o in 0..n_out {
        fish_quant::dequant_row(w.ty, &w.bytes[o * row..(o + 1) * row], &mut deq).expect("dequant");
        let w16: Vec<f64> = deq.iter().map(|&v| f16_round(v)).collect();
        for t in 0..n_tok {
            let xt = &x[t * n_in..(t + 1) * n_in];
            let xt16 = &x16[t * n_in..(t + 1) * n_in];
            let (mut exact, mut rounded, mut mag) = (0f64, 0f64, 0f64);
            for i in 0..n_in {
                let p = f64::from(deq[i]) * f64::from(xt[i]);
                exact += p;
                mag += p.abs();
                rounded += w16[i] * xt16[i];
            }
            let got = f64::from(y[t * n_out + o]);
            let bound = 1e-3 * mag / n_out as f64;
            let err = (got - rounded).abs();
            assert!(
                err <= bound,
                "{what}: y[t={t}, o={o}] = {got}, f16 reference {rounded} (error {err:e} > bound {bound:e})"
            );
            let f16_bound = mag / 1024.0;
            assert!(
                (got - exact).abs() <= f16_bound,
                "{what}: y[t={t}, o={o}] = {got}, exact {exact} (beyond the f16 rounding bound {f16_bound:e})"
            );
            worst = worst.max(err / bound.max(f64::MIN_POSITIVE));
        }
    }
    eprintln!("{what}: worst error {:.3}% of the bound", worst * 100.0);
    worst
}

/// Checks the output of `Kernel::Auto`: above MATVEC_MAX_TOKENS it runs the
/// device's prefill kernel, which on devices with cooperative matrices takes
/// f16 inputs.
pub fn check_auto(gpu: &Gpu, w: &Weights<'_>, x: &[f32], n_tok: usize, y: &[f32], what: &str) {
    let matvec = n_tok <= fish_vk::MATVEC_MAX_TOKENS;
    if !matvec && gpu.prefill_kernel(n_tok) == fish_vk::Kernel::CoopMat {
        check_f16_product(w, x, n_tok, y, what);
    } else if runs_int8(gpu, fish_vk::Kernel::Auto, w.ty.into(), n_tok) {
        check_int8_product(w, x, n_tok, y, what);
    } else {
        check_against_cpu(w, x, n_tok, y, what);
    }
}
