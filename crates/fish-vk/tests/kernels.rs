//! Every supported type on synthetic tensors against the CPU reference, with
//! row counts and batch sizes that leave partial workgroups and tiles.

mod common;

use common::*;
use fish_gguf::GgmlType;
use fish_vk::{supports, GatedActivation, Kernel, MatmulInput};

/// 512 values: two K-quant super-blocks; 131 rows: odd (a partial matvec
/// workgroup) and not a multiple of the 128-row tile.
const N_IN: usize = 512;
const N_OUT: usize = 131;

#[test]
fn supports_exactly_the_kernel_types() {
    for ty in GgmlType::ALL {
        assert_eq!(supports(ty), KERNEL_TYPES.contains(&ty), "{ty:?}");
    }
}

#[test]
fn every_type_matches_the_cpu_reference() {
    let Some(gpu) = gpu_or_skip() else { return };
    for_each_kernel_type(gpu, N_IN, N_OUT, 100, |w, h| {
        for n_tok in [1usize, 3, 37, 256] {
            let x = random_values(N_IN * n_tok, 7 + n_tok as u64);
            let y = gpu.matmul(h, &x, n_tok).expect("matmul");
            let what = format!("{:?} auto n_tok={n_tok}", w.ty);
            check_auto(gpu, w, &x, n_tok, &y, &what);
        }
    });
    assert_no_validation_messages(gpu);
}

#[test]
fn every_kernel_variant_matches_at_every_batch_size() {
    let Some(gpu) = gpu_or_skip() else { return };
    for_each_kernel_type(gpu, N_IN, N_OUT, 200, |w, h| {
        for kernel in [Kernel::Matvec, Kernel::MatvecSharedReduce, Kernel::Tiled] {
            for n_tok in [1usize, 3, 37] {
                let x = random_values(N_IN * n_tok, 11 + n_tok as u64);
                let y = matmul_one(gpu, h, &x, n_tok, kernel);
                let what = format!("{:?} {kernel:?} n_tok={n_tok}", w.ty);
                check_against_cpu(w, &x, n_tok, &y, &what);
            }
        }
    });
    assert_no_validation_messages(gpu);
}

#[test]
fn batched_matvec_gives_each_token_the_bits_of_a_single_token_call() {
    // Speculative verification and batched decode rely on it: whatever the
    // tokens per pass (one pass of 8, two of 4, ...), each token's sums run
    // in the order of a one-token call.
    let Some(gpu) = gpu_or_skip() else { return };
    // The pre-quantised int8 matvec (x quantised by the host) too, where
    // the device has it: one shape for every batch.
    let int8 = gpu.info().int8_dot != fish_vk::Int8Dot::Absent;
    for_each_kernel_type(gpu, N_IN, N_OUT, 300, |w, h| {
        let quantised = !matches!(w.ty, GgmlType::F32 | GgmlType::F16);
        let mut kernels = vec![Kernel::Matvec];
        if int8 && quantised {
            kernels.push(Kernel::MatvecInt8Prequantised);
        }
        for kernel in kernels {
            for n_tok in [5usize, 8] {
                let x = random_values(N_IN * n_tok, 21 + n_tok as u64);
                let batched = matmul_one(gpu, h, &x, n_tok, kernel);
                for t in 0..n_tok {
                    let single = matmul_one(gpu, h, &x[t * N_IN..(t + 1) * N_IN], 1, kernel);
                    let row = &batched[t * N_OUT..(t + 1) * N_OUT];
                    assert!(
                        row.iter()
                            .zip(&single)
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{:?} {kernel:?} n_tok={n_tok} token {t}: batched and single-token sums differ",
                        w.ty
                    );
                }
            }
        }
    });
    assert_no_validation_messages(gpu);
}

#[test]
fn long_rows_match_the_cpu_reference() {
    // Rows above 2048 values take another matvec shape than N_IN's
    // (kernels.rs, MatvecShape::new): cover it for every type.
    let Some(gpu) = gpu_or_skip() else { return };
    let n_in = 4096;
    for_each_kernel_type(gpu, n_in, N_OUT, 400, |w, h| {
        for n_tok in [1usize, 3] {
            let x = random_values(n_in * n_tok, 17 + n_tok as u64);
            let y = matmul_one(gpu, h, &x, n_tok, Kernel::Matvec);
            let what = format!("{:?} n_in={n_in} n_tok={n_tok}", w.ty);
            check_against_cpu(w, &x, n_tok, &y, &what);
        }
    });
    assert_no_validation_messages(gpu);
}

