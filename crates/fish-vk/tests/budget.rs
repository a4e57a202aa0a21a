//! A tiny FISH_VRAM_BUDGET_MB refuses uploads cleanly: nothing is held after
//! the refusal, smaller tensors still fit, and frees return everything.
//! (One test per binary: it sets the process environment.)

mod common;

use fish_gguf::GgmlType;

#[test]
fn a_tiny_budget_refuses_uploads_without_leaking() {
    std::env::set_var("FISH_VRAM_BUDGET_MB", "1");
    let Some(gpu) = common::gpu_or_skip() else {
        return;
    };
    assert_eq!(gpu.ceiling(), 1 << 20);
    let allocations = gpu.allocation_count();
    // What opening ran (the int8 fragment-layout check on devices with
    // matrix units) keeps no scratch: a device just opened holds nothing.
    assert_eq!(allocations, 0, "a device just opened holds allocations");

    // 2048 rows x 512 Q8_0 values = 1.06 MB of weights: over the ceiling.
    let big = common::synthetic_weights(GgmlType::Q8_0, 512, 2048, 1);
    let err = gpu.upload(GgmlType::Q8_0, &big, 512, 2048).unwrap_err();
    assert!(matches!(err, fish_vk::VkError::Budget { .. }), "{err}");
    assert!(err.to_string().contains("ceiling"), "{err}");
    assert_eq!(gpu.bytes_resident(), 0);
    assert_eq!(gpu.bytes_allocated(), 0);
    assert_eq!(
        gpu.allocation_count(),
        allocations,
        "a refused upload left allocations"
    );

    // A small tensor fits and computes; freeing it returns everything.
    let small = common::synthetic_weights(GgmlType::Q8_0, 512, 64, 2);
    let h = gpu
        .upload(GgmlType::Q8_0, &small, 512, 64)
        .expect("small upload");
    assert!(gpu.bytes_resident() > 0);
    let x = common::random_values(512, 3);
    let y = gpu.matmul(h, &x, 1).expect("matmul");
    common::check_auto(
        gpu,
        &common::Weights {
            ty: GgmlType::Q8_0,
            bytes: &small,
            n_in: 512,
            n_out: 64,
        },
        &x,
        1,
        &y,
        "small under budget",
    );
    // 1.03 MB alone would fit under 1 MiB; together with the first tensor it does not.
    let more = common::synthetic_weights(GgmlType::Q8_0, 512, 1900, 4);
    assert!(gpu.upload(GgmlType::Q8_0, &more, 512, 1900).is_err());
    gpu.free(h).expect("free");
    assert_eq!(gpu.bytes_resident(), 0);
    assert!(
        gpu.describe().contains("0 MB weights (0 tensors)"),
        "{}",
        gpu.describe()
    );
    common::assert_no_validation_messages(gpu);
}
