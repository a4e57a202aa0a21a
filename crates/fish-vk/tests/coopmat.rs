//! The cooperative-matrix prefill kernel against the CPU reference, for every
//! weight type, at batch sizes and row counts that leave partial tiles.
//!
//! The kernel multiplies f16-rounded weights and inputs and accumulates in
//! f32. Each output is checked twice: against the product of the f16-rounded
//! values (computed in f64) within 1e-3 * sum|w||x| / n_out, which only the
//! accumulation error may use, and against the exact product of the
//! dequantised weights within 2^-10 * sum|w||x|, the bound that rounding
//! both factors of every term to f16 guarantees.
//!
//! The emulated variant (plain code in place of the matrix instructions) runs
//! on every device, lavapipe included; the real one where the device has
//! cooperative matrices (the H200), and FISH_REQUIRE_COOPMAT=1 makes its
//! absence a failure. The real one runs every type under every staging
//! (synchronous, software-pipelined, two steps ahead), which must give the
//! same bits; the emulated one does so for STAGED_EMULATED_TYPES and runs
//! the synchronous staging on the others (coopmat_checks::stagings_for).

mod common;
mod coopmat_checks;

use common::*;
use coopmat_checks::*;
use fish_gguf::GgmlType;
use fish_quant::fq3::{dequant_row_fq3, quantize_row_fq3, FQ3_BLOCK_BYTES, FQ3_BLOCK_VALUES};
use fish_vk::{Gpu, Kernel, WeightFormat};

/// 512 values: two K-quant super-blocks, sixteen 32-value steps.
const N_IN: usize = 512;
/// Not a multiple of any tile height: partial row tiles.
const N_OUT: usize = 300;
/// 37: one partial token tile; 256: whole tiles of 128 (and 64).
const TOKENS: [usize; 2] = [37, 256];

/// One synthetic matrix of `ty` uploaded, checked at `n_tok` tokens, freed.
fn check_one(
    gpu: &Gpu,
    kernel: Kernel,
    ty: GgmlType,
    (n_in, n_out): (usize, usize),
    n_tok: usize,
    (w_seed, x_seed): (u64, u64),
    what: &str,
) {
    let stagings = stagings_for(kernel, ty, &STAGINGS);
    with_uploaded(gpu, ty, (n_in, n_out), w_seed, |weights, h| {
        multiply_and_check(gpu, kernel, h, weights, n_tok, x_seed, what, &stagings);
    });
}

fn check_every_type(gpu: &Gpu, kernel: Kernel) {
    check_every_type_staged(gpu, kernel, &STAGINGS);
}

fn check_every_type_staged(gpu: &Gpu, kernel: Kernel, stagings: &[fish_vk::Staging]) {
    check_types_staged(gpu, kernel, stagings, &KERNEL_TYPES);
}

fn check_types_staged(
    gpu: &Gpu,
    kernel: Kernel,
    stagings: &[fish_vk::Staging],
    types: &[GgmlType],
) {
    // Seeds by the type's index in KERNEL_TYPES, as for_each_kernel_type gives them.
    let chosen = KERNEL_TYPES
        .into_iter()
        .enumerate()
        .filter(|(_, ty)| types.contains(ty));
    for (i, ty) in chosen {
        with_uploaded(gpu, ty, (N_IN, N_OUT), 500 + i as u64, |w, h| {
            let stagings = stagings_for(kernel, w.ty, stagings);
            for n_tok in TOKENS {
                let what = format!("{:?} n_tok={n_tok}", w.ty);
                multiply_and_check(
                    gpu,
                    kernel,
                    h,
                    w,
                    n_tok,
                    40 + n_tok as u64,
                    &what,
                    &stagings,
                );
            }
        });
    }
    assert_no_validation_messages(gpu);
}

#[test]
fn emulated_coopmat_kernel_matches_the_cpu_for_every_type() {
    let Some(gpu) = gpu_or_skip() else { return };
    check_every_type(gpu, Kernel::CoopMatEmulated);
}

/// The stagings of `tile` whose doubled tiles fit the device (on
/// lavapipe's 32 KiB the wide tile's synchronous one only).
fn fitting_stagings(gpu: &Gpu, tile: &fish_vk::CoopMatTile) -> Vec<fish_vk::Staging> {
    STAGINGS
        .into_iter()
        .filter(|&s| tile.with_staging(s, gpu.info().max_shared_memory).is_ok())
        .collect()
}

