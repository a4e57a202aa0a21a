//! Prefill chunks with the activation in the gate/up epilogue of the
//! fragments kernel (fish-vk `Kernel::PrefillGateUp`): the same sums as the
//! plain fragments kernel, so the logits of the act*mul dispatch bit for bit
//! (`FISH_VK_FRAGS_GATE_UP=0`), the dispatch must be gone, and the rows
//! must keep the CPU's argmax as span_prefill_frags.rs asks. Emulated on a
//! device without cooperative matrices (FISH_GPU_PREFILL_EMULATED=1 gives
//! spans the emulated prefill kernel, FISH_VK_FRAGS_EMULATED=1 its Q4_K
//! plans the emulated fragments kernel); on a device with them, its own.
//!
//! The form needs Q4_K gate/up rows of whole super-blocks, which the
//! default model (576-value rows) does not have: FISH_TEST_TINY_Q4K names a
//! `fish-cli synth --shape tiny --type q4_k_m` file (scripts/test.sh makes
//! it; without it the test fails where FISH_REQUIRE_GPU=1, else skips). One
//! test per binary: the variables are process-wide.

mod chunked;
mod common;

use chunked::{assert_mostly_cpu_argmax, on_gpu, prompt_logits, setup};
use common::{compare, differing_bits, tiny_model};
use fish_core::model::Model;
use std::path::PathBuf;

/// 140 byte tokens: two full chunks of 64 and a partial one.
fn prompt() -> Vec<u32> {
    (0..140).map(|i| 3 + (i * 37 % 250)).collect()
}

/// The prompt's logits per row and the pipelines its span asked for (not
/// those the device's open-time checks built: on a device with the
/// fragments kernel the check builds the gate/up form whatever plans do).
fn prefill(
    gpu: &std::sync::Arc<fish_span::VulkanBackend>,
    path: &PathBuf,
) -> (Vec<Vec<f32>>, Vec<String>) {
    gpu.gpu().take_requested_pipelines();
    let span = on_gpu(gpu, Model::load(path).expect("load"));
    let logits = prompt_logits(&span, &prompt());
    assert!(!span.gpu.as_ref().unwrap().has_failed());
    drop(span);
    (logits, gpu.gpu().take_requested_pipelines())
}

#[test]
fn the_gate_up_epilogue_gives_the_act_mul_dispatchs_bits() {
    std::env::set_var("FISH_GPU_PREFILL_EMULATED", "1");
    std::env::set_var("FISH_VK_FRAGS_EMULATED", "1");
    let Some(path) = tiny_model() else { return };
    let Some(gpu) = setup() else { return };
    let device_form = gpu.gpu().prefill_frags();
    let module = match device_form {
        true => "coopmat_frags_x16_gateup_q4_k",
        false => "coopmat_frags_emu_x16_gateup_q4_k",
    };

    std::env::set_var("FISH_VK_FRAGS_GATE_UP", "0");
    let (dispatched, built) = prefill(&gpu, &path);
    std::env::remove_var("FISH_VK_FRAGS_GATE_UP");
    assert!(
        !built.iter().any(|p| p.contains("_gateup_")),
        "FISH_VK_FRAGS_GATE_UP=0 still fused: {built:?}"
    );
    let (fused, built) = prefill(&gpu, &path);
    assert!(
        built.iter().any(|p| p.starts_with(module)),
        "{module} did not run: {built:?}"
    );
    // Against the CPU as span_prefill_frags.rs holds the fragments kernel
    // (chunked::assert_mostly_cpu_argmax: int8 activations there, flat
    // random logits), so that the two paths cannot agree on wrong logits.
    let cpu = prompt_logits(&Model::load(&path).expect("load"), &prompt());
    assert_mostly_cpu_argmax(&fused, &cpu, "gate/up epilogue");
    let (same, worst) = compare(&fused, &dispatched);
    eprintln!(
        "gate/up epilogue vs act*mul dispatch: argmax {same}/{}, max |dlogit| {:.3}%",
        fused.len(),
        worst * 100.0
    );
    assert_eq!(
        differing_bits(&fused, &dispatched),
        0,
        "the epilogue's logits differ from the dispatch's"
    );
}
