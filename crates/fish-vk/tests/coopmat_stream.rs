//! The batch tile staged per subgroup (shaders/matmul_coopmat_stream.comp,
//! `Staging::PerSubgroup`), emulated so that it runs on any device
//! (lavapipe in CI): every weight type against the CPU, and bit for bit
//! against the workgroup-staged kernel of the same tile shape (emulated:
//! on coopmat_checks::STAGED_EMULATED_TYPES), with x staged
//! in several chunks, partial steps, partial row and token tiles, and steps
//! split across workgroups.
//!
//! This binary sets FISH_VK_BATCH_TILE / _BK / _PIPELINE before the device
//! opens (every test here asks for the same values), so that it tests the
//! per-subgroup staging whatever the default batch tile is.

mod common;
mod coopmat_checks;

use common::*;
use coopmat_checks::*;
use fish_vk::{Kernel, Staging};
use std::sync::Once;

/// Two subgroups of one 16 x 16 fragment (32 rows x 16 tokens), 64-value
/// steps: fits lavapipe's 32 KiB of shared memory under every staging.
const STREAM_TILE: &str = "2,1,1,1";
const STREAM_STEP: &str = "64";

/// The per-subgroup staging first (the reference), then the three
/// workgroup stagings of the same tile.
const STREAM_STAGINGS: [Staging; 4] = [
    Staging::PerSubgroup,
    Staging::Synchronous,
    Staging::Pipelined,
    Staging::TwoAhead,
];

fn stream_gpu() -> Option<&'static fish_vk::Gpu> {
    static SET: Once = Once::new();
    SET.call_once(|| {
        std::env::set_var("FISH_VK_BATCH_TILE", STREAM_TILE);
        std::env::set_var("FISH_VK_BATCH_BK", STREAM_STEP);
        std::env::set_var("FISH_VK_BATCH_PIPELINE", "3");
    });
    gpu_or_skip()
}

/// `n_in` x `n_out` weights of every type times `n_tok` tokens under every
/// staging, with each kernel the device offers.
fn check(gpu: &fish_vk::Gpu, n_in: usize, n_out: usize, n_tok: usize, seed: u64, what: &str) {
    let mut kernels = vec![Kernel::CoopMatBatchEmulated];
    if let Some(tile) = gpu.coopmat_batch_tile() {
        assert_eq!(
            (tile.warps_m, tile.k_step, tile.staging),
            (2, 64, Staging::PerSubgroup)
        );
        kernels.push(Kernel::CoopMatBatch);
    }
    for kernel in kernels {
        for_each_kernel_type(gpu, n_in, n_out, seed, |w, h| {
            let what = format!("{:?} {what}", w.ty);
            let stagings = stagings_for(kernel, w.ty, &STREAM_STAGINGS);
            let ran = multiply_and_check(gpu, kernel, h, w, n_tok, seed + 1, &what, &stagings);
            assert_eq!(ran, stagings.len(), "{what}: every staging runs");
        });
    }
}

#[test]
fn per_subgroup_staging_matches_the_cpu_and_the_workgroup_stagings() {
    let Some(gpu) = stream_gpu() else { return };
    // 768 values: 12 steps in three x chunks, 40 rows (a full and a partial
    // row tile of 32), 19 tokens (a full and a partial token tile).
    check(gpu, 768, 40, 19, 800, "three chunks");
    assert_no_validation_messages(gpu);
}

#[test]
fn per_subgroup_staging_splits_steps_across_workgroups() {
    let Some(gpu) = stream_gpu() else { return };
    // 1024 values are 16 steps; 2 row tiles x 1 token tile split 4 ways (4
    // steps each), whose partials the last workgroup of a tile sums.
    check(gpu, 1024, 40, 9, 900, "split across workgroups");
    assert_no_validation_messages(gpu);
}
