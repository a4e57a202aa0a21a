//! Spans with the decode fusions forced on (FISH_GPU_FUSE_NORM=1: the layer
//! and output norms inside the q/k/v, gate/up and output matvecs;
//! FISH_GPU_FUSE_ACT=1: the gated activation inside the down matvec), both
//! off by default, with the opt-in L2 prefetch (FISH_GPU_PREFETCH, which
//! must not change a bit) recorded beside them; and with the deferred norms
//! (on by default, FISH_GPU_DEFER_NORM=0 turns them off: wo and down
//! prepare the next norm, the q/k/v and gate/up matvecs apply its scale)
//! and the gated activation in the gate/up matvec's epilogue that comes
//! with them (on by default, FISH_GPU_FUSE_GATE_UP=0 turns it off), and
//! RoPE with the KV store inside the decode attention kernel (on by default,
//! FISH_GPU_FUSE_ROPE=0 dispatches them; the same bits).
//! Teacher-forced against the CPU and against the same span without
//! fusions; the profile of the last (single-token) forward shows that no
//! norm and no act*mul dispatch ran, or (deferred) only the first layer's
//! and the output's norms. One test only: the knobs are read from the
//! environment when a span is created.

mod common;

use std::sync::Arc;

use common::{
    compare, default_model, float_backend as backend, greedy_after_prompt, middle_layer_stages,
    span_teacher_forced, teacher_forced, PARIS,
};
use fish_core::backend::SpanBackend;
use fish_core::model::Model;
use fish_core::sampling::argmax;
use fish_span::VulkanBackend;

/// Teacher-forced logits of a span on `gpu` and its profile of the last forward.
fn span_logits(gpu: &Arc<VulkanBackend>, forced: &[u32]) -> (Vec<Vec<f32>>, String) {
    // The profile is the open span's: read it before the model goes.
    let (_model, logits) = span_teacher_forced(gpu, forced);
    (logits, gpu.span_profile().expect("profiled span"))
}

