//! The int8 gate/up kernels' slices loading fewer rows' units per round
//! (FISH_VK_GATE_UP_LOAD_ROWS=2, set here for the whole binary, since the
//! shape overrides are read once; by default only dispatches of more than
//! 264 workgroups load 4 of their 8 rows at a time, which SmolLM2's 48 never
//! are) give the logits of gate and up multiplied apart with the act*mul
//! dispatch (FISH_GPU_INT8_ACT_FUSED=0, no gate/up kernel at all) bit for
//! bit: the rows' sums run in the same order however many rows a round
//! loads.

mod common;

use common::{
    assert_built, default_greedy, differing_bits, int8_backend_or_skip, span_teacher_forced,
    with_env, PARIS,
};
use fish_core::sampling::argmax;

#[test]
fn gate_up_slices_loading_two_rows_at_a_time_keep_the_bits() {
    std::env::set_var("FISH_VK_GATE_UP_LOAD_ROWS", "2");
    let Some(gpu) = int8_backend_or_skip() else {
        return;
    };
    let forced = default_greedy(12);
    let fused = span_teacher_forced(&gpu, &forced).1;
    assert_eq!(argmax(&fused[0]), PARIS);
    let apart = with_env(&[("FISH_GPU_INT8_ACT_FUSED", "0")], || {
        span_teacher_forced(&gpu, &forced).1
    });
    let differing = differing_bits(&fused, &apart);
    assert_eq!(differing, 0, "{differing} logits differ");
    // Constants 6 and 7: the 256 invocations, 2 rows per round.
    assert_built(
        &gpu,
        |p| p.starts_with("matvec_i8x_gateup_norm_q4_1") && p.contains(", 256, 2, "),
        "the gate/up kernel did not run with 2 rows per round",
    );
}
