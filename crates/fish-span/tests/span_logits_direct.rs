//! The span's output projection writes the host-visible logits itself (the
//! default) or into device memory that a copy at the end of the forward
//! reads out (FISH_GPU_LOGITS_DIRECT=0): the same kernel and sums, so the
//! same bits, for decode steps and for a forward that returns every row's
//! logits (its buffers grow past one row).
//!
//! One test only: the choice is read from the environment when a span's
//! output buffers are allocated.

mod common;

use common::{
    backend, default_greedy, default_model, differing_bits, span_model_on, teacher_forced,
    with_env, PARIS, PROMPT,
};
use fish_core::model::{LogitsFor, Model};
use fish_core::sampling::argmax;
use fish_core::session::Session;

/// Decode steps forced on `forced` after the prompt, then the prompt again
/// with every row's logits.
fn span_logits(model: &Model, forced: &[u32]) -> Vec<Vec<f32>> {
    let mut rows = teacher_forced(model, forced);
    let mut s = Session::new(model, 128, 2).expect("session");
    rows.push(s.eval(&PROMPT, LogitsFor::All).expect("all rows"));
    assert!(!model.gpu.as_ref().unwrap().has_failed());
    rows
}

#[test]
fn logits_written_to_host_memory_equal_the_copied_ones() {
    let Some(gpu) = backend() else {
        return;
    };
    let forced = default_greedy(8);
    let direct = span_logits(&span_model_on(&gpu, &default_model()), &forced);
    let copied = with_env(&[("FISH_GPU_LOGITS_DIRECT", "0")], || {
        span_logits(&span_model_on(&gpu, &default_model()), &forced)
    });
    assert_eq!(direct.len(), forced.len() + 2);
    assert_eq!(
        direct.last().map(Vec::len),
        Some(PROMPT.len() * direct[0].len())
    );
    assert_eq!(
        differing_bits(&direct, &copied),
        0,
        "direct vs copied logits"
    );
    assert_eq!(argmax(&direct[0]), PARIS);
    assert_eq!(gpu.gpu().validation_messages(), 0);
}
