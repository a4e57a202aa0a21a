//! A span's prefill chunk through the kernel on fragments built in
//! registers (fish-vk frags.rs), emulated on a device without cooperative
//! matrices: FISH_GPU_PREFILL_EMULATED=1 gives spans the emulated prefill
//! kernel, FISH_VK_FRAGS_EMULATED=1 its Q4_K / Q6_K plans the emulated
//! fragments kernel (both types by default). SmolLM2's down
//! projections (1536-value rows, the only ones a K-quant fits) are
//! re-quantised to Q4_K and Q6_K in turn, so the kernel runs with the
//! residual added in its output (the down projection accumulates into x).
//! The logits must keep the CPU's argmax on most rows, as the staged
//! kernel's do, and stay within the seeds' bound of the staged kernel's
//! (other roundings of the weights, so not its bits). One test per binary:
//! the variables are process-wide.

mod chunked;
mod common;

use chunked::{assert_mostly_cpu_argmax, on_gpu, prompt_logits, prompt_of, setup};
use common::{compare, default_model, differing_bits, requantised_copy};
use fish_core::model::Model;
use fish_gguf::GgmlType;

#[test]
fn an_emulated_span_runs_the_fragments_kernel_within_the_bound() {
    std::env::set_var("FISH_GPU_PREFILL_EMULATED", "1");
    let Some(gpu) = setup() else { return };
    let path = requantised_copy(&default_model(), "frags", |name, ty| {
        let layer: Option<usize> = name
            .strip_prefix("blk.")
            .and_then(|rest| rest.split('.').next())
            .and_then(|n| n.parse().ok());
        match (layer, name.ends_with("ffn_down.weight")) {
            (Some(l), true) if l % 2 == 0 => GgmlType::Q4_K,
            (Some(_), true) => GgmlType::Q6_K,
            _ => ty,
        }
    });
    let cpu = Model::load(&path).expect("load");
    let prompt = prompt_of(&cpu);
    let cpu_logits = prompt_logits(&cpu, &prompt);

    std::env::set_var("FISH_VK_FRAGS_EMULATED", "1");
    let span = on_gpu(&gpu, Model::load(&path).expect("load"));
    let frags = prompt_logits(&span, &prompt);
    assert!(!span.gpu.as_ref().unwrap().has_failed());
    drop(span);
    std::env::set_var("FISH_VK_FRAGS_EMULATED", "0");
    let span = on_gpu(&gpu, Model::load(&path).expect("load"));
    let staged = prompt_logits(&span, &prompt);
    drop(span);
    let _ = std::fs::remove_file(&path);

    assert_mostly_cpu_argmax(&frags, &cpu_logits, "fragments");
    assert_mostly_cpu_argmax(&staged, &cpu_logits, "staged");
    let (same, worst) = compare(&frags, &staged);
    eprintln!(
        "fragments vs staged: argmax {same}/{}, max |dlogit| {:.3}%",
        frags.len(),
        worst * 100.0
    );
    assert!(worst <= 0.02, "fragments vs staged: {:.3}%", worst * 100.0);
    assert!(
        differing_bits(&frags, &staged) > 0,
        "the fragments kernel did not run: the staged kernel's bits"
    );
}
