//! The cooperative-matrix kernels' checks shared by tests/coopmat.rs,
//! tests/coopmat_split.rs and tests/coopmat_stream.rs: one product under
//! several stagings, against the f16-rounded CPU product and bit for bit
//! between the stagings.
#![allow(dead_code)]

use crate::common::*;
use fish_gguf::GgmlType;
use fish_vk::{CoopMatTile, Gpu, Kernel, MatmulInput, Staging, TensorHandle, VkError};

pub fn require_coopmat() -> bool {
    std::env::var("FISH_REQUIRE_COOPMAT").as_deref() == Ok("1")
}

/// A tile chosen through FISH_VK_COOPMAT_TILE / _BK (or the batch tile's
/// FISH_VK_BATCH_TILE / _BK) may fit the device's shared memory once but not
/// twice (pipelined); the default tiles must fit both ways.
pub fn tile_overridden() -> bool {
    [
        "FISH_VK_COOPMAT_TILE",
        "FISH_VK_COOPMAT_BK",
        "FISH_VK_BATCH_TILE",
        "FISH_VK_BATCH_BK",
    ]
    .iter()
    .any(|v| std::env::var_os(v).is_some())
}

thread_local! {
    /// How multiply_and_check uploads x (with_input).
    static INPUT: std::cell::Cell<MatmulInput> = const { std::cell::Cell::new(MatmulInput::F32) };
}

/// Runs `f` with multiply_and_check uploading x as `input` (f16: rounded on
/// the host, which the f32 path does in staging, so the same bounds hold).
pub fn with_input<R>(input: MatmulInput, f: impl FnOnce() -> R) -> R {
    let before = INPUT.with(|i| i.replace(input));
    let result = f();
    INPUT.with(|i| i.set(before));
    result
}

/// The three workgroup stagings, synchronous (the reference) first.
pub const STAGINGS: [Staging; 3] = CoopMatTile::STAGINGS;

/// The types whose emulated products run under every staging: a 32-value
/// type of odd block size (22 bytes, so staged loads are unaligned), a
/// K-quant and a float type. The stagings only reorder the loads of the
/// decode every type shares, while each (type, staging) pair is a pipeline
/// of its own that lavapipe compiles with LLVM at its first dispatch
/// (10-45 s on two cores, the larger part of a CI run from a cold shader
/// cache). The real kernels, where the device has them, run every pair.
pub const STAGED_EMULATED_TYPES: [GgmlType; 3] = [GgmlType::Q5_0, GgmlType::Q4_K, GgmlType::F16];

/// The stagings of `stagings` that `kernel` runs on `ty`: all of them,
/// except that the emulated kernels take only the first (the reference)
/// for types outside STAGED_EMULATED_TYPES.
pub fn stagings_for(kernel: Kernel, ty: GgmlType, stagings: &[Staging]) -> Vec<Staging> {
    let emulated = matches!(
        kernel,
        Kernel::CoopMatEmulated | Kernel::CoopMatBatchEmulated
    );
    if emulated && !STAGED_EMULATED_TYPES.contains(&ty) {
        stagings[..1].to_vec()
    } else {
        stagings.to_vec()
    }
}

/// Multiplies `n_tok` random inputs (seeded by `x_seed`) by the resident
/// copy `h` of `weights` with `kernel` under each of `stagings`
/// (STAGINGS for the three workgroup stagings), checks each
/// result against both references and the stagings against the first bit
/// for bit; returns how many ran (a staging whose tile does not fit an
/// overridden tile's shared memory is skipped).
#[allow(clippy::too_many_arguments)]
pub fn multiply_and_check(
    gpu: &Gpu,
    kernel: Kernel,
    h: TensorHandle,
    weights: &Weights<'_>,
    n_tok: usize,
    x_seed: u64,
    what: &str,
    stagings: &[Staging],
) -> usize {
    let input = INPUT.with(std::cell::Cell::get);
    let x = random_values(weights.n_in * n_tok, x_seed);
    let mut first: Option<Vec<f32>> = None;
    let mut ran = 0;
    for &staging in stagings {
        let what = format!("{what} {kernel:?} {staging:?}");
        let y = match gpu.with_coopmat_staging(staging, || {
            gpu.matmul_group_on(&[h], &x, n_tok, kernel, input)
        }) {
            Ok(mut ys) => ys.remove(0),
            Err(VkError::KernelUnavailable(why))
                if tile_overridden() && why.contains("shared memory") =>
            {
                eprintln!("{what}: skipped, {why}");
                continue;
            }
            Err(e) => panic!("{what}: {e}"),
        };
        check_f16_product(weights, &x, n_tok, &y, &what);
        match &first {
            None => first = Some(y),
            Some(reference) => assert_same_bits(reference, &y, &what),
        }
        ran += 1;
    }
    ran
}

pub fn assert_same_bits(reference: &[f32], y: &[f32], what: &str) {
    assert_eq!(reference.len(), y.len(), "{what}: length");
    let differing = reference
        .iter()
        .zip(y)
        .position(|(a, b)| a.to_bits() != b.to_bits());
    if let Some(i) = differing {
        panic!(
            "{what}: output {i} is {} where the first staging gave {}",
            y[i], reference[i]
        );
    }
}
