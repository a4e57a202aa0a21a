//! The prefill matmul on workgroup-scope cooperative matrices
//! (matmul_coopmat2.comp, where the device has VK_NV_cooperative_matrix2)
//! against the CPU reference, with the bounds of tests/coopmat.rs (f16
//! factors, f32 sums), on every tile a prefill plan takes and through the
//! split of a dispatch's steps across workgroups; and the staged kernel,
//! which the same plans run with `with_tensor_tiles(false)`, on the same
//! inputs within the same bounds.
//!
//! Only devices with the extension run them, and only with the kernel
//! turned on (FISH_VK_COOPMAT2=1: it is opt-in); lavapipe has no cooperative
//! matrices. FISH_REQUIRE_COOPMAT2=1 makes its absence a failure.

mod common;
mod coopmat_checks;

use common::*;
use coopmat_checks::*;
use fish_gguf::GgmlType;
use fish_vk::{Gpu, Kernel, Staging};

/// The weight types the kernel decodes (the rest keep the staged kernel).
const TYPES: [GgmlType; 2] = [GgmlType::Q4_K, GgmlType::Q6_K];

fn tensor_gpu() -> Option<&'static Gpu> {
    let gpu = gpu_or_skip()?;
    if gpu.has_tensor_tiles() {
        return Some(gpu);
    }
    if std::env::var("FISH_REQUIRE_COOPMAT2").as_deref() == Ok("1") {
        panic!(
            "FISH_REQUIRE_COOPMAT2=1 but {} has no workgroup-scope cooperative matrices \
             (or FISH_VK_COOPMAT2=1 is not set)",
            gpu.info().name
        );
    }
    eprintln!(
        "skipped: {} has no workgroup-scope cooperative matrices",
        gpu.info().name
    );
    None
}

/// One product of `ty` at `n_tok` tokens through the plan's tile, with and
/// without the workgroup-scope kernel, each within the f16 bounds.
fn check(gpu: &Gpu, ty: GgmlType, (n_in, n_out): (usize, usize), n_tok: usize, what: &str) {
    with_uploaded(gpu, ty, (n_in, n_out), 700 + n_tok as u64, |weights, h| {
        for tensor in [true, false] {
            let what = format!("{what} {ty:?} {n_in}x{n_out} n_tok={n_tok} tensor={tensor}");
            let takes = gpu.with_tensor_tiles(tensor, || {
                gpu.takes_tensor_tiles(ty.into(), (n_in, n_out), n_tok)
            });
            assert_eq!(takes, tensor, "{what}: the plan's kernel");
            let ran = gpu.with_tensor_tiles(tensor, || {
                multiply_and_check(
                    gpu,
                    Kernel::CoopMat,
                    h,
                    weights,
                    n_tok,
                    701,
                    &what,
                    &[Staging::Pipelined],
                )
            });
            assert_eq!(ran, 1, "{what}: did not run");
        }
    });
}

#[test]
fn tensor_tiles_match_the_cpu_on_every_prefill_tile() {
    let Some(gpu) = tensor_gpu() else { return };
    for ty in TYPES {
        // Partial row and token tiles, the narrow (64 x 64) tile and the
        // wide one (128 x 128), forced either way.
        for wide in [false, true] {
            gpu.with_wide_tiles(wide, || {
                for n_tok in [37, 64, 256] {
                    check(gpu, ty, (512, 300), n_tok, &format!("wide={wide}"));
                }
                check(gpu, ty, (4096, 136), 130, &format!("wide={wide}"));
            });
        }
    }
    assert_no_validation_messages(gpu);
}

#[test]
fn tensor_tiles_split_across_workgroups_match_the_cpu() {
    // As tests/coopmat.rs: 8192 values are 256 steps, 72 rows x 19 tokens
    // one wide tile, so its steps split 2 ways and the last workgroup sums
    // the partials.
    let Some(gpu) = tensor_gpu() else { return };
    gpu.with_wide_tiles(true, || {
        for ty in TYPES {
            check(gpu, ty, (8192, 72), 19, "wide split");
        }
    });
    assert_no_validation_messages(gpu);
}