/// The emulated wide tile on STAGED_EMULATED_TYPES: it decodes through the
/// same code as the default tile, which every type runs, and each type is a
/// pipeline lavapipe compiles at its first dispatch (the real wide tile
/// runs every type in `coopmat_kernel_matches_the_cpu_for_every_type`).
#[test]
fn emulated_wide_tile_matches_the_cpu() {
    let Some(gpu) = gpu_or_skip() else { return };
    gpu.with_wide_tiles(true, || {
        let tile = gpu
            .plan_tile_for(Kernel::CoopMatEmulated, (N_IN, N_OUT), 256)
            .expect("plan")
            .expect("a cooperative tile");
        assert_eq!(
            (tile.rows(), tile.tokens()),
            (128, 128),
            "{}",
            tile.describe()
        );
        let stagings = fitting_stagings(gpu, &tile);
        eprintln!("wide tile {}: {stagings:?}", tile.describe());
        check_types_staged(
            gpu,
            Kernel::CoopMatEmulated,
            &stagings,
            &STAGED_EMULATED_TYPES,
        );
    });
}

/// One synthetic `ty` matrix of `shape` (n_in, n_out) at `n_tok` tokens
/// through `kernel` under every staging that fits the tile its plan takes
/// (at least one must), each result within the bounds.
fn check_fitting_stagings(
    gpu: &Gpu,
    kernel: Kernel,
    ty: GgmlType,
    shape: (usize, usize),
    n_tok: usize,
    (w_seed, x_seed): (u64, u64),
    what: &str,
) {
    let tile = gpu
        .plan_tile_for(kernel, shape, n_tok)
        .expect("plan")
        .expect("a cooperative tile");
    let stagings = stagings_for(kernel, ty, &fitting_stagings(gpu, &tile));
    with_uploaded(gpu, ty, shape, w_seed, |weights, h| {
        let ran = multiply_and_check(gpu, kernel, h, weights, n_tok, x_seed, what, &stagings);
        assert!(ran > 0, "{what}: no staging ran");
    });
}

#[test]
fn wide_tiles_split_across_workgroups_match_the_cpu() {
    // 8192 values are 256 steps; 70 rows x 19 tokens are one wide tile, so
    // its steps split 2 ways (split_k.rs SplitRule::wide: 128 steps or more
    // each) and the last workgroup sums the partials. The real wide tile
    // runs too where the device has it.
    let Some(gpu) = gpu_or_skip() else { return };
    let mut kernels = vec![Kernel::CoopMatEmulated];
    if gpu.coopmat_wide_tile().is_some() {
        kernels.push(Kernel::CoopMat);
    }
    gpu.with_wide_tiles(true, || {
        for kernel in kernels {
            for ty in [GgmlType::Q4_K, GgmlType::Q8_0, GgmlType::F16] {
                let what = format!("{ty:?} wide split");
                check_fitting_stagings(gpu, kernel, ty, (8192, 70), 19, (920, 921), &what);
            }
        }
    });
    assert_no_validation_messages(gpu);
}

#[test]
fn prefill_plans_take_the_wide_tile_only_where_it_fills_the_device() {
    let Some(gpu) = gpu_or_skip() else { return };
    let rows_of = |n_in, n_rows, n_tok| {
        gpu.plan_tile_for(Kernel::CoopMatEmulated, (n_in, n_rows), n_tok)
            .expect("plan")
            .map(|t| t.rows())
    };
    // gate/up of llama-8b at 512 tokens: 448 wide workgroups.
    assert_eq!(rows_of(4096, 14336, 512), Some(128));
    // wo: 128 wide workgroups, whose 128 steps are too few to split.
    assert_eq!(rows_of(4096, 4096, 512), Some(64));
    // down: 128 wide workgroups, whose 448 steps split in two.
    assert_eq!(rows_of(14336, 4096, 512), Some(128));
    // 2048 rows at 512 tokens: 64, below the split's minimum of 96.
    assert_eq!(rows_of(14336, 2048, 512), Some(64));
    // Fewer tokens than a wide tile holds: half of it would be zeros.
    assert_eq!(rows_of(4096, 14336, 64), Some(64));
    // Forced either way.
    assert_eq!(
        gpu.with_wide_tiles(true, || rows_of(4096, 4096, 64)),
        Some(128)
    );
    assert_eq!(
        gpu.with_wide_tiles(false, || rows_of(4096, 14336, 512)),
        Some(64)
    );
}