/// act(gate) * up as the span's act*mul computes it (shaders/gated_act.glsl).
fn gated_reference(gate_up: &[f32], act: GatedActivation) -> Vec<f32> {
    let (gate, up) = gate_up.split_at(gate_up.len() / 2);
    gate.iter()
        .zip(up)
        .map(|(&g, &u)| {
            let a = match act {
                GatedActivation::Silu => g / (1.0 + (-g).exp()),
                GatedActivation::Gelu => {
                    let t = (0.797_884_6 * g * (1.0 + 0.044_715 * g * g)).clamp(-10.0, 10.0);
                    0.5 * g * (1.0 + t.tanh())
                }
            };
            a * u
        })
        .collect()
}

#[test]
fn gated_matvec_applies_the_activation_as_it_reads_x() {
    let Some(gpu) = gpu_or_skip() else { return };
    if !gpu.info().subgroup_arithmetic {
        assert!(!require_gpu(), "the gated matvec needs subgroup arithmetic");
        return;
    }
    for_each_kernel_type(gpu, N_IN, N_OUT, 300, |w, h| {
        for act in [GatedActivation::Silu, GatedActivation::Gelu] {
            for n_tok in [1usize, 3] {
                // Gate values over the activation's curved range, then up values.
                let gate_up: Vec<f32> = random_values(2 * N_IN * n_tok, 13 + n_tok as u64)
                    .iter()
                    .map(|v| 4.0 * v)
                    .collect();
                let y = matmul_one(gpu, h, &gate_up, n_tok, Kernel::MatvecGated(act));
                let what = format!("{:?} gated {act:?} n_tok={n_tok}", w.ty);
                check_against_cpu(w, &gated_reference(&gate_up, act), n_tok, &y, &what);
            }
        }
    });
    assert_no_validation_messages(gpu);
}

#[test]
fn matmul_group_runs_several_weights_on_one_input() {
    let Some(gpu) = gpu_or_skip() else { return };
    let shapes = [
        (GgmlType::Q4_K, 96usize),
        (GgmlType::Q8_0, 33),
        (GgmlType::Q6_K, 130),
    ];
    let weights: Vec<_> = shapes
        .iter()
        .enumerate()
        .map(|(i, &(ty, n_out))| {
            (
                ty,
                n_out,
                synthetic_weights(ty, N_IN, n_out, 300 + i as u64),
            )
        })
        .collect();
    let handles: Vec<_> = weights
        .iter()
        .map(|(ty, n_out, w)| gpu.upload(*ty, w, N_IN, *n_out).expect("upload"))
        .collect();
    for n_tok in [1usize, 37] {
        let x = random_values(N_IN * n_tok, 17);
        let ys = gpu.matmul_group(&handles, &x, n_tok).expect("group");
        assert_eq!(ys.len(), 3);
        for ((ty, n_out, w), y) in weights.iter().zip(&ys) {
            check_auto(
                gpu,
                &Weights {
                    ty: *ty,
                    bytes: w,
                    n_in: N_IN,
                    n_out: *n_out,
                },
                &x,
                n_tok,
                y,
                &format!("group {ty:?} n_tok={n_tok}"),
            );
        }
    }
    for h in handles {
        gpu.free(h).expect("free");
    }
    assert_no_validation_messages(gpu);
}

#[test]
fn bad_inputs_are_errors_not_panics() {
    let Some(gpu) = gpu_or_skip() else { return };
    let w = synthetic_weights(GgmlType::Q4_0, 64, 4, 1);
    assert!(
        gpu.upload(GgmlType::Q2_K, &w, 256, 1).is_err(),
        "unsupported type"
    );
    assert!(
        gpu.upload(GgmlType::Q4_0, &w[1..], 64, 4).is_err(),
        "short data"
    );
    assert!(
        gpu.upload(GgmlType::F32, &[0u8; 4 * 20], 20, 1).is_err(),
        "rows of 20 values"
    );
    let h = gpu.upload(GgmlType::Q4_0, &w, 64, 4).expect("upload");
    assert!(gpu.matmul(h, &[0.0; 63], 1).is_err(), "x too short");
    assert!(gpu.matmul(h, &[], 0).is_err(), "no tokens");
    let other = gpu
        .upload(
            GgmlType::Q4_0,
            &synthetic_weights(GgmlType::Q4_0, 32, 1, 2),
            32,
            1,
        )
        .expect("upload");
    assert!(
        gpu.matmul_group(&[h, other], &[0.0; 64], 1).is_err(),
        "mixed row lengths"
    );
    gpu.free(h).expect("free");
    assert!(gpu.free(h).is_err(), "double free");
    assert!(gpu.matmul(h, &[0.0; 64], 1).is_err(), "freed handle");
    gpu.free(other).expect("free");
    assert_no_validation_messages(gpu);
}

