//! The narrow int8 gate/up (FISH_GPU_NARROW_GATE_UP=1) with 4 rows of gate
//! and of up per workgroup (FISH_VK_NARROW_ROWS=4, set here for the whole
//! binary, since the shape overrides are read once): 8 workgroups hand
//! each 32-row block to the last of them to arrive, and the logits are
//! those of the 32-row blocks with the norm dispatched
//! (FISH_GPU_INT8_NORM_FUSED=0) bit for bit. span_int8.rs checks the
//! default of 1 row.

mod common;

use common::{
    assert_built, default_greedy, differing_bits, int8_backend_or_skip, span_teacher_forced,
    with_env, PARIS,
};
use fish_core::sampling::argmax;

#[test]
fn narrow_gate_up_workgroups_of_four_rows_keep_the_bits() {
    std::env::set_var("FISH_VK_NARROW_ROWS", "4");
    let Some(gpu) = int8_backend_or_skip() else {
        return;
    };
    let forced = default_greedy(12);
    let norm_apart = ("FISH_GPU_INT8_NORM_FUSED", "0");
    let blocks = with_env(&[norm_apart], || span_teacher_forced(&gpu, &forced).1);
    let narrow = with_env(&[norm_apart, ("FISH_GPU_NARROW_GATE_UP", "1")], || {
        span_teacher_forced(&gpu, &forced).1
    });
    assert_eq!(argmax(&narrow[0]), PARIS);
    let differing = differing_bits(&narrow, &blocks);
    assert_eq!(differing, 0, "{differing} logits differ");
    // Constant 1: 4 rows of gate and 4 of up.
    assert_built(
        &gpu,
        |p| p.starts_with("matvec_i8x_gateup_narrow_q4_1[32, 8, "),
        "the narrow gate/up did not run with 4 rows",
    );
}
