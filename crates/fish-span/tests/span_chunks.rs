//! A prompt of several span chunks (FISH_GPU_SPAN_CHUNK=64, the smallest
//! chunk, against a ~150-token prompt: two full chunks and a partial one):
//! every chunk reads the KV rows the chunks before it wrote in the same
//! submit, so each prompt row's logits must match those of the same span
//! fed one token per forward, and mostly the CPU's argmax. The chunks of 64
//! tokens attend with the query-blocked kernel (the default for chunks of
//! 32 or more tokens; on cooperative matrices where the device has them),
//! the 22-token tail and the single-token forwards with the plain one; a
//! second run slides every other layer over 24 positions. The other span
//! tests use the default chunk. Both tests set the same variables: they are
//! read from the environment once per process.

mod chunked;
mod common;

use chunked::{
    assert_mostly_cpu_argmax, chunked_vs_stepped, on_gpu, prompt_logits, prompt_of, setup,
};
use common::default_model;
use fish_core::model::Model;

#[test]
fn multi_chunk_prefill_matches_the_cpu() {
    let Some(gpu) = setup() else { return };
    let cpu = Model::load(default_model()).expect("load");
    let prompt = prompt_of(&cpu);
    assert!(
        prompt.len() > 128 + 8,
        "{} tokens: the prompt must reach a third chunk",
        prompt.len()
    );
    let cpu_logits = prompt_logits(&cpu, &prompt);
    let span = on_gpu(&gpu, Model::load(default_model()).expect("load"));
    let chunked = chunked_vs_stepped(&span, &prompt);
    assert_mostly_cpu_argmax(&chunked, &cpu_logits, "chunked prompt");
}

#[test]
fn multi_chunk_prefill_with_a_sliding_window() {
    let Some(gpu) = setup() else { return };
    let mut model = Model::load(default_model()).expect("load");
    // Every other layer slides over 24 positions: the query blocks of a
    // chunk then mask keys at both ends.
    model.cfg.sliding_window = 24;
    model.cfg.swa_period = 2;
    model.cfg.rope_base_swa = model.cfg.rope_base;
    let prompt = prompt_of(&model);
    // One full chunk and a 16-token tail.
    let span = on_gpu(&gpu, model);
    chunked_vs_stepped(&span, &prompt[..80]);
}
