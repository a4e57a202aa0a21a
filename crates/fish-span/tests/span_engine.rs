//! Stage 2 through the engine (seed 000's end-to-end test): three
//! teacher-forced runs on identical inputs — span, per-matmul, CPU — with the
//! span matching per-matmul; "Paris"; a cached prefix (span_kv_truncate);
//! all device memory freed on unload.

mod common;

use std::sync::Arc;

use common::{
    assert_memory_returned, compare, default_model, float_backend as backend, greedy_after_prompt,
    memory_mark, teacher_forced, PARIS,
};
use fish_core::backend::ComputeBackend;
use fish_core::model::{Model, PlacementLimits};
use fish_core::sampling::argmax;
use fish_core::session::Session;
use fish_span::VulkanBackend;

const GPU_LAYERS: usize = 6;

fn placed(gpu: &Arc<VulkanBackend>, spans: &str) -> Model {
    // One test function drives all three runs, so toggling the knob races nothing.
    std::env::set_var("FISH_GPU_SPAN", spans);
    let mut model = Model::load(default_model()).expect("load");
    model.place_on(
        gpu.clone(),
        PlacementLimits {
            max_layers: Some(GPU_LAYERS),
        },
    );
    model
}

#[test]
fn span_matches_per_matmul_and_answers_paris() {
    let Some(gpu) = backend() else { return };
    let (resident0, mark) = (gpu.bytes_resident(), memory_mark(&gpu));
    let cpu = Model::load(default_model()).expect("load");
    let forced = greedy_after_prompt(&cpu, 32);
    let cpu_logits = teacher_forced(&cpu, &forced);

    let span_model = placed(&gpu, "1");
    assert!(
        span_model
            .gpu_describe()
            .unwrap()
            .contains(&format!("span {GPU_LAYERS} layers")),
        "{}",
        span_model.gpu_describe().unwrap()
    );
    let span_logits = teacher_forced(&span_model, &forced);
    assert!(!span_model.gpu.as_ref().unwrap().has_failed());
    assert_eq!(argmax(&span_logits[0]), PARIS);

    // A second prompt sharing a prefix with the cached one: the session
    // truncates, the device KV follows (span_kv_truncate), and the result is
    // the same as a fresh evaluation.
    let mut a = Session::new(&span_model, 64, 2).expect("session");
    a.set_prompt(&[504, 3575, 282, 4649, 314, 7042])
        .expect("first");
    let reused = a.set_prompt(&[504, 3575, 282, 4649, 260]).expect("second");
    drop(a);
    let mut b = Session::new(&span_model, 64, 2).expect("session");
    let fresh = b.set_prompt(&[504, 3575, 282, 4649, 260]).expect("fresh");
    let (same, worst) = compare(&[reused], &[fresh]);
    assert_eq!(same, 1);
    assert!(worst < 1e-5, "prefix reuse changed logits by {worst}");
    drop(b);
    drop(span_model);

    let per_matmul = placed(&gpu, "0");
    assert!(!per_matmul.gpu_describe().unwrap().contains("span"));
    let mm_logits = teacher_forced(&per_matmul, &forced);
    drop(per_matmul);

    let (same, worst) = compare(&span_logits, &mm_logits);
    eprintln!(
        "span vs per-matmul: argmax {same}/33, max |dlogit| {:.3}% of max |logit|",
        worst * 100.0
    );
    let (cpu_same, cpu_worst) = compare(&span_logits, &cpu_logits);
    eprintln!(
        "span vs CPU (information): argmax {cpu_same}/33, max |dlogit| {:.3}%",
        cpu_worst * 100.0
    );
    let (mm_cpu_same, mm_cpu_worst) = compare(&mm_logits, &cpu_logits);
    eprintln!(
        "per-matmul vs CPU (information): argmax {mm_cpu_same}/33, max |dlogit| {:.3}%",
        mm_cpu_worst * 100.0
    );
    assert_eq!(same, 33, "span and per-matmul argmax differ");
    assert!(worst <= 0.02, "span vs per-matmul {:.3}%", worst * 100.0);

    assert_eq!(gpu.bytes_resident(), resident0);
    assert_memory_returned(&gpu, &mark, "all device memory freed on unload");
    assert_eq!(gpu.gpu().validation_messages(), 0);
}
