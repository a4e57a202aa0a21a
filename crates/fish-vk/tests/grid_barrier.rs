//! The grid-barrier probes (shaders/grid_barrier_probe.comp and the
//! persistent matvec and layer probes) and the atomic-add probe run cleanly, and the layer probe's
//! chain matches the CPU: one workgroup meets itself at every barrier, so
//! no wait is long (lavapipe ends an invocation whose loop passes 65535
//! iterations).

mod common;

use common::gpu_or_skip;
use fish_vk::{AtomicProbe, ChainProbe};

#[test]
fn the_grid_barrier_probe_runs_and_validates() {
    let Some(gpu) = gpu_or_skip() else { return };
    let one_round = gpu.time_grid_barrier(1, 1).expect("probe");
    let many = gpu.time_grid_barrier(1, 1000).expect("probe");
    assert!(many > std::time::Duration::ZERO && one_round > std::time::Duration::ZERO);
    assert_eq!(gpu.validation_messages(), 0);
}

#[test]
fn the_atomic_add_probe_runs_and_validates() {
    let Some(gpu) = gpu_or_skip() else { return };
    for probe in [
        AtomicProbe::Shared,
        AtomicProbe::Private,
        AtomicProbe::Stores,
    ] {
        let time = gpu.time_atomic_add(probe, 4, 2, 512, 2).expect("probe");
        assert!(time > std::time::Duration::ZERO);
        // Workgroups, rows and a dispatch it needs.
        assert!(gpu.time_atomic_add(probe, 0, 2, 512, 1).is_err());
        assert!(gpu.time_atomic_add(probe, 4, 2, 0, 1).is_err());
        assert!(gpu.time_atomic_add(probe, 4, 2, 512, 0).is_err());
    }
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
        ChainProbe::PreloadAll,
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

/// The persistent layer probe's vectors against the CPU: every phase of
/// every layer, each output the dot product of its rows with the phase's
/// input rounded to f16 (as the probe stages it), over 1 / sqrt(n_in).
/// One workgroup, so that it runs where workgroups run one after another;
/// its blocks then cover every row of every phase.
#[test]
fn the_persistent_layer_probe_computes_its_chain() {
    use fish_vk::{LayerProbe, LayerRun, LayerShape};
    let Some(gpu) = gpu_or_skip() else { return };
    let shape = LayerShape {
        n_embd: 1024,
        n_ff: 3072,
    };
    let (copies, layers) = (2, 3);
    // Each copy's four matrices, decoded for the CPU and as the upload's bytes.
    let mut bytes = Vec::new();
    let mut decoded: Vec<Vec<Vec<f32>>> = Vec::new();
    for c in 0..copies {
        let mut mats = Vec::new();
        for (m, &(rows, n_in)) in shape.phases().iter().enumerate() {
            let q = common::synthetic_weights(
                fish_gguf::GgmlType::Q4_K,
                n_in,
                rows,
                (10 * c + m) as u64,
            );
            let mut d = vec![0f32; rows * n_in];
            for (src, dst) in q
                .chunks_exact(n_in / 256 * 144)
                .zip(d.chunks_exact_mut(n_in))
            {
                fish_quant::dequant_row(fish_gguf::GgmlType::Q4_K, src, dst).expect("dequant");
            }
            bytes.extend_from_slice(&q);
            mats.push(d);
        }
        decoded.push(mats);
    }
    assert_eq!(bytes.len(), copies * shape.layer_bytes());
    let handle = gpu
        .upload(fish_gguf::GgmlType::Q4_K, &bytes, 256, bytes.len() / 144)
        .expect("upload");
    let input = common::random_values(shape.n_embd, 7);

    // The CPU chain, every phase's output kept.
    let mut expected = vec![input.clone()];
    for g in 0..4 * layers {
        let (rows, n_in) = shape.phases()[g % 4];
        let w = &decoded[(g / 4) % copies][g % 4];
        let x: Vec<f64> = expected[g][..n_in]
            .iter()
            .map(|&v| half::f16::from_f32(v).to_f32() as f64)
            .collect();
        let scale = 1.0 / (n_in as f64).sqrt();
        let y = (0..rows)
            .map(|r| {
                let row = &w[r * n_in..(r + 1) * n_in];
                (row.iter().zip(&x).map(|(&a, &b)| a as f64 * b).sum::<f64>() * scale) as f32
            })
            .collect();
        expected.push(y);
    }

    let run = LayerRun {
        probe: LayerProbe::Plain,
        shape,
        copies,
        layers,
        groups: 1,
    };
    for probe in [
        LayerProbe::Plain,
        LayerProbe::Ahead,
        LayerProbe::AheadL1,
        LayerProbe::AheadWide,
    ] {
        let vectors = gpu
            .run_persistent_layers(handle, LayerRun { probe, ..run }, &input)
            .expect("probe");
        for g in 0..4 * layers {
            let want = &expected[g + 1];
            let at = shape.slot_offset(g + 1);
            let got = &vectors[at..at + want.len()];
            let peak = want.iter().fold(0f32, |m, v| m.max(v.abs()));
            for (r, (a, b)) in got.iter().zip(want).enumerate() {
                // f32 sums in another order; inputs rounded alike.
                assert!(
                    (a - b).abs() <= 1e-3 * peak,
                    "{probe:?} phase {g} row {r}: {a} against {b} (peak {peak})"
                );
            }
        }
    }
    // Shapes and layer counts outside what the shader holds are refused.
    let odd = LayerShape {
        n_embd: 1000,
        n_ff: 3072,
    };
    assert!(gpu
        .run_persistent_layers(handle, LayerRun { shape: odd, ..run }, &input)
        .is_err());
    assert!(gpu
        .time_persistent_layers(handle, LayerRun { layers: 0, ..run })
        .is_err());
    assert!(gpu
        .time_persistent_layers(
            handle,
            LayerRun {
                copies: copies + 1,
                ..run
            }
        )
        .is_err());
    gpu.free(handle).expect("free");
    assert_eq!(gpu.validation_messages(), 0);
}
