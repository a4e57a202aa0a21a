//! Dot products and matmul against an f64 reference on the decoded weights.

mod common;
use common::*;
use fish_quant::{dot_type, matmul_batch, matmul_quantized, quantize_acts, GgmlType, Weights};

/// The activation value each input is effectively multiplied with after
/// quantisation can be off by half a quantisation step (amax / 254 of its
/// block), plus f16 rounding of scales and offset sums (2^-11 relative).
/// The bound allows twice that: sum |w| * amax_block / 127 + 2^-9 * sum |w| |x|.
fn error_bound(ty: GgmlType, w: &[f32], x: &[f32]) -> f64 {
    let act_block = match dot_type(ty) {
        GgmlType::Q8_0 | GgmlType::Q8_1 => 32,
        GgmlType::Q8_K => 256,
        _ => 0,
    };
    let mut bound = 0.0f64;
    for (i, (&wi, &xi)) in w.iter().zip(x).enumerate() {
        let step = match i.checked_div(act_block) {
            Some(blk) => {
                let b = blk * act_block;
                x[b..b + act_block]
                    .iter()
                    .fold(0.0f32, |m, v| m.max(v.abs())) as f64
                    / 127.0
            }
            None => 0.0,
        };
        bound += wi.abs() as f64 * (step + xi.abs() as f64 / 512.0);
    }
    bound + 1e-6
}

fn check_matmul(ty: GgmlType, n_in: usize, n_out: usize, n_tok: usize, seed: u64) {
    let mut rng = Lcg(seed);
    let wf = rng.vec(n_in * n_out, 0.05);
    let bytes = quantize(ty, &wf);
    let wd = dequant(ty, &bytes, wf.len());
    let x = rng.vec(n_in * n_tok, 1.0);
    let w = Weights::new(ty, &bytes, n_in, n_out).unwrap();
    let mut y = vec![0f32; n_tok * n_out];
    matmul_batch(w, &x, n_tok, &mut y).unwrap();
    for t in 0..n_tok {
        let xt = &x[t * n_in..(t + 1) * n_in];
        for o in 0..n_out {
            let row = &wd[o * n_in..(o + 1) * n_in];
            let reference: f64 = row.iter().zip(xt).map(|(&a, &b)| a as f64 * b as f64).sum();
            let got = y[t * n_out + o] as f64;
            let bound = error_bound(ty, row, xt);
            assert!(
                (got - reference).abs() <= bound,
                "{ty} t={t} o={o}: got {got}, reference {reference}, bound {bound}"
            );
        }
    }
}

#[test]
fn matmul_matches_reference_for_every_type() {
    for (i, ty) in QUANTISABLE.into_iter().enumerate() {
        check_matmul(ty, 512, 37, 3, 100 + i as u64);
    }
}

#[test]
fn large_matmul_splits_rows_across_threads() {
    // Big enough that rows are split into several tasks, and a batch big
    // enough to be tiled.
    check_matmul(GgmlType::Q4_1, 576, 1536, 1, 1);
    check_matmul(GgmlType::Q4_K, 1024, 700, 9, 2);
    check_matmul(GgmlType::Q8_0, 576, 900, 17, 3);
}

#[test]
fn batched_tokens_equal_single_token_calls() {
    // 2, 3 and 5 tokens take the 2-, 4- and widest tile kernels (8 tokens
    // on AVX-512, 4 for the K-quant tiles), 9 a chunk of the widest and
    // then a single token.
    for (ty, n_tok) in QUANTISABLE
        .into_iter()
        .flat_map(|ty| [2, 3, 5, 9].map(|n| (ty, n)))
    {
        let (n_in, n_out) = (256, 300);
        let mut rng = Lcg(9);
        let bytes = quantize(ty, &rng.vec(n_in * n_out, 0.1));
        let x = rng.vec(n_in * n_tok, 1.0);
        let w = Weights::new(ty, &bytes, n_in, n_out).unwrap();
        let mut batch = vec![0f32; n_tok * n_out];
        matmul_batch(w, &x, n_tok, &mut batch).unwrap();
        let acts = quantize_acts(dot_type(ty), &x, n_tok, n_in).unwrap();
        let mut shared = vec![0f32; n_tok * n_out];
        matmul_quantized(w, &acts, &mut shared).unwrap();
        assert_eq!(batch, shared, "{ty} n_tok {n_tok}");
        // Q2_K rounds the tokens of a batch taken four at a time as ggml's
        // interleaved kernels do (per half block), Q3_K batches of
        // TILED_BATCH tokens or more as ggml's tiled kernel does: equal up
        // to rounding.
        let grouped = match ty {
            GgmlType::Q2_K => n_tok - n_tok % 4,
            GgmlType::Q3_K if n_tok >= fish_quant::blocks::TILED_BATCH => n_tok,
            _ => 0,
        };
        for t in 0..n_tok {
            let mut one = vec![0f32; n_out];
            matmul_batch(w, &x[t * n_in..(t + 1) * n_in], 1, &mut one).unwrap();
            let batched = &batch[t * n_out..(t + 1) * n_out];
            if t < grouped {
                for (a, b) in one.iter().zip(batched) {
                    assert!(
                        (a - b).abs() <= 1e-5 * a.abs().max(1.0),
                        "{ty} token {t} of {n_tok}"
                    );
                }
            } else {
                assert_eq!(one, batched, "{ty} token {t} of {n_tok}");
            }
        }
    }
}

#[test]
fn shape_errors_are_reported() {
    let bytes = vec![0u8; 18 * 2];
    assert!(Weights::new(GgmlType::Q4_0, &bytes, 32, 3).is_err());
    assert!(Weights::new(GgmlType::Q4_0, &bytes, 48, 1).is_err());
    assert!(Weights::new(GgmlType::Q8_1, &bytes, 32, 1).is_err());
    let w = Weights::new(GgmlType::Q4_0, &bytes, 32, 2).unwrap();
    let mut y = vec![0f32; 2];
    assert!(matmul_batch(w, &[0.0; 31], 1, &mut y).is_err());
    assert!(matmul_batch(w, &[0.0; 32], 1, &mut y[..1]).is_err());
    let acts = quantize_acts(GgmlType::Q8_1, &[0.0; 32], 1, 32).unwrap();
    assert!(matmul_quantized(w, &acts, &mut y).is_err());
    let acts = quantize_acts(GgmlType::Q8_0, &[0.0; 64], 1, 64).unwrap();
    assert!(matmul_quantized(w, &acts, &mut y).is_err());
}
