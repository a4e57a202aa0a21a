//! The prefill matmul on fragments built in registers (frags.rs,
//! shaders/matmul_frags.comp) for Q4_K and Q6_K on x in f16, emulated so
//! that it runs on any device (lavapipe in CI), and the device's own kernel
//! where the device runs it: exact products on both prefill tiles (the
//! open-time check), and random weights against the CPU with steps split
//! across workgroups.
//!
//! This binary sets FISH_VK_WIDE_SPLIT_MIN_STEPS before the device opens, so
//! that wide tiles of 1024-value rows split in two.

mod common;

use common::*;
use fish_gguf::GgmlType;
use fish_vk::{GatedActivation, Gpu, Kernel, MatmulInput};
use std::sync::Once;

fn frags_gpu() -> Option<&'static Gpu> {
    static SET: Once = Once::new();
    SET.call_once(|| std::env::set_var("FISH_VK_WIDE_SPLIT_MIN_STEPS", "16"));
    gpu_or_skip()
}

/// The kernels to check on this device: the emulated one, and the real one
/// where the device offers what it needs (also where the open-time check
/// failed: that is a failure here, not a skip).
fn kernels(gpu: &Gpu) -> Vec<Kernel> {
    let mut kernels = vec![Kernel::CoopMatEmulated];
    if gpu.prefill_frags_offered() {
        kernels.push(Kernel::CoopMat);
    }
    kernels
}

#[test]
fn fragments_give_exact_products_on_both_prefill_tiles() {
    let Some(gpu) = frags_gpu() else { return };
    for kernel in kernels(gpu) {
        gpu.check_prefill_frags(kernel)
            .unwrap_or_else(|why| panic!("{kernel:?}: {why}"));
    }
    assert_no_validation_messages(gpu);
}

#[test]
fn fragments_match_the_cpu_with_split_steps() {
    let Some(gpu) = frags_gpu() else { return };
    // 1024 values: 32 steps, which the wide split rule (16 steps each here)
    // shares between two workgroups per tile; 150 rows and 140 tokens leave
    // partial tiles along both.
    let (n_in, n_out, n_tok) = (1024, 150, 140);
    for kernel in kernels(gpu) {
        for (i, ty) in [GgmlType::Q4_K, GgmlType::Q6_K].into_iter().enumerate() {
            with_uploaded(gpu, ty, (n_in, n_out), 820 + i as u64, |w, h| {
                let x = random_values(n_in * n_tok, 830 + i as u64);
                for wide in [false, true] {
                    let what = format!("{ty:?} {kernel:?} wide={wide}");
                    let y = gpu.with_prefill_frags(true, || {
                        gpu.with_wide_tiles(wide, || {
                            gpu.matmul_group_on(&[h], &x, n_tok, kernel, MatmulInput::F16)
                        })
                    });
                    let y = y.unwrap_or_else(|e| panic!("{what}: {e}")).remove(0);
                    check_f16_x_matrix_product(w, &x, n_tok, &y, &what);
                }
            });
        }
    }
    assert_no_validation_messages(gpu);
}

/// Loading code words a step ahead (FISH_VK_FRAGS_AHEAD) changes
/// when the loads are issued, not what is summed: the same bits as without,
/// on both tiles, split and unsplit, over several super-blocks per split
/// (the load of each split's next super-block crosses its share's end) and
/// on the open-time check's exact products.
#[test]
fn loads_ahead_give_the_same_bits() {
    let Some(gpu) = frags_gpu() else { return };
    let (n_in, n_out, n_tok) = (2048, 150, 140);
    for kernel in kernels(gpu) {
        gpu.with_frags_ahead(true, || gpu.check_prefill_frags(kernel))
            .unwrap_or_else(|why| panic!("{kernel:?} ahead: {why}"));
        for ty in [GgmlType::Q4_K, GgmlType::Q6_K] {
            with_uploaded(gpu, ty, (n_in, n_out), 840, |w, h| {
                let x = random_values(n_in * n_tok, 841);
                for wide in [false, true] {
                    let run = |ahead: bool| {
                        gpu.with_frags_ahead(ahead, || {
                            gpu.with_prefill_frags(true, || {
                                gpu.with_wide_tiles(wide, || {
                                    gpu.matmul_group_on(&[h], &x, n_tok, kernel, MatmulInput::F16)
                                })
                            })
                        })
                        .unwrap_or_else(|e| panic!("{kernel:?} wide={wide} ahead={ahead}: {e}"))
                        .remove(0)
                    };
                    let (plain, ahead) = (run(false), run(true));
                    let what = format!("{ty:?} {kernel:?} wide={wide} ahead");
                    check_f16_x_matrix_product(w, &x, n_tok, &ahead, &what);
                    assert!(
                        same_bits(&plain, &ahead),
                        "{what}: other bits than without the loads ahead"
                    );
                    // The next super-block touched before it is loaded.
                    let touched = gpu.with_frags_prefetch(true, || run(false));
                    assert!(
                        same_bits(&plain, &touched),
                        "{what}: other bits with the touches"
                    );
                }
            });
        }
    }
    assert_no_validation_messages(gpu);
}