/// The int8-activation matvecs of every quantised type, at one token, a
/// batch and more tokens than one pass holds; rows of 512 and of 14336
/// values (a down projection: the largest shared-memory need). The kernel
/// on pre-quantised x gets it quantised by the host, as `Auto` does for
/// lone matvecs.
#[test]
fn int8_matvec_matches_the_product_with_int8_activations() {
    const INT8_KERNELS: [Kernel; 2] = [Kernel::MatvecInt8, Kernel::MatvecInt8Prequantised];
    let Some(gpu) = gpu_or_skip() else { return };
    if gpu.info().int8_dot == fish_vk::Int8Dot::Absent {
        assert!(
            !require_gpu(),
            "FISH_REQUIRE_GPU=1 but no packed int8 dot products"
        );
        eprintln!("skipped: no packed int8 dot products");
        return;
    }
    let quantised = KERNEL_TYPES
        .into_iter()
        .filter(|t| !matches!(t, GgmlType::F32 | GgmlType::F16));
    for (i, ty) in quantised.enumerate() {
        for (n_in, n_out, batches) in [
            (N_IN, N_OUT, &[1usize, 3, 37][..]),
            (14336, 9, &[1, 2, 5][..]),
        ] {
            with_uploaded(gpu, ty, (n_in, n_out), 300 + i as u64, |weights, h| {
                for &n_tok in batches {
                    let x = random_values(n_in * n_tok, 13 + n_tok as u64);
                    for kernel in INT8_KERNELS {
                        let y = matmul_one(gpu, h, &x, n_tok, kernel);
                        let what = format!("{ty:?} {kernel:?} {n_in} n_tok={n_tok}");
                        check_int8_product(weights, &x, n_tok, &y, &what);
                    }
                }
            });
        }
    }
    assert_no_validation_messages(gpu);
}

/// The int8 matvecs on the matrix units a test runs: the emulated kernel
/// on any device, the real one where the device has int8 fragments
/// (FISH_REQUIRE_INT8_MATRIX=1 makes their absence a failure).
fn int8_matrix_kernels(gpu: &fish_vk::Gpu) -> Vec<Kernel> {
    let mut kernels = vec![Kernel::MatvecInt8MatrixEmulated];
    match gpu.info().int8_matrix {
        Some(_) => kernels.push(Kernel::MatvecInt8Matrix),
        None => {
            assert!(
                std::env::var("FISH_REQUIRE_INT8_MATRIX").as_deref() != Ok("1"),
                "FISH_REQUIRE_INT8_MATRIX=1 but no int8 fragments"
            );
            eprintln!("real kernel skipped: no int8 fragments on the matrix units");
        }
    }
    kernels
}

