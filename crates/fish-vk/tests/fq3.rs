//! FQ3 (the project's 3-bit format) on the GPU: bytes from fish-quant's FQ3
//! quantiser, uploaded as `WeightFormat::Fq3`, against fish-quant's CPU
//! matmul of the same bytes decoded to f32, for every kernel, batch sizes
//! that leave partial passes and tiles, and row counts that leave partial
//! workgroups.

mod common;

use common::*;
use fish_gguf::GgmlType;
use fish_quant::fq3::{dequant_row_fq3, quantize_row_fq3, FQ3_BLOCK_BYTES, FQ3_BLOCK_VALUES};
use fish_vk::{supports, Gpu, Kernel, TensorHandle, VkError, WeightFormat};

/// 131 rows: odd (a partial matvec workgroup) and not a multiple of the
/// 128-row tile.
const N_OUT: usize = 131;

/// FQ3 bytes of random weights: n_out rows of n_in values.
fn fq3_weights(n_in: usize, n_out: usize, seed: u64) -> Vec<u8> {
    let values = random_values(n_in * n_out, seed);
    let row = n_in / FQ3_BLOCK_VALUES * FQ3_BLOCK_BYTES;
    let mut out = vec![0u8; row * n_out];
    for (src, dst) in values.chunks_exact(n_in).zip(out.chunks_exact_mut(row)) {
        quantize_row_fq3(src, dst).expect("quantise");
    }
    out
}

/// The FQ3 rows decoded by fish-quant, as f32 weights.
fn decoded(bytes: &[u8], n_in: usize, n_out: usize) -> Vec<f32> {
    let mut out = vec![0f32; n_in * n_out];
    let row = n_in / FQ3_BLOCK_VALUES * FQ3_BLOCK_BYTES;
    for (src, dst) in bytes.chunks_exact(row).zip(out.chunks_exact_mut(n_in)) {
        dequant_row_fq3(src, dst).expect("dequant");
    }
    out
}

/// Checks y against fish-quant's matmul of the decoded weights (f32 x f32),
/// per element within 1e-3 * (sum_i |w_i||x_i|) / n_out.
fn check_against_cpu(w: &[f32], n_in: usize, x: &[f32], n_tok: usize, y: &[f32], what: &str) {
    let n_out = w.len() / n_in;
    assert_eq!(y.len(), n_out * n_tok, "{what}: output length");
    let w_bytes: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
    let weights =
        fish_quant::Weights::new(GgmlType::F32, &w_bytes, n_in, n_out).expect("f32 weights");
    let mut reference = vec![0f32; n_out * n_tok];
    fish_quant::matmul_batch(weights, x, n_tok, &mut reference).expect("CPU matmul");
    let mut worst = 0f64;
    for t in 0..n_tok {
        let xt = &x[t * n_in..(t + 1) * n_in];
        for o in 0..n_out {
            let row = &w[o * n_in..(o + 1) * n_in];
            let mag: f64 = row
                .iter()
                .zip(xt)
                .map(|(a, b)| (f64::from(*a) * f64::from(*b)).abs())
                .sum();
            let bound = 1e-3 * mag / n_out as f64;
            let (got, want) = (y[t * n_out + o], reference[t * n_out + o]);
            let err = (f64::from(got) - f64::from(want)).abs();
            assert!(
                err <= bound,
                "{what}: y[t={t}, o={o}] = {got}, expected {want} (error {err:e} > bound {bound:e})"
            );
            worst = worst.max(err / bound.max(f64::MIN_POSITIVE));
        }
    }
    eprintln!("{what}: worst error {:.3}% of the bound", worst * 100.0);
}

/// Runs `kernel` at every batch size and checks each result.
fn check_kernel(gpu: &Gpu, h: TensorHandle, w: &[f32], kernel: Kernel, n_tok_set: &[usize]) {
    let n_in = h.n_in();
    for &n_tok in n_tok_set {
        let x = random_values(n_in * n_tok, 31 + n_tok as u64);
        let y = matmul_one(gpu, h, &x, n_tok, kernel);
        let what = format!("FQ3 {n_in}x{} {kernel:?} n_tok={n_tok}", h.n_out());
        if runs_int8(gpu, kernel, WeightFormat::Fq3, n_tok) {
            check_int8_decoded(w, n_in, &x, n_tok, &y, &what);
        } else {
            check_against_cpu(w, n_in, &x, n_tok, &y, &what);
        }
    }
}

#[test]
fn fq3_constants_match_fish_quant() {
    assert_eq!(fish_vk::FQ3_BLOCK_BYTES, FQ3_BLOCK_BYTES);
    assert_eq!(fish_vk::FQ3_BLOCK_VALUES, FQ3_BLOCK_VALUES);
    assert_eq!(WeightFormat::Fq3.block_bytes(), FQ3_BLOCK_BYTES);
    assert_eq!(WeightFormat::Fq3.block_size(), FQ3_BLOCK_VALUES);
    assert!(supports(WeightFormat::Fq3));
    assert_eq!(WeightFormat::Fq3.ggml(), None);
    assert_eq!(WeightFormat::from(GgmlType::Q4_K), GgmlType::Q4_K);
}

