//! A span's prefill chunk on the wide tile with its steps split across
//! workgroups (split_k.rs SplitRule::wide), on a device without cooperative
//! matrices: FISH_GPU_PREFILL_EMULATED=1 gives spans the emulated kernel,
//! FISH_VK_WIDE_MIN=1 puts every plan of a chunk of 128 tokens or more on
//! the wide tile, and FISH_VK_WIDE_SPLIT_MIN_STEPS=16 lets the down
//! projection's 48 steps (SmolLM2's 1536-value rows) split three ways. The
//! span must size its split scratch for that emulated tile: sized for the
//! device's wide tile alone (none here) the partials ran past the end of
//! the scratch and the logits were garbage. One test per binary: the
//! variables are process-wide and read when the device opens.

mod chunked;
mod common;

use chunked::{assert_mostly_cpu_argmax, on_gpu, prompt_logits, prompt_of};
use common::{default_model, float_backend};
use fish_core::model::Model;

#[test]
fn an_emulated_span_splits_wide_tiles_within_its_scratch() {
    std::env::set_var("FISH_GPU_PREFILL_EMULATED", "1");
    std::env::set_var("FISH_VK_WIDE_MIN", "1");
    std::env::set_var("FISH_VK_WIDE_SPLIT_MIN_STEPS", "16");
    let Some(gpu) = float_backend() else { return };
    let cpu = Model::load(default_model()).expect("load");
    let prompt = prompt_of(&cpu);
    assert!(prompt.len() >= 128, "{} tokens: no wide tile", prompt.len());
    let tile = gpu
        .gpu()
        .plan_tile_for(fish_vk::Kernel::CoopMatEmulated, (1536, 576), prompt.len())
        .expect("plan")
        .expect("a cooperative tile");
    assert_eq!(
        (tile.rows(), tile.tokens()),
        (128, 128),
        "{}",
        tile.describe()
    );
    let cpu_logits = prompt_logits(&cpu, &prompt);
    let span = on_gpu(&gpu, Model::load(default_model()).expect("load"));
    let logits = prompt_logits(&span, &prompt);
    assert!(!span.gpu.as_ref().unwrap().has_failed());
    assert_mostly_cpu_argmax(&logits, &cpu_logits, "split wide tiles");
}