#[test]
fn coopmat_kernel_matches_the_cpu_for_every_type() {
    let Some(gpu) = gpu_or_skip() else { return };
    match gpu.coopmat_tile_in_use() {
        Some(tile) => eprintln!("tile: {}", tile.describe()),
        None if require_coopmat() => {
            panic!("FISH_REQUIRE_COOPMAT=1 but {} has none", gpu.info().name)
        }
        None => {
            eprintln!("skipped: {} has no cooperative matrices", gpu.info().name);
            return;
        }
    }
    check_every_type(gpu, Kernel::CoopMat);
    // The wide prefill tile, where the device holds it.
    if let Some(wide) = gpu.coopmat_wide_tile() {
        eprintln!("wide tile: {}", wide.describe());
        gpu.with_wide_tiles(true, || check_every_type(gpu, Kernel::CoopMat));
    }
    // The batched-decode tile (16 tokens, 128-value steps) on the same set.
    let batch = gpu
        .coopmat_batch_tile()
        .expect("a device with the prefill tile holds the batch tile");
    eprintln!("batch tile: {}", batch.describe());
    check_every_type(gpu, Kernel::CoopMatBatch);
}

/// x arriving in f16 (`MatmulInput::F16`, modules coopmat_x16_* and
/// coopmat_emu_x16_*: a span's norm writes it so before prefill matmuls),
/// on the default and the wide tile under every staging that fits: the
/// emulated kernel on three types (it is slow on lavapipe), the real one
/// on every type where the device has cooperative matrices.
#[test]
fn f16_input_matches_the_cpu() {
    let Some(gpu) = gpu_or_skip() else { return };
    let f16_x = fish_vk::MatmulInput::F16;
    // The staged kernel: Q4_K and Q6_K take fragments built in registers
    // where the device runs them (tests/frags.rs checks those).
    let check = |kernel: Kernel, ty: GgmlType, n_tok: usize| {
        for wide in [false, true] {
            let what = format!("{ty:?} n_tok={n_tok} f16 x wide={wide}");
            let seeds = (510, 60 + n_tok as u64);
            gpu.with_prefill_frags(false, || {
                gpu.with_wide_tiles(wide, || {
                    with_input(f16_x, || {
                        check_fitting_stagings(gpu, kernel, ty, (N_IN, N_OUT), n_tok, seeds, &what)
                    })
                })
            });
        }
    };
    for ty in [GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::F32] {
        check(Kernel::CoopMatEmulated, ty, 37);
    }
    if gpu.coopmat_tile_in_use().is_some() {
        for ty in KERNEL_TYPES {
            for n_tok in TOKENS {
                check(Kernel::CoopMat, ty, n_tok);
            }
        }
    }
    // Kernels that read f32 refuse it.
    with_uploaded(gpu, GgmlType::Q4_K, (N_IN, N_OUT), 511, |_, h| {
        let x = vec![0.5f32; N_IN * 2];
        let err = gpu.matmul_group_on(&[h], &x, 2, Kernel::Matvec, f16_x);
        assert!(err.is_err(), "the matvec took f16 input");
    });
    assert_no_validation_messages(gpu);
}

#[test]
fn wide_rows_stay_within_the_f16_bounds() {
    // 4096 values (the width of 8B-class models) and a row count that is
    // neither a tile multiple nor below one tile.
    let Some(gpu) = gpu_or_skip() else { return };
    let kernel = match gpu.coopmat_tile_in_use() {
        Some(_) => Kernel::CoopMat,
        None => Kernel::CoopMatEmulated,
    };
    for ty in [GgmlType::Q4_K, GgmlType::F16] {
        let what = format!("{ty:?} 4096 wide");
        check_one(gpu, kernel, ty, (4096, 136), 37, (900, 901), &what);
    }
    assert_no_validation_messages(gpu);
}

#[test]
fn rows_of_an_odd_number_of_32_value_steps_are_complete() {
    // 544 = 17 x 32 values: with FISH_VK_COOPMAT_BK=64 or 128 the last step
    // is partly past the row's end and must count as zeros.
    let Some(gpu) = gpu_or_skip() else { return };
    let mut kernels = vec![Kernel::CoopMatEmulated];
    if gpu.coopmat_tile_in_use().is_some() {
        kernels.push(Kernel::CoopMat);
    }
    for kernel in kernels {
        for ty in [GgmlType::Q8_0, GgmlType::F16] {
            let what = format!("{ty:?} 544 wide");
            check_one(gpu, kernel, ty, (544, 70), 19, (31, 32), &what);
        }
    }
    assert_no_validation_messages(gpu);
}