#[test]
fn a_group_of_tensors_lays_its_outputs_one_after_the_other() {
    let Some(gpu) = frags_gpu() else { return };
    // q/k/v-like: two Q4_K tensors and a Q6_K one on the same x, each
    // output at its offset of the group's y.
    let (n_in, n_tok) = (512, 70);
    let shapes = [
        (GgmlType::Q4_K, 96),
        (GgmlType::Q4_K, 48),
        (GgmlType::Q6_K, 48),
    ];
    let weights: Vec<Vec<u8>> = shapes
        .iter()
        .enumerate()
        .map(|(i, &(ty, n_out))| synthetic_weights(ty, n_in, n_out, 850 + i as u64))
        .collect();
    let handles: Vec<_> = shapes
        .iter()
        .zip(&weights)
        .map(|(&(ty, n_out), w)| gpu.upload(ty, w, n_in, n_out).expect("upload"))
        .collect();
    let x = random_values(n_in * n_tok, 855);
    for kernel in kernels(gpu) {
        let ys = gpu
            .with_prefill_frags(true, || {
                gpu.matmul_group_on(&handles, &x, n_tok, kernel, MatmulInput::F16)
            })
            .expect("group");
        for ((&(ty, n_out), bytes), y) in shapes.iter().zip(&weights).zip(&ys) {
            let w = Weights {
                ty,
                bytes,
                n_in,
                n_out,
            };
            check_f16_x_matrix_product(&w, &x, n_tok, y, &format!("{kernel:?} group {ty:?}"));
        }
    }
    for h in handles {
        gpu.free(h).expect("free");
    }
    assert_no_validation_messages(gpu);
}

/// Plans on the fragments kernel take the wide tile where its workgroups
/// keep 3/4 of the multiprocessors busy over their waves (coopmat.rs
/// `wide_fills_its_waves`), as counted over `Gpu::with_multiprocessors`
/// (lavapipe reports none, and then the workgroup-count rule keeps these
/// four wide tiles off the wide tile), with the CPU's products either way.
#[test]
fn plans_on_fragments_take_the_wide_tile_by_its_waves() {
    let Some(gpu) = frags_gpu() else { return };
    // 512 rows x 128 tokens: four wide tiles (128 x 128), sixteen 64 x 64.
    let (n_in, n_out, n_tok) = (256, 512, 128);
    let weights = (GgmlType::Q4_K.into(), MatmulInput::F16);
    for kernel in kernels(gpu) {
        with_uploaded(gpu, GgmlType::Q4_K, (n_in, n_out), 860, |w, h| {
            let x = random_values(n_in * n_tok, 861);
            // (multiprocessors, whether the plan is wide): 4 of 5 busy,
            // 4 of 6, one wave of 4; None: the device's count (lavapipe:
            // none, so the workgroup-count rule).
            let cases = [(Some(5), true), (Some(6), false), (Some(4), true)];
            let cases = cases.into_iter().chain(
                gpu.info()
                    .multiprocessors
                    .is_none()
                    .then_some((None, false)),
            );
            for (multiprocessors, wide) in cases {
                let what = format!("{kernel:?} over {multiprocessors:?} multiprocessors");
                let tile = with_count(gpu, multiprocessors, || {
                    gpu.plan_tile_for_weights(kernel, weights, (n_in, n_out), n_tok)
                })
                .unwrap_or_else(|e| panic!("{what}: {e}"))
                .expect("a cooperative tile");
                assert_eq!(tile.rows() == 128, wide, "{what}: {}", tile.describe());
                let y = with_count(gpu, multiprocessors, || {
                    gpu.matmul_group_on(&[h], &x, n_tok, kernel, MatmulInput::F16)
                })
                .unwrap_or_else(|e| panic!("{what}: {e}"))
                .remove(0);
                check_f16_x_matrix_product(w, &x, n_tok, &y, &what);
            }
        });
    }
    assert_no_validation_messages(gpu);
}