#[test]
fn fq3_matches_the_cpu_reference_with_every_kernel() {
    let Some(gpu) = gpu_or_skip() else { return };
    // 512 values: two blocks (four matvec units); 768: three blocks, an odd
    // number, so a row ends in the middle of a block pair.
    for (i, n_in) in [512usize, 768].into_iter().enumerate() {
        let bytes = fq3_weights(n_in, N_OUT, 500 + i as u64);
        let w = decoded(&bytes, n_in, N_OUT);
        let h = gpu
            .upload(WeightFormat::Fq3, &bytes, n_in, N_OUT)
            .expect("upload");
        assert_eq!(h.ty(), WeightFormat::Fq3);
        let mut kernels = vec![
            Kernel::Auto,
            Kernel::Matvec,
            Kernel::MatvecSharedReduce,
            Kernel::Tiled,
        ];
        if gpu.info().int8_dot != fish_vk::Int8Dot::Absent {
            kernels.push(Kernel::MatvecInt8);
        }
        for kernel in kernels {
            check_kernel(gpu, h, &w, kernel, &[1, 3, 37, 256]);
        }
        gpu.free(h).expect("free");
    }
    assert_no_validation_messages(gpu);
}

#[test]
fn fq3_single_block_rows_and_single_rows() {
    let Some(gpu) = gpu_or_skip() else { return };
    for (n_in, n_out) in [(256usize, 5usize), (1024, 1)] {
        let bytes = fq3_weights(n_in, n_out, 600 + n_in as u64);
        let w = decoded(&bytes, n_in, n_out);
        let h = gpu
            .upload(WeightFormat::Fq3, &bytes, n_in, n_out)
            .expect("upload");
        for kernel in [Kernel::Matvec, Kernel::Tiled] {
            check_kernel(gpu, h, &w, kernel, &[1, 9]);
        }
        gpu.free(h).expect("free");
    }
    assert_no_validation_messages(gpu);
}

#[test]
fn fq3_joins_a_matmul_group_with_gguf_types() {
    let Some(gpu) = gpu_or_skip() else { return };
    let n_in = 512;
    let fq3 = fq3_weights(n_in, 70, 700);
    let q4k = synthetic_weights(GgmlType::Q4_K, n_in, 33, 701);
    let handles = [
        gpu.upload(WeightFormat::Fq3, &fq3, n_in, 70)
            .expect("upload FQ3"),
        gpu.upload(GgmlType::Q4_K, &q4k, n_in, 33)
            .expect("upload Q4_K"),
    ];
    let mut q4k_decoded = vec![0f32; n_in * 33];
    let row = fish_quant::row_bytes(GgmlType::Q4_K, n_in).expect("row bytes");
    for (src, dst) in q4k
        .chunks_exact(row)
        .zip(q4k_decoded.chunks_exact_mut(n_in))
    {
        fish_quant::dequant_row(GgmlType::Q4_K, src, dst).expect("dequant");
    }
    let expected = [decoded(&fq3, n_in, 70), q4k_decoded];
    let handles_ty = [WeightFormat::Fq3, WeightFormat::Ggml(GgmlType::Q4_K)];
    for n_tok in [1usize, 37] {
        let x = random_values(n_in * n_tok, 41);
        let ys = gpu.matmul_group(&handles, &x, n_tok).expect("group");
        for (i, (w, y)) in expected.iter().zip(&ys).enumerate() {
            let what = format!("group member {i} n_tok={n_tok}");
            if runs_int8(gpu, Kernel::Auto, handles_ty[i], n_tok) {
                check_int8_decoded(w, n_in, &x, n_tok, y, &what);
            } else {
                check_against_cpu(w, n_in, &x, n_tok, y, &what);
            }
        }
    }
    for h in handles {
        gpu.free(h).expect("free");
    }
    assert_no_validation_messages(gpu);
}

#[test]
fn fq3_bad_shapes_are_errors() {
    let Some(gpu) = gpu_or_skip() else { return };
    let bytes = fq3_weights(256, 2, 800);
    // Rows must be whole 256-value blocks.
    assert!(matches!(
        gpu.upload(WeightFormat::Fq3, &bytes[..224], 128, 2),
        Err(VkError::Shape(_))
    ));
    // The bytes must be exactly n_out rows.
    assert!(matches!(
        gpu.upload(WeightFormat::Fq3, &bytes[..200], 256, 2),
        Err(VkError::Shape(_))
    ));
    assert!(matches!(
        gpu.upload(WeightFormat::Fq3, &bytes, 256, 3),
        Err(VkError::Shape(_))
    ));
    assert_no_validation_messages(gpu);
}
