//! A waiting wo (FISH_GPU_WO_OVERLAP=1) that holds fewer weight units across
//! its wait than its rows need (FISH_VK_WAIT_UNITS=1, set here for the
//! whole binary, since the shape overrides are read once) loads the rest in
//! rounds after the wait and still gives the staged logits bit for bit, as
//! does the same kernel reading the attention's int8 copy where it arrived
//! instead of staging it (FISH_VK_WAIT_DIRECT_X=1). The
//! default model's wo rows fit one round, so the test decodes the tiny
//! model of 2048-value rows (FISH_TEST_TINY_WIDE_Q4K): its Q4_K wo rows are
//! 64 units, two per invocation of a 32-invocation slice.

mod common;

use common::{
    assert_built, decode_waits_gave_up, differing_bits, int8_backend_or_skip, span_model_on,
    tiny_vocab_decode, tiny_wide_model, with_env,
};
use fish_core::model::Model;

/// The tiny model's logits over a prompt and 10 decode steps, and whether
/// the span's decode waits gave up.
fn decode(model: &Model) -> (Vec<Vec<f32>>, bool) {
    (tiny_vocab_decode(model, 10), decode_waits_gave_up(model))
}

#[test]
fn a_waiting_wo_in_rounds_gives_the_staged_bits() {
    std::env::set_var("FISH_VK_WAIT_UNITS", "1");
    let Some(path) = tiny_wide_model() else {
        return;
    };
    let Some(gpu) = int8_backend_or_skip() else {
        return;
    };
    let (staged, _) = with_env(&[("FISH_GPU_QKV_OVERLAP", "0")], || {
        decode(&span_model_on(&gpu, &path))
    });
    let (rounds, gave_up) = with_env(&[("FISH_GPU_WO_OVERLAP", "1")], || {
        decode(&span_model_on(&gpu, &path))
    });
    assert!(!gave_up, "the counted waits gave up");
    let differing = differing_bits(&staged, &rounds);
    assert_eq!(differing, 0, "{differing} logits differ with wo in rounds");
    // The int8 copy read where it arrived instead of staged in shared memory.
    let (direct, gave_up) = with_env(
        &[("FISH_GPU_WO_OVERLAP", "1"), ("FISH_VK_WAIT_DIRECT_X", "1")],
        || decode(&span_model_on(&gpu, &path)),
    );
    assert!(!gave_up, "the counted waits gave up (x read directly)");
    let differing = differing_bits(&staged, &direct);
    assert_eq!(
        differing, 0,
        "{differing} logits differ with x read directly"
    );
    assert_built(
        &gpu,
        |p| p.starts_with("matvec_i8x_wait_q4_k[32, 2, 1, 1,") && p.ends_with(", 1]"),
        "the waiting wo reading x directly",
    );
    // Constants: 32 invocations a slice, 2 rows, 1 token, 1 unit held
    // across the wait (the rows' 64 units take two rounds).
    assert_built(
        &gpu,
        |p| p.starts_with("matvec_i8x_wait_q4_k[32, 2, 1, 1,") && p.ends_with(", 0]"),
        "the waiting wo holding one unit",
    );
}
