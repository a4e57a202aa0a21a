//! Spans with the int8-activation matvec forced on (the policy
//! WhenSupported, as FISH_VK_INT8=1 gives it, which lavapipe needs: it does
//! not report the packed products as accelerated;
//! on GPUs that do, decode uses them by default). Teacher-forced against the
//! CPU, whose quant kernels also take int8 activations: both round the
//! activations, so the two runs differ by that rounding noise rather than
//! by float error; the bound is set against the float span's own distance
//! from the CPU, measured in the same test. The int8 run must give every matvec its input
//! quantised once, before it (the norm for q/k/v, gate/up and the output,
//! the attention for wo, the act*mul dispatch for down): none may quantise
//! x in every workgroup (`matvec_i8_*`). A verification round longer than
//! one matvec pass must give one-token decode's logits bit for bit, and a
//! batched decode step (rows in slots of their own) the sequences' own (bit
//! for bit, or within the int8 bound where steps of 8 rows run on the matrix
//! units). The activation in the int8 gate/up matvec's epilogue (the
//! default) must give the bits of the act*mul dispatch
//! (FISH_GPU_INT8_ACT_FUSED=0), and the layer norms in the prologues of
//! that kernel (the default for one-token steps) and of the q/k/v matvec
//! (both the default) the bits of the norm dispatches
//! (FISH_GPU_INT8_NORM_FUSED=0), also with their first weight rounds
//! loaded before the prologues (Gpu::with_preload_rows); so must the L2
//! prefetch at every place (FISH_GPU_PREFETCH_AT=all): one test in this
//! binary, since the variables are process-wide.

mod common;

use common::{
    assert_int8_within_float_bound, assert_round_equals_one_by_one, compare, default_model,
    differing_bits, float_backend, greedy_after_prompt, int8_backend_or_skip, span_teacher_forced,
    teacher_forced, PARIS, PROMPT,
};
use fish_core::batch::BatchSession;
use fish_core::model::{LogitsFor, Model};
use fish_core::sampling::argmax;
use fish_core::session::Session;
use fish_gguf::GgmlType;