#[test]
fn fused_decode_matches_the_unfused_span_and_the_cpu() {
    // Level 3 also lists the middle layer's stages in order.
    std::env::set_var("FISH_GPU_PROFILE", "3");
    let Some(gpu) = backend().filter(common::has_subgroup_arithmetic_or_skip) else {
        return;
    };
    let cpu = Model::load(default_model()).expect("load");
    let forced = greedy_after_prompt(&cpu, 24);
    let cpu_logits = teacher_forced(&cpu, &forced);

    std::env::set_var("FISH_GPU_FUSE_NORM", "0");
    std::env::set_var("FISH_GPU_FUSE_ACT", "0");
    std::env::set_var("FISH_GPU_PREFETCH", "0");
    std::env::set_var("FISH_GPU_DEFER_NORM", "0");
    let (plain, plain_profile) = span_logits(&gpu, &forced);
    std::env::remove_var("FISH_GPU_DEFER_NORM");
    let (deferred, deferred_profile) = span_logits(&gpu, &forced);
    std::env::set_var("FISH_GPU_FUSE_GATE_UP", "0");
    let (deferred_act, deferred_act_profile) = span_logits(&gpu, &forced);
    std::env::remove_var("FISH_GPU_FUSE_GATE_UP");
    std::env::set_var("FISH_GPU_FUSE_ROPE", "0");
    let (deferred_rope, deferred_rope_profile) = span_logits(&gpu, &forced);
    std::env::remove_var("FISH_GPU_FUSE_ROPE");
    std::env::set_var("FISH_GPU_DEFER_NORM", "0");
    std::env::set_var("FISH_GPU_FUSE_NORM", "1");
    std::env::set_var("FISH_GPU_FUSE_ACT", "1");
    std::env::set_var("FISH_GPU_PREFETCH", "1");
    let (fused, fused_profile) = span_logits(&gpu, &forced);
    std::env::remove_var("FISH_GPU_DEFER_NORM");

    // Deferred norms: the first layer's attention norm and the output norm
    // still run as dispatches (2 of the 2 x layers + 1), the rest do not.
    let norm_share = |profile: &str| -> f64 {
        let at = profile.find("rmsnorm ").expect("rmsnorm share") + "rmsnorm ".len();
        let end = profile[at..].find('%').expect("percent") + at;
        profile[at..end].parse().expect("share")
    };
    assert!(
        norm_share(&deferred_profile) < norm_share(&plain_profile) / 4.0,
        "deferred: {deferred_profile}\nplain: {plain_profile}"
    );
    assert_eq!(argmax(&deferred[0]), PARIS);

    // The activation in the gate/up epilogue: no act*mul dispatch, and the
    // same sums and the same activation as the act*mul kernel, so the same
    // logits.
    assert!(
        deferred_profile.contains("act*mul 0.0%"),
        "{deferred_profile}"
    );
    assert!(
        !deferred_act_profile.contains("act*mul 0.0%"),
        "{deferred_act_profile}"
    );
    // A middle layer of a decode step: q/k/v, attention (with RoPE), wo,
    // gate/up and down; the dispatched act*mul adds its own stage.
    let expected = ["matvec", "attention", "matvec", "matvec", "matvec"];
    assert_eq!(
        middle_layer_stages(&deferred_profile),
        expected,
        "{deferred_profile}"
    );
    let with_act = [
        "matvec",
        "attention",
        "matvec",
        "matvec",
        "act*mul",
        "matvec",
    ];
    assert_eq!(
        middle_layer_stages(&deferred_act_profile),
        with_act,
        "{deferred_act_profile}"
    );
    let (same_act, worst_act) = compare(&deferred, &deferred_act);
    eprintln!(
        "act in the gate/up epilogue vs dispatched: argmax {same_act}/{}, max |dlogit| {:.6}% of max |logit|, bit-equal {}",
        deferred.len(),
        worst_act * 100.0,
        deferred == deferred_act
    );
    assert_eq!(same_act, deferred.len());
    assert!(worst_act <= 1e-5, "{:.6}%", worst_act * 100.0);
    // RoPE and the KV store inside the attention kernel against their own
    // dispatch and the plain attention kernel: the same bits.
    assert!(
        deferred_rope_profile.contains("RoPE+KV store")
            && !deferred_rope_profile.contains("RoPE+KV store 0.0%"),
        "{deferred_rope_profile}"
    );
    assert!(
        deferred_profile.contains("RoPE+KV store 0.0%"),
        "{deferred_profile}"
    );
    assert!(
        deferred == deferred_rope,
        "RoPE inside attention vs dispatched: the logits differ"
    );
    let steps = forced.len() + 1;
    let (same_deferred, worst_deferred) = compare(&deferred, &plain);
    eprintln!(
        "over {steps} steps: deferred vs plain span argmax {same_deferred}/{steps}, max |dlogit| {:.4}% of max |logit|",
        worst_deferred * 100.0
    );
    assert_eq!(same_deferred, steps, "deferred norms pick other tokens");
    assert!(
        worst_deferred <= 0.02,
        "deferred vs plain {:.3}%",
        worst_deferred * 100.0
    );

    // The unfused decode step runs norms and act*mul; the fused one none.
    assert!(!plain_profile.contains("rmsnorm 0.0%"), "{plain_profile}");
    assert!(!plain_profile.contains("act*mul 0.0%"), "{plain_profile}");
    assert!(fused_profile.contains("rmsnorm 0.0%"), "{fused_profile}");
    assert!(fused_profile.contains("act*mul 0.0%"), "{fused_profile}");

    assert_eq!(argmax(&fused[0]), PARIS);
    let (same_plain, worst_plain) = compare(&fused, &plain);
    let (same_cpu, worst_cpu) = compare(&fused, &cpu_logits);
    let (plain_same_cpu, plain_worst_cpu) = compare(&plain, &cpu_logits);
    eprintln!(
        "over {steps} steps: fused vs unfused span argmax {same_plain}/{steps}, max |dlogit| {:.3}%; vs CPU fused {same_cpu}/{steps} {:.3}%, unfused {plain_same_cpu}/{steps} {:.3}% of max |logit|",
        worst_plain * 100.0,
        worst_cpu * 100.0,
        plain_worst_cpu * 100.0
    );
    // The seeds' bound between the fused and the unfused span.
    assert_eq!(
        same_plain, steps,
        "fused and unfused spans pick other tokens"
    );
    assert!(
        worst_plain <= 0.02,
        "fused vs unfused {:.3}%",
        worst_plain * 100.0
    );
    // The CPU rounds its activations to int8, so both spans sit at some
    // distance from it: the fusions may not add to that distance.
    assert!(
        same_cpu >= plain_same_cpu,
        "fused {same_cpu} vs unfused {plain_same_cpu} CPU argmax"
    );
    assert!(
        worst_cpu <= plain_worst_cpu + 0.005,
        "fused span vs CPU {:.3}% (unfused {:.3}%)",
        worst_cpu * 100.0,
        plain_worst_cpu * 100.0
    );
    assert_eq!(gpu.gpu().validation_messages(), 0);
}
