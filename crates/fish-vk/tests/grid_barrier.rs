//! The grid-barrier probe (shaders/grid_barrier_probe.comp) runs cleanly: one
//! workgroup meets itself at every barrier, so even a device that runs
//! workgroups one after another (lavapipe) never waits.

mod common;

use common::gpu_or_skip;
use fish_vk::ChainProbe;

#[test]
fn the_grid_barrier_probe_runs_and_validates() {
    let Some(gpu) = gpu_or_skip() else { return };
    let one_round = gpu.time_grid_barrier(1, 1).expect("probe");
    let many = gpu.time_grid_barrier(1, 1000).expect("probe");
    assert!(many > std::time::Duration::ZERO && one_round > std::time::Duration::ZERO);
    assert_eq!(gpu.validation_messages(), 0);
}

#[test]
fn the_persistent_chain_probe_runs_and_validates() {
    let Some(gpu) = gpu_or_skip() else { return };
    let n = 256;
    let copies = 2;
    let bytes = vec![0u8; n / 256 * 144 * n * copies];
    let handle = gpu
        .upload(fish_gguf::GgmlType::Q4_K, &bytes, n, n * copies)
        .expect("upload");
    for probe in [
        ChainProbe::Plain,
        ChainProbe::Prefetch,
        ChainProbe::PrefetchL1,
    ] {
        let time = gpu
            .time_persistent_chain(probe, handle, copies, 4, 1)
            .expect("probe");
        assert!(time > std::time::Duration::ZERO);
        // Only copies of square Q4_K matrices.
        assert!(gpu.time_persistent_chain(probe, handle, 3, 4, 1).is_err());
    }
    gpu.free(handle).expect("free");
    assert_eq!(gpu.validation_messages(), 0);
}