#[test]
fn both_stagings_handle_odd_step_counts_single_steps_and_unaligned_rows() {
    // The pipelined staging alternates between two tiles: 17 steps end on
    // the first one, a single step never fetches ahead, and 70 rows leave
    // a partial row tile. K-quant rows are whole 256-value blocks, so their
    // step counts are even; 768 values (three blocks) cross block borders
    // in the middle of a super-block pair.
    let Some(gpu) = gpu_or_skip() else { return };
    let mut kernels = vec![Kernel::CoopMatEmulated];
    if gpu.coopmat_tile_in_use().is_some() {
        kernels.push(Kernel::CoopMat);
    }
    for kernel in kernels {
        for (i, ty) in KERNEL_TYPES.into_iter().enumerate() {
            let widths: &[usize] = if ty.block_size() == 256 {
                &[768]
            } else {
                &[544, 32]
            };
            for &n_in in widths {
                let what = format!("{ty:?} {n_in} wide");
                let seeds = (1000 + i as u64, 2000 + n_in as u64);
                check_one(gpu, kernel, ty, (n_in, 70), 41, seeds, &what);
            }
        }
    }
    assert_no_validation_messages(gpu);
}

#[test]
fn fq3_weights_match_the_cpu_under_every_staging() {
    // FQ3 is no GGUF type: the references use the rows fish-quant decodes
    // (as F32 weights), which the kernel rounds to f16 as it does any type.
    let Some(gpu) = gpu_or_skip() else { return };
    let (n_in, n_out) = (3 * FQ3_BLOCK_VALUES, 70);
    let values = random_values(n_in * n_out, 3131);
    let row_bytes = n_in / FQ3_BLOCK_VALUES * FQ3_BLOCK_BYTES;
    let mut fq3 = vec![0u8; row_bytes * n_out];
    let mut decoded = vec![0f32; n_in * n_out];
    for ((src, dst), back) in values
        .chunks_exact(n_in)
        .zip(fq3.chunks_exact_mut(row_bytes))
        .zip(decoded.chunks_exact_mut(n_in))
    {
        quantize_row_fq3(src, dst).expect("quantise");
        dequant_row_fq3(dst, back).expect("dequant");
    }
    let decoded_bytes: Vec<u8> = decoded.iter().flat_map(|v| v.to_le_bytes()).collect();
    let weights = Weights {
        ty: GgmlType::F32,
        bytes: &decoded_bytes,
        n_in,
        n_out,
    };
    let h = gpu
        .upload(WeightFormat::Fq3, &fq3, n_in, n_out)
        .expect("upload");
    let mut kernels = vec![Kernel::CoopMatEmulated];
    if gpu.coopmat_tile_in_use().is_some() {
        kernels.push(Kernel::CoopMat);
    }
    for kernel in kernels {
        multiply_and_check(
            gpu,
            kernel,
            h,
            &weights,
            41,
            3132,
            "FQ3 768 wide",
            &STAGINGS,
        );
    }
    gpu.free(h).expect("free");
    assert_no_validation_messages(gpu);
}

#[test]
fn prefill_uses_the_plain_tile_exactly_without_cooperative_matrices() {
    let Some(gpu) = gpu_or_skip() else { return };
    let n_tok = 256;
    let expected = match gpu.coopmat_tile_in_use() {
        Some(tile) if n_tok >= tile.tokens() as usize => Kernel::CoopMat,
        _ => Kernel::Tiled,
    };
    assert_eq!(gpu.prefill_kernel(n_tok), expected);
    // Below one cooperative tile of tokens the plain tile stays.
    assert_eq!(gpu.prefill_kernel(37), Kernel::Tiled);
    let ty = GgmlType::Q4_K;
    let w = synthetic_weights(ty, N_IN, N_OUT, 77);
    let h = gpu.upload(ty, &w, N_IN, N_OUT).expect("upload");
    let x = random_values(N_IN * n_tok, 78);
    // matmul() picks the prefill kernel above the matvec batch sizes, with
    // results identical to asking for that kernel.
    let auto = gpu.matmul(h, &x, n_tok).expect("auto");
    let chosen = matmul_one(gpu, h, &x, n_tok, expected);
    assert!(
        auto.iter()
            .zip(&chosen)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "matmul() differs from {expected:?}"
    );
    gpu.free(h).expect("free");
    assert_no_validation_messages(gpu);
}

#[test]
fn asking_for_coopmat_without_it_is_an_error() {
    let Some(gpu) = gpu_or_skip() else { return };
    if gpu.coopmat_tile_in_use().is_some() {
        return;
    }
    let ty = GgmlType::Q8_0;
    let w = synthetic_weights(ty, 64, 8, 5);
    let h = gpu.upload(ty, &w, 64, 8).expect("upload");
    let err = gpu
        .matmul_group_with(&[h], &[0.5; 64 * 9], 9, Kernel::CoopMat)
        .unwrap_err();
    assert!(err.to_string().contains("cooperative"), "{err}");
    gpu.free(h).expect("free");
}