#[test]
fn int8_span_decode_matches_the_cpu_and_answers_paris() {
    // One float device and one with the int8 matvec forced on.
    let Some(float_gpu) = float_backend() else {
        return;
    };
    assert!(!float_gpu.gpu().int8_matvec(GgmlType::Q4_1));
    let Some(gpu) = int8_backend_or_skip() else {
        return;
    };
    let cpu = Model::load(default_model()).expect("load");
    let forced = greedy_after_prompt(&cpu, 32);
    let cpu_logits = teacher_forced(&cpu, &forced);

    let float_logits = span_teacher_forced(&float_gpu, &forced).1;
    let (model, logits) = span_teacher_forced(&gpu, &forced);
    assert_eq!(argmax(&logits[0]), PARIS);
    let (float_same, float_worst) = compare(&float_logits, &cpu_logits);
    let (same, worst) = compare(&logits, &cpu_logits);
    eprintln!(
        "vs CPU over 33 steps: float span argmax {float_same}/33, max |dlogit| {:.3}%; int8 span argmax {same}/33, max |dlogit| {:.3}% of max |logit|",
        float_worst * 100.0,
        worst * 100.0
    );
    assert!(same >= 32, "argmax differs at {} steps", 33 - same);
    assert_int8_within_float_bound("int8 span", worst, float_worst);
    // Speculative verification relies on a multi-token round's rows being
    // one-token decode's logits bit for bit: the round's chunk quantises its
    // inputs in the multi-token kernels (plain attention, norm and act*mul
    // rows) and must round exactly as decode's single-token ones do.
    // 12 tokens: more than one pass of the matvec (8 tokens).
    let (prompt, round) = forced.split_at(forced.len() - 12);
    assert_round_equals_one_by_one(&model, prompt, round, 128);

    // Batched decode below the batch tile's rows (each row its own slot, the
    // int8 decode plan): the sequences as decoded alone. The pre-quantised
    // matvec has one shape for every batch, so each row sums in its
    // one-token order, bit for bit; any other order would flip int8 codes
    // at every stage's requantisation, and two int8 runs would differ by
    // their rounding noise (2-4.7% of max |logit| per step on SmolLM2,
    // measured when batched rows had a shape of their own). Steps of 8
    // sequences run on the matrix units where the device has int8 fragments
    // (Gpu::int8_span_kernel): the same greedy tokens, and the rows within
    // the int8 bound of single runs.
    let matrix_steps = gpu.gpu().info().int8_matrix.is_some()
        && std::env::var("FISH_VK_I8MM").as_deref() != Ok("0");
    let all: [&[u32]; 8] = [
        &PROMPT,
        &PROMPT[..2],
        &forced[..8],
        &forced[..5],
        &forced[..3],
        &PROMPT[..4],
        &forced[..10],
        &forced[..6],
    ];
    for prompts in [&all[..4], &all[..]] {
        let exact = prompts.len() < 8 || !matrix_steps;
        assert_batched_equals_single_runs(&model, prompts, exact, float_worst);
    }

    // Logits with `var` set to 0 against the default's, bit for bit.
    let assert_same_bits_with_off = |var: &str, what: &str| {
        std::env::set_var(var, "0");
        let other = span_teacher_forced(&gpu, &forced).1;
        std::env::remove_var(var);
        let differing = differing_bits(&logits, &other);
        assert_eq!(differing, 0, "{differing} logits differ with {what}");
    };
    // The gate/up matvec with the activation and its int8 copy in its
    // epilogue gives the logits of the act*mul dispatch bit for bit (the
    // same sums, the same activation, the same quantisation).
    drop(model);
    assert_same_bits_with_off("FISH_GPU_INT8_ACT_FUSED", "the act*mul dispatch");
    // The prologues sum and round the norms as their dispatches do.
    assert_same_bits_with_off("FISH_GPU_INT8_NORM_FUSED", "the norms dispatched");
    // The gate/up in narrow workgroups, the norm dispatched before it: each
    // row summed as in the 32-row blocks, and the last workgroup of a block
    // to arrive quantising it as their epilogue does.
    std::env::set_var("FISH_GPU_NARROW_GATE_UP", "1");
    let narrow = span_teacher_forced(&gpu, &forced).1;
    std::env::remove_var("FISH_GPU_NARROW_GATE_UP");
    let differing = differing_bits(&logits, &narrow);
    assert_eq!(
        differing, 0,
        "{differing} logits differ with the narrow gate/up"
    );
    // Their first weight rounds loaded before the prologues (part of a
    // round, and whole rounds): the same units summed in the same order.
    for rows in [1, 8] {
        let other = gpu
            .gpu()
            .with_preload_rows(rows, || span_teacher_forced(&gpu, &forced).1);
        let differing = differing_bits(&logits, &other);
        assert_eq!(
            differing, 0,
            "{differing} logits differ with {rows} rows preloaded"
        );
    }
    // The L2 prefetch at every place (beside attention: wo and the fused
    // gate/up's gate and up weights; beside gate/up: down; beside down: the
    // next layer's q/k/v) only reads weights: the same bits.
    std::env::set_var("FISH_GPU_PREFETCH", "64");
    std::env::set_var("FISH_GPU_PREFETCH_AT", "all");
    let prefetched = span_teacher_forced(&gpu, &forced).1;
    std::env::remove_var("FISH_GPU_PREFETCH");
    std::env::remove_var("FISH_GPU_PREFETCH_AT");
    let differing = differing_bits(&logits, &prefetched);
    assert_eq!(differing, 0, "{differing} logits differ with the prefetch");

    // SmolLM2's layers are Q4_1, its output Q8_0: both on pre-quantised x.
    let built = gpu.gpu().built_matmul_pipelines();
    for module in [
        "matvec_i8x_gateup_q4_1",
        "matvec_i8x_gateup_norm_q4_1",
        "matvec_i8x_gateup_narrow_q4_1",
        "matvec_i8x_norm_q4_1",
    ] {
        assert!(
            built.iter().any(|p| p.starts_with(module)),
            "{module} did not run: {built:?}"
        );
    }
    // Both normed kernels ran with rows preloaded (their last constants:
    // the rows preloaded, then the rows touched, none by default).
    for module in ["matvec_i8x_gateup_norm_q4_1[", "matvec_i8x_norm_q4_1["] {
        assert!(
            built
                .iter()
                .any(|p| p.starts_with(module) && p.ends_with(", 1, 0]")),
            "{module} did not run with a row preloaded: {built:?}"
        );
    }
    for module in ["l2_prefetch", "l2_prefetch_up"] {
        assert!(
            built.iter().any(|p| p.starts_with(&format!("{module}["))),
            "{module} did not run: {built:?}"
        );
    }
    for ty in ["q4_1", "q8_0"] {
        assert!(
            built
                .iter()
                .any(|p| p.starts_with(&format!("matvec_i8x_{ty}"))),
            "no pre-quantised int8 matvec ran on {ty}: {built:?}"
        );
    }
    // The pre-quantised shape: one subgroup-sized workgroup of 32 threads
    // (the float kernel's one-token shape of these types has 128).
    assert!(
        built.iter().any(|p| p.starts_with("matvec_i8x_q4_1[32, ")),
        "the pre-quantised matvec did not take its shape: {built:?}"
    );
    assert!(
        !built.iter().any(|p| p.starts_with("matvec_i8_")),
        "a matvec quantised its x per workgroup: {built:?}"
    );
    assert_eq!(gpu.gpu().validation_messages(), 0);
    assert_eq!(float_gpu.gpu().validation_messages(), 0);
}

