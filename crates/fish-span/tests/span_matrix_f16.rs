//! Batched decode steps of 8 sequences on a Q4_K / Q6_K model read x in f16
//! on the matrix units (`Gpu::int8_matrix_reads_f16`: the norms, the decode
//! attention and the activation write f16 for them instead of int8 copies).
//! Their rows must stay near the sequences decoded alone: within the int8
//! bound, and no further than the int8 form of the same steps
//! (FISH_VK_I8MM_X16=0); and the activation in the gate/up epilogue (the
//! default there) must give the rows of the act*mul dispatch bit for bit
//! (FISH_GPU_MATRIX_ACT_FUSED=0). Needs a device with int8 fragments and a model
//! whose every matrix has rows of whole super-blocks, which the default
//! model (576-value rows) is not: run with `--ignored` and
//! FISH_TEST_Q4K_MODEL=FILE, e.g. from `fish-cli synth --shape llama-1b
//! --type q4_k_m FILE`.

mod common;

use common::backend;
use fish_core::batch::BatchSession;
use fish_core::model::{LogitsFor, Model, PlacementLimits};
use fish_core::sampling::argmax;
use fish_core::session::Session;

const ROWS: usize = 8;
const STEPS: usize = 3;

/// What one configuration gave: the batched steps' rows per sequence, their
/// worst max |dlogit| against the single runs as a fraction of max |logit|,
/// the steps whose argmax agree, and the matmul pipelines built.
struct Outcome {
    rows: Vec<Vec<Vec<f32>>>,
    worst: f32,
    same: usize,
    built: Vec<String>,
}

/// Steps ROWS sequences as one batched session, then decodes each alone on
/// the tokens the batched run chose; returns the batched steps' rows, the
/// worst max |dlogit| per step as a fraction of max |logit|, and the steps
/// whose argmax agree.
fn batched_against_single_runs(
    model: &Model,
    prompts: &[Vec<u32>],
) -> (Vec<Vec<Vec<f32>>>, f32, usize) {
    let mut batch = BatchSession::new(model, prompts.len(), 64, 2).expect("batch");
    let mut rows: Vec<Vec<Vec<f32>>> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| vec![batch.eval_one(i, p, LogitsFor::Last).expect("prompt")])
        .collect();
    let mut chosen: Vec<Vec<u32>> = vec![Vec::new(); prompts.len()];
    for _ in 0..STEPS {
        let next: Vec<u32> = rows.iter().map(|l| argmax(&l[l.len() - 1])).collect();
        for (c, &t) in chosen.iter_mut().zip(&next) {
            c.push(t);
        }
        let step = batch.step_all(&next).expect("step").into_rows();
        for (l, row) in rows.iter_mut().zip(step) {
            l.push(row);
        }
    }
    assert_eq!(batch.stats().span_steps, STEPS, "{:?}", batch.stats());
    drop(batch);
    let (mut worst, mut same) = (0f32, 0);
    for ((p, batched), tokens) in prompts.iter().zip(&rows).zip(&chosen) {
        let mut single = Session::new(model, 64, 2).expect("session");
        let mut alone = vec![single.set_prompt(p).expect("prompt")];
        for &t in tokens {
            alone.push(single.eval(&[t], LogitsFor::Last).expect("decode"));
        }
        // The prompt rows come from plain forwards either way; the steps
        // are what the batched kernels computed.
        for (b, a) in batched[1..].iter().zip(&alone[1..]) {
            same += usize::from(argmax(b) == argmax(a));
            let max_abs = a.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = a.iter().zip(b).fold(0f32, |m, (p, q)| m.max((p - q).abs()));
            worst = worst.max(d / max_abs);
        }
    }
    let steps = rows.into_iter().map(|r| r[1..].to_vec()).collect();
    (steps, worst, same)
}

