//! The batched-decode tile with its steps split over groups of subgroups
//! (shaders/matmul_coopmat.comp WARPS_K) and across workgroups (split_k.rs,
//! where a dispatch has few tiles), emulated so that it runs on any
//! device (lavapipe in CI), for every weight type against the CPU and bit
//! for bit between the stagings (emulated: on
//! coopmat_checks::STAGED_EMULATED_TYPES).
//!
//! This binary sets FISH_VK_BATCH_TILE / FISH_VK_BATCH_BK before the device
//! opens (every test here asks for the same values), so that the split runs
//! whatever the default batch tile is.

mod common;
mod coopmat_checks;

use common::*;
use coopmat_checks::*;
use fish_vk::Kernel;
use std::sync::Once;

/// One subgroup along rows and tokens, four groups splitting each 128-value
/// step (32 values, two fragment depths, per group): 16 x 16 tiles of 128
/// invocations that fit lavapipe's 32 KiB of shared memory pipelined.
const SPLIT_TILE: &str = "1,1,1,1,4";
const SPLIT_STEP: &str = "128";

fn split_gpu() -> Option<&'static fish_vk::Gpu> {
    static SET: Once = Once::new();
    SET.call_once(|| {
        std::env::set_var("FISH_VK_BATCH_TILE", SPLIT_TILE);
        std::env::set_var("FISH_VK_BATCH_BK", SPLIT_STEP);
    });
    gpu_or_skip()
}

#[test]
fn split_steps_match_the_cpu_for_every_type() {
    let Some(gpu) = split_gpu() else { return };
    // 768 values (three K-quant super-blocks, six 128-value steps), 70 rows
    // (a partial row tile) and 19 tokens (a full and a partial token tile).
    // Where the device has cooperative matrices the real batch tile (read
    // from the same variables at device open) runs too.
    let mut kernels = vec![Kernel::CoopMatBatchEmulated];
    if let Some(tile) = gpu.coopmat_batch_tile() {
        assert_eq!((tile.warps_m, tile.warps_k, tile.k_step), (1, 4, 128));
        kernels.push(Kernel::CoopMatBatch);
    }
    for kernel in kernels {
        for_each_kernel_type(gpu, 768, 70, 700, |w, h| {
            let what = format!("{:?} split", w.ty);
            let stagings = stagings_for(kernel, w.ty, &STAGINGS);
            multiply_and_check(gpu, kernel, h, w, 19, 71, &what, &stagings);
        });
        // 2048 values are 16 steps: with 10 output tiles (70 rows x 19
        // tokens) each tile's steps are also split across 4 workgroups
        // (split_k.rs), whose partials the last one sums.
        for_each_kernel_type(gpu, 2048, 70, 710, |w, h| {
            let what = format!("{:?} split across workgroups", w.ty);
            let stagings = stagings_for(kernel, w.ty, &STAGINGS);
            multiply_and_check(gpu, kernel, h, w, 19, 72, &what, &stagings);
        });
    }
    assert_no_validation_messages(gpu);
}