/// Steps `prompts` as one batched session (each a sequence of its own) and
/// compares every row with the sequence decoded alone: bit for bit where
/// `exact`, else the same greedy tokens with rows within the int8 bound
/// (`float_worst`: the float span's distance from the CPU).
fn assert_batched_equals_single_runs(
    model: &Model,
    prompts: &[&[u32]],
    exact: bool,
    float_worst: f32,
) {
    const STEPS: usize = 3;
    let mut batch = BatchSession::new(model, prompts.len(), 64, 2).expect("batch");
    let mut batched: Vec<Vec<Vec<f32>>> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| vec![batch.eval_one(i, p, LogitsFor::Last).expect("prompt")])
        .collect();
    for _ in 0..STEPS {
        let next: Vec<u32> = batched.iter().map(|l| argmax(&l[l.len() - 1])).collect();
        for (l, row) in batched
            .iter_mut()
            .zip(batch.step_all(&next).expect("step").into_rows())
        {
            l.push(row);
        }
    }
    let stats = batch.stats();
    assert_eq!(
        (stats.span_steps, stats.host_steps),
        (STEPS, 0),
        "{stats:?}"
    );
    drop(batch);
    let n = prompts.len();
    for (p, rows) in prompts.iter().zip(&batched) {
        let mut single = Session::new(model, 64, 2).expect("session");
        let mut alone = vec![single.set_prompt(p).expect("prompt")];
        for _ in 0..STEPS {
            let t = argmax(&alone[alone.len() - 1]);
            alone.push(single.eval(&[t], LogitsFor::Last).expect("decode"));
        }
        let (same, worst) = compare(rows, &alone);
        assert_eq!(
            same,
            STEPS + 1,
            "batched int8 decode of {n}: greedy tokens differ"
        );
        if exact {
            assert!(
                rows.iter()
                    .flatten()
                    .zip(alone.iter().flatten())
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "batched int8 decode of {n} differs from single runs ({:.4}% of max |logit|)",
                worst * 100.0
            );
        } else {
            eprintln!(
                "batched int8 decode of {n} on the matrix units: {:.3}% of max |logit|",
                worst * 100.0
            );
            assert_int8_within_float_bound(
                "batched int8 decode on the matrix units",
                worst,
                float_worst,
            );
        }
    }
}
