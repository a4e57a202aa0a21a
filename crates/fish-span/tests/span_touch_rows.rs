//! The normed decode kernels touching their first weight round before the
//! norm prologue (FISH_VK_TOUCH_ROWS=8, set here for the whole binary,
//! since the shape overrides are read once) give the logits of the norms
//! dispatched (FISH_GPU_INT8_NORM_FUSED=0: no normed kernel runs) bit for
//! bit: the touched words change nothing. Only K-quant units are touched,
//! so the test decodes the tiny Q4_K_M model (FISH_TEST_TINY_Q4K).

mod common;

use common::{
    assert_built, differing_bits, int8_backend_or_skip, span_model_on, tiny_model,
    tiny_vocab_decode, with_env,
};

#[test]
fn touching_the_first_weight_round_keeps_the_bits() {
    std::env::set_var("FISH_VK_TOUCH_ROWS", "8");
    let Some(path) = tiny_model() else { return };
    let Some(gpu) = int8_backend_or_skip() else {
        return;
    };
    let touched = tiny_vocab_decode(&span_model_on(&gpu, &path), 12);
    let dispatched = with_env(&[("FISH_GPU_INT8_NORM_FUSED", "0")], || {
        tiny_vocab_decode(&span_model_on(&gpu, &path), 12)
    });
    let differing = differing_bits(&touched, &dispatched);
    assert_eq!(differing, 0, "{differing} logits differ with rows touched");
    // The last constant of each normed kernel: the rows touched (the q/k/v
    // slices hold 2 rows, the gate/up rounds 8).
    for (module, touch) in [
        ("matvec_i8x_norm_q4_k[", ", 2]"),
        ("matvec_i8x_gateup_norm_q4_k[", ", 8]"),
    ] {
        assert_built(
            &gpu,
            |p| p.starts_with(module) && p.ends_with(touch),
            &format!("{module} did not run with rows touched"),
        );
    }
}