/// `f` with the fragments kernel forced on and, where given, the wide
/// tile's waves counted over `multiprocessors` (thread overrides: other
/// tests' plans do not see them).
fn with_count<R>(gpu: &Gpu, multiprocessors: Option<u32>, f: impl FnOnce() -> R) -> R {
    gpu.with_prefill_frags(true, || match multiprocessors {
        Some(m) => gpu.with_multiprocessors(m, f),
        None => f(),
    })
}

#[test]
fn forced_off_or_other_types_keep_the_staged_kernel() {
    let Some(gpu) = frags_gpu() else { return };
    // Off: the staged emulated kernel's bits, which differ from the
    // fragments' decode in some weights.
    let (n_in, n_out, n_tok) = (512, 64, 64);
    with_uploaded(gpu, GgmlType::Q4_K, (n_in, n_out), 840, |w, h| {
        let x = random_values(n_in * n_tok, 841);
        let run = |on: bool| {
            gpu.with_prefill_frags(on, || {
                gpu.matmul_group_on(&[h], &x, n_tok, Kernel::CoopMatEmulated, MatmulInput::F16)
            })
            .expect("matmul")
            .remove(0)
        };
        let (staged, frags) = (run(false), run(true));
        check_f16_product(w, &x, n_tok, &staged, "Q4_K staged");
        check_f16_x_matrix_product(w, &x, n_tok, &frags, "Q4_K fragments");
        assert_ne!(staged, frags, "forcing the fragments on changed nothing");
    });
    // Q8_0 has no fragments module: forced on, it runs the staged kernel.
    with_uploaded(gpu, GgmlType::Q8_0, (n_in, n_out), 842, |w, h| {
        let x = random_values(n_in * n_tok, 843);
        let y = gpu
            .with_prefill_frags(true, || {
                gpu.matmul_group_on(&[h], &x, n_tok, Kernel::CoopMatEmulated, MatmulInput::F16)
            })
            .expect("matmul")
            .remove(0);
        check_f16_product(w, &x, n_tok, &y, "Q8_0 forced on");
    });
    assert_no_validation_messages(gpu);
}

/// The gate/up form (`Kernel::PrefillGateUp`) passes its open-time check
/// on both prefill tiles, emulated and (where offered) on the device.
#[test]
fn gate_up_epilogue_passes_its_check() {
    let Some(gpu) = frags_gpu() else { return };
    for kernel in kernels(gpu) {
        gpu.check_prefill_gate_up(kernel)
            .unwrap_or_else(|why| panic!("{kernel:?}: {why}"));
    }
    assert_no_validation_messages(gpu);
}

/// The host's gated activation, as shaders/gated_act.glsl computes it.
fn gated_act(g: f32, act: GatedActivation) -> f32 {
    match act {
        GatedActivation::Silu => g / (1.0 + (-g).exp()),
        GatedActivation::Gelu => {
            let u = (0.797_884_6 * g * (1.0 + 0.044715 * g * g)).clamp(-10.0, 10.0);
            0.5 * g * (1.0 + u.tanh())
        }
    }
}

