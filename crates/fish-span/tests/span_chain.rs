//! Chained decode stages (FISH_GPU_CHAIN=1: a one-token forward's stages
//! recorded without barriers, each kernel waiting for the stages before it,
//! shaders/chain.glsl) give the logits of the stages separated by barriers
//! bit for bit: the order changes, the arithmetic does not. The tiny Q4_K_M
//! model (FISH_TEST_TINY_Q4K) decodes on the int8 kernels, which chain.

mod common;

use common::{differing_bits, int8_backend_or_skip, span_model_on, tiny_model, with_env};
use fish_core::model::LogitsFor;
use fish_core::session::Session;

/// A prompt, then one forced token per step (ids inside the tiny
/// vocabulary): the logits of the prompt's last token and of every step.
fn decode(model: &fish_core::model::Model) -> Vec<Vec<f32>> {
    let prompt: Vec<u32> = (0..6).map(|i| 3 + i * 61 % 500).collect();
    let mut s = Session::new(model, 64, 2).expect("session");
    let mut out = vec![s.set_prompt(&prompt).expect("prompt")];
    for i in 0..12u32 {
        out.push(
            s.eval(&[5 + i * 37 % 500], LogitsFor::Last)
                .expect("decode"),
        );
    }
    out
}

#[test]
fn chained_stages_keep_the_bits_of_stages_between_barriers() {
    let Some(path) = tiny_model() else { return };
    let Some(gpu) = int8_backend_or_skip() else {
        return;
    };
    let before = fish_vk::chained_forwards();
    let chained = with_env(&[("FISH_GPU_CHAIN", "1")], || {
        decode(&span_model_on(&gpu, &path))
    });
    let ran = fish_vk::chained_forwards() - before;
    assert!(ran >= 12, "only {ran} chained forwards for 12 decode steps");
    let separated = with_env(&[("FISH_GPU_CHAIN", "0")], || {
        decode(&span_model_on(&gpu, &path))
    });
    let differing = differing_bits(&chained, &separated);
    assert_eq!(
        differing, 0,
        "{differing} logits differ with chained stages"
    );
}
