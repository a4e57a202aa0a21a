//! Decode steps (on the int8 matvec, whose q/k/v kernel counts its rows in;
//! lavapipe needs it forced on) whose attention runs beside the q/k/v matvec
//! (the default: no barrier between them, each attention workgroup waiting
//! for its KV head's rows) give the logits of the staged steps
//! (FISH_GPU_QKV_OVERLAP=0) bit for bit, as do steps whose wo runs beside
//! the attention too (FISH_GPU_WO_OVERLAP=1 and =early: each wo workgroup
//! waits for every head's output; =barrier: the same kernel after the
//! attention's barrier): the same sums, only the ordering differs.
//! A prompt's forward (several tokens) keeps its barriers in all. Where the
//! waits give up (FISH_GPU_QKV_OVERLAP=uncounted: the matvec does not count
//! its rows in; FISH_GPU_WO_OVERLAP=uncounted: the attention does not count
//! its heads in), the span runs the forward again with barriers: the same
//! bits again, and the device not marked failed.
//!
//! One test only: the choice is read from the environment when a span is
//! created.

mod common;

use common::{
    decode_waits_gave_up, default_greedy, default_model, differing_bits, int8_backend_or_skip,
    span_model_on, teacher_forced, with_env, PARIS,
};
use fish_core::model::Model;
use fish_core::sampling::argmax;

/// The decode steps' logits, and whether the span's attention waits gave up
/// (its `gpu:` description says so).
fn decode_logits(model: &Model, forced: &[u32]) -> (Vec<Vec<f32>>, bool) {
    let rows = teacher_forced(model, forced);
    (rows, decode_waits_gave_up(model))
}

#[test]
fn overlapped_decode_attention_gives_the_staged_bits() {
    let Some(gpu) = int8_backend_or_skip() else {
        return;
    };
    let forced = default_greedy(8);
    let (staged, _) = with_env(&[("FISH_GPU_QKV_OVERLAP", "0")], || {
        decode_logits(&span_model_on(&gpu, &default_model()), &forced)
    });
    let (overlapped, gave_up) = decode_logits(&span_model_on(&gpu, &default_model()), &forced);
    assert!(!gave_up, "the counted waits gave up");
    assert_eq!(staged.len(), forced.len() + 1);
    assert_eq!(
        differing_bits(&staged, &overlapped),
        0,
        "staged vs overlapped logits"
    );
    for wo in ["1", "early", "barrier"] {
        let (wo_too, gave_up) = with_env(&[("FISH_GPU_WO_OVERLAP", wo)], || {
            decode_logits(&span_model_on(&gpu, &default_model()), &forced)
        });
        assert!(
            !gave_up,
            "the counted waits gave up (FISH_GPU_WO_OVERLAP={wo})"
        );
        assert_eq!(
            differing_bits(&staged, &wo_too),
            0,
            "staged vs wo-overlapped logits (FISH_GPU_WO_OVERLAP={wo})"
        );
    }
    // Only waits that ran can give up: this also shows the decode steps
    // took the overlapped attention, and then the waiting wo.
    for (knob, what) in [
        ("FISH_GPU_QKV_OVERLAP", "attention wait, uncounted rows"),
        ("FISH_GPU_WO_OVERLAP", "wo wait, uncounted heads"),
    ] {
        let (fallen_back, gave_up) = with_env(&[(knob, "uncounted")], || {
            decode_logits(&span_model_on(&gpu, &default_model()), &forced)
        });
        assert!(gave_up, "no {what} ran (or none gave up)");
        assert_eq!(
            differing_bits(&staged, &fallen_back),
            0,
            "staged vs given-up logits ({what})"
        );
    }
    assert_eq!(argmax(&overlapped[0]), PARIS);
    assert_eq!(gpu.gpu().validation_messages(), 0);
}