/// The gate/up form sums gate and up as the plain fragments kernel does
/// (the same fragments, in the same order), so its outputs are the plain
/// kernel's sums through the activation, rounded to f16: at most one f16
/// step apart where the host's exp / tanh and the device's round
/// differently (plus the activation's own f32 rounding); with the code
/// words loaded a step ahead, the same bits. Random Q4_K weights; 150 output rows and 140 tokens leave
/// partial tiles along both, on both tiles, with both activations.
#[test]
fn gate_up_epilogue_gives_the_plain_kernels_sums_through_the_activation() {
    let Some(gpu) = frags_gpu() else { return };
    let (n_in, n_out, n_tok) = (512, 150, 140);
    let x = random_values(n_in * n_tok, 861);
    with_uploaded(gpu, GgmlType::Q4_K, (n_in, n_out), 862, |_, gate| {
        with_uploaded(gpu, GgmlType::Q4_K, (n_in, n_out), 863, |_, up| {
            for kernel in kernels(gpu) {
                for wide in [false, true] {
                    let forced = |f: &dyn Fn() -> _| {
                        gpu.with_prefill_frags(true, || gpu.with_wide_tiles(wide, f))
                    };
                    let plain = forced(&|| {
                        gpu.matmul_group_on(&[gate, up], &x, n_tok, kernel, MatmulInput::F16)
                    })
                    .expect("plain");
                    for act in [GatedActivation::Silu, GatedActivation::Gelu] {
                        let what = format!("{kernel:?} wide={wide} {act:?}");
                        let fuse = |how: &str| {
                            forced(&|| {
                                gpu.prefill_gate_up((gate, up), &x, n_tok, kernel, act)
                                    .map(|y| vec![y])
                            })
                            .unwrap_or_else(|e| panic!("{what}{how}: {e}"))
                            .remove(0)
                        };
                        let fused = fuse("");
                        assert_eq!(fused.len(), n_tok * n_out, "{what}");
                        // Code words loaded a step ahead, and the next
                        // super-block touched: the same bits.
                        let ahead = gpu.with_frags_ahead(true, || fuse(" ahead"));
                        assert!(
                            same_bits(&fused, &ahead),
                            "{what}: other bits with the loads ahead"
                        );
                        let touched = gpu.with_frags_prefetch(true, || fuse(" touched"));
                        assert!(
                            same_bits(&fused, &touched),
                            "{what}: other bits with the touches"
                        );
                        for (i, &got) in fused.iter().enumerate() {
                            let (g, u) = (plain[0][i], plain[1][i]);
                            let want = half::f16::from_f32(gated_act(g, act) * u).to_f32();
                            // One f16 step, and the f32 rounding of the
                            // activation (GELU cancels where g < 0).
                            let step = want.abs().max(6.1e-5) / 1024.0 + (g * u).abs() * 1e-6;
                            assert!(
                                (got - want).abs() <= step,
                                "{what}: y[{}, {}] = {got}, want {want}",
                                i / n_out,
                                i % n_out
                            );
                        }
                    }
                }
            }
        });
    });
    assert_no_validation_messages(gpu);
}

/// Gate and up of other types or shapes, or a type without the form, are
/// errors, not wrong numbers.
#[test]
fn gate_up_epilogue_refuses_what_it_does_not_hold() {
    let Some(gpu) = frags_gpu() else { return };
    let (n_in, n_tok) = (512, 70);
    let x = random_values(n_in * n_tok, 871);
    let run = |gate, up| {
        gpu.with_prefill_frags(true, || {
            let act = GatedActivation::Silu;
            gpu.prefill_gate_up((gate, up), &x, n_tok, Kernel::CoopMatEmulated, act)
        })
    };
    with_uploaded(gpu, GgmlType::Q4_K, (n_in, 64), 872, |_, q4| {
        with_uploaded(gpu, GgmlType::Q6_K, (n_in, 64), 873, |_, q6| {
            assert!(run(q4, q6).is_err(), "Q4_K gate with Q6_K up");
            assert!(run(q6, q6).is_err(), "Q6_K has no gate/up form");
        });
        with_uploaded(gpu, GgmlType::Q4_K, (n_in, 32), 874, |_, short| {
            assert!(run(q4, short).is_err(), "64 gate rows with 32 up rows");
        });
        with_uploaded(gpu, GgmlType::Q4_K, (n_in, 63), 875, |_, odd| {
            assert!(
                run(odd, odd).is_err(),
                "63 rows: outputs are stored in pairs"
            );
        });
    });
    assert_no_validation_messages(gpu);
}

/// Whether two outputs hold the same f32 bits, element for element.
fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(a, b)| a.to_bits() == b.to_bits())
}
