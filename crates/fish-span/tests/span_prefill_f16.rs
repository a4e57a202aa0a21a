//! Prefill chunks whose matmuls read their inputs in f16 (the stages before
//! write them so where the matmuls run the cooperative prefill kernel,
//! `Gpu::prefill_input`). On a device without cooperative matrices
//! (lavapipe) FISH_GPU_PREFILL_EMULATED=1 gives spans the emulated kernel,
//! so the f16 path runs here too. The prompt of tests/span_chunks.rs in
//! chunks of 64: every logit the bits of a span placed with f32 inputs
//! (FISH_GPU_F16_INPUT=0), since the norm's f16 values are the roundings
//! the f32 path makes while staging, and most rows the CPU's argmax (as in
//! span_chunks.rs; the rows stepped one token per forward are checked
//! there, on the kernels chunks of 64 take on this device). One test per
//! binary: the variables are process-wide.

mod chunked;
mod common;

use chunked::{assert_mostly_cpu_argmax, on_gpu, prompt_logits, prompt_of, setup};
use common::{default_model, differing_bits};
use fish_core::model::Model;

#[test]
fn f16_prefill_inputs_give_the_bits_of_f32_ones() {
    std::env::set_var("FISH_GPU_PREFILL_EMULATED", "1");
    let Some(gpu) = setup() else { return };
    let cpu = Model::load(default_model()).expect("load");
    let prompt = prompt_of(&cpu);
    let n_embd = cpu.cfg.n_embd;
    assert_eq!(
        gpu.gpu().prefill_input(64, n_embd),
        fish_vk::MatmulInput::F16,
        "chunks of 64 do not take f16 inputs"
    );
    let cpu_logits = prompt_logits(&cpu, &prompt);
    let span = on_gpu(&gpu, Model::load(default_model()).expect("load"));
    let f16 = prompt_logits(&span, &prompt);
    assert!(!span.gpu.as_ref().unwrap().has_failed());
    drop(span);
    assert_mostly_cpu_argmax(&f16, &cpu_logits, "f16 inputs");

    std::env::set_var("FISH_GPU_F16_INPUT", "0");
    let span = on_gpu(&gpu, Model::load(default_model()).expect("load"));
    let f32 = prompt_logits(&span, &prompt);
    drop(span);
    std::env::remove_var("FISH_GPU_F16_INPUT");

    let differing = differing_bits(&f16, &f32);
    assert_eq!(
        differing, 0,
        "{differing} logits differ between f16 and f32 inputs"
    );
}