fn run_on(path: &std::path::Path, prompts: &[Vec<u32>]) -> Outcome {
    let gpu = backend().expect("a device");
    assert!(
        gpu.gpu().info().int8_matrix.is_some(),
        "the device has no int8 fragments"
    );
    let mut model = Model::load(path).expect("load");
    model.place_on(gpu.clone(), PlacementLimits { max_layers: None });
    let (rows, worst, same) = batched_against_single_runs(&model, prompts);
    assert!(!model.gpu.as_ref().unwrap().has_failed());
    drop(model);
    let built = gpu.gpu().built_matmul_pipelines();
    Outcome {
        rows,
        worst,
        same,
        built,
    }
}

/// `run_on` with the environment variable `name` set to "0".
fn run_without(name: &str, path: &std::path::Path, prompts: &[Vec<u32>]) -> Outcome {
    std::env::set_var(name, "0");
    let outcome = run_on(path, prompts);
    std::env::remove_var(name);
    outcome
}

#[test]
#[ignore = "needs int8 fragments and FISH_TEST_Q4K_MODEL (a Q4_K_M model of whole super-blocks)"]
fn batched_matrix_steps_on_f16_x_stay_near_single_runs() {
    let path = std::env::var("FISH_TEST_Q4K_MODEL").expect("FISH_TEST_Q4K_MODEL=FILE");
    let path = std::path::Path::new(&path);
    let prompts_of = |rows: u32| -> Vec<Vec<u32>> {
        (0..rows)
            .map(|i| (0..3 + i % 8).map(|j| 1000 + 37 * i + 11 * j).collect())
            .collect()
    };
    let prompts = prompts_of(ROWS as u32);

    let f16 = run_on(path, &prompts);
    for module in ["matvec_i8mm_x16_q4_k", "matvec_i8mm_x16_gateup_q4_k"] {
        assert!(
            f16.built.iter().any(|p| p.starts_with(module)),
            "{module} did not run: {:?}",
            f16.built
        );
    }
    let dispatched = run_without("FISH_GPU_MATRIX_ACT_FUSED", path, &prompts);
    assert!(
        !dispatched
            .built
            .iter()
            .any(|p| p.starts_with("matvec_i8mm_x16_gateup")),
        "FISH_GPU_MATRIX_ACT_FUSED=0 still fused: {:?}",
        dispatched.built
    );
    let differing = f16
        .rows
        .iter()
        .flatten()
        .flatten()
        .zip(dispatched.rows.iter().flatten().flatten())
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    assert_eq!(
        differing, 0,
        "{differing} logits differ with the act*mul dispatch"
    );
    let int8 = run_without("FISH_VK_I8MM_X16", path, &prompts);
    assert!(
        !int8.built.iter().any(|p| p.starts_with("matvec_i8mm_x16_")),
        "FISH_VK_I8MM_X16=0 still read f16 x: {:?}",
        int8.built
    );
    let (f16_worst, f16_same) = (f16.worst, f16.same);
    let (int8_worst, int8_same) = (int8.worst, int8.same);
    eprintln!(
        "batched steps vs single runs over {} rows: f16 x {:.3}% of max |logit| ({f16_same} argmax equal), int8 x {:.3}% ({int8_same})",
        ROWS * STEPS,
        f16_worst * 100.0,
        int8_worst * 100.0
    );
    // The single runs' own int8 rounding dominates either way; f16 x adds
    // less than the int8 copies it replaces.
    assert!(
        f16_worst <= int8_worst.max(0.01) * 1.25,
        "f16 x {:.3}% against int8 x {:.3}%",
        f16_worst * 100.0,
        int8_worst * 100.0
    );
    assert!(f16_worst <= 0.05, "f16 x {:.3}%", f16_worst * 100.0);

    // Steps of 16 rows take the same plan in two passes of 8 tokens
    // (record.rs `matrix_step_rows`), not the batch tile.
    let wide = run_on(path, &prompts_of(16));
    eprintln!(
        "16 rows: f16 x {:.3}% of max |logit| ({} of {} argmax equal)",
        wide.worst * 100.0,
        wide.same,
        16 * STEPS
    );
    assert!(
        wide.built
            .iter()
            .any(|p| p.starts_with("matvec_i8mm_x16_gateup_q4_k")),
        "16-row steps left the matrix units: {:?}",
        wide.built
    );
    assert!(wide.worst <= 0.05, "16 rows: {:.3}%", wide.worst * 100.0);
}