/// `kernel`'s product of `h` (`weights`, n_in x n_out) with `n_tok` tokens
/// of x against the product with int8 activations (with the f16 form's
/// roundings for Q4_K and Q6_K), and each token of a batch the bits of its
/// one-token call.
fn check_int8_matrix_matvec(
    gpu: &fish_vk::Gpu,
    (weights, h): (&Weights<'_>, fish_vk::TensorHandle),
    x: &[f32],
    n_tok: usize,
    kernel: Kernel,
    what: &str,
) {
    check_int8_matrix_matvec_on(gpu, (weights, h), x, n_tok, kernel, MatmulInput::F32, what);
}

/// `check_int8_matrix_matvec` on x uploaded as `input` (f16: the Q4_K /
/// Q6_K form's X_F16 modules, checked with `check_f16_x_matrix_product`).
fn check_int8_matrix_matvec_on(
    gpu: &fish_vk::Gpu,
    (weights, h): (&Weights<'_>, fish_vk::TensorHandle),
    x: &[f32],
    n_tok: usize,
    kernel: Kernel,
    input: MatmulInput,
    what: &str,
) {
    let (n_in, n_out) = (weights.n_in, weights.n_out);
    let run = |x: &[f32], n_tok: usize| {
        gpu.matmul_group_on(&[h], x, n_tok, kernel, input)
            .unwrap_or_else(|e| panic!("{what}: {e}"))
            .remove(0)
    };
    let y = run(x, n_tok);
    match (input, weights.ty) {
        (MatmulInput::F16, _) => check_f16_x_matrix_product(weights, x, n_tok, &y, what),
        (_, GgmlType::Q4_K | GgmlType::Q6_K) => check_int8_f16_product(weights, x, n_tok, &y, what),
        _ => check_int8_product(weights, x, n_tok, &y, what),
    }
    if n_tok == 1 {
        return;
    }
    for t in 0..n_tok {
        let xt = &x[t * n_in..(t + 1) * n_in];
        let single = run(xt, 1);
        let row = &y[t * n_out..(t + 1) * n_out];
        assert!(
            row.iter()
                .zip(&single)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{what} token {t}: batched and single-token sums differ"
        );
    }
}

/// The unstaged int8 matrix kernel with two row fragments per subgroup
/// (int8_matrix.rs `default_row_frags`: dispatches of 1024 subgroups or
/// more): 32785 rows of one super-block give 1025 subgroups, the last
/// workgroup holding one live row. Checked as every int8 matrix matvec
/// (`check_int8_matrix_matvec`).
#[test]
fn int8_matrix_matvec_with_two_row_fragments_matches() {
    let Some(gpu) = gpu_or_skip() else { return };
    let kernels = int8_matrix_kernels(gpu);
    let shape = (256, 32 * 1024 + 17);
    for (i, ty) in [GgmlType::Q4_K, GgmlType::Q6_K].into_iter().enumerate() {
        with_uploaded(gpu, ty, shape, 900 + i as u64, |weights, h| {
            let n_tok = 3;
            let x = random_values(shape.0 * n_tok, 77);
            for &kernel in &kernels {
                let what = format!("{ty:?} {kernel:?} two row fragments");
                check_int8_matrix_matvec(gpu, (weights, h), &x, n_tok, kernel, &what);
            }
        });
    }
    assert_no_validation_messages(gpu);
}

/// The int8 matvec on the matrix units (shaders/matvec_i8mm.comp) against
/// the product with int8 activations, for every quantised type, with
/// batches over one and two passes, and each token of a batch the bits of
/// its one-token call (`int8_matrix_kernels`, `check_int8_matrix_matvec`).
#[test]
fn int8_matrix_matvec_matches_the_product_with_int8_activations() {
    let Some(gpu) = gpu_or_skip() else { return };
    let quantised = KERNEL_TYPES
        .into_iter()
        .filter(|t| !matches!(t, GgmlType::F32 | GgmlType::F16));
    for_each_matrix_case(
        gpu,
        quantised,
        (500, 31),
        |weights, h, x, n_tok, kernel, what| {
            check_int8_matrix_matvec(gpu, (weights, h), x, n_tok, kernel, what);
        },
    );
    assert_no_validation_messages(gpu);
}

/// Runs `check(weights, handle, x, n_tok, kernel, what)` for every int8
/// matrix kernel (`int8_matrix_kernels`) on each of `types`, uploaded with
/// seed `seeds.0` plus its index, at rows of N_IN values with batches of
/// one and two passes (1, 3, 11 tokens) and at a down projection's 14336
/// values (2 tokens); x from seed `seeds.1` plus the tokens.
fn for_each_matrix_case(
    gpu: &fish_vk::Gpu,
    types: impl IntoIterator<Item = GgmlType>,
    seeds: (u64, u64),
    check: impl Fn(&Weights<'_>, fish_vk::TensorHandle, &[f32], usize, Kernel, &str),
) {
    let kernels = int8_matrix_kernels(gpu);
    for (i, ty) in types.into_iter().enumerate() {
        for (n_in, n_out, batches) in [(N_IN, N_OUT, &[1usize, 3, 11][..]), (14336, 9, &[2][..])] {
            with_uploaded(gpu, ty, (n_in, n_out), seeds.0 + i as u64, |weights, h| {
                for &n_tok in batches {
                    let x = random_values(n_in * n_tok, seeds.1 + n_tok as u64);
                    for &kernel in &kernels {
                        let what = format!("{ty:?} {kernel:?} {n_in} n_tok={n_tok}");
                        check(weights, h, &x, n_tok, kernel, &what);
                    }
                }
            });
        }
    }
}

/// The matrix kernel's Q4_K / Q6_K form on x in f16 (`MatmulInput::F16`,
/// modules matvec_i8mm_x16_* and matvec_i8mm_emu_x16_*: a batched decode
/// step's stages write it so) against the CPU product, with batches over
/// one and two passes and each token of a batch the bits of its one-token
/// call; the staged types refuse f16 x.
#[test]
fn int8_matrix_matvec_on_f16_x_matches_the_cpu() {
    let Some(gpu) = gpu_or_skip() else { return };
    let f16_x = MatmulInput::F16;
    let types = [GgmlType::Q4_K, GgmlType::Q6_K];
    for_each_matrix_case(
        gpu,
        types,
        (700, 41),
        |weights, h, x, n_tok, kernel, what| {
            let what = format!("{what} f16 x");
            check_int8_matrix_matvec_on(gpu, (weights, h), x, n_tok, kernel, f16_x, &what);
        },
    );
    let kernels = int8_matrix_kernels(gpu);
    with_uploaded(gpu, GgmlType::Q8_0, (N_IN, N_OUT), 710, |_, h| {
        let x = vec![0.5f32; N_IN * 2];
        for &kernel in &kernels {
            let refused = gpu.matmul_group_on(&[h], &x, 2, kernel, f16_x);
            assert!(refused.is_err(), "{kernel:?} took f16 x for Q8_0");
        }
    });
    assert_no_validation_messages(gpu);
}
