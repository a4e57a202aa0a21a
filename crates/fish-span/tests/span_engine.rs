//! Stage 2 through the engine (seed 000's end-to-end test): three
//! teacher-forced runs on identical inputs — span, per-matmul, CPU — with the
//! span matching per-matmul; "Paris"; a cached prefix (span_kv_truncate);
//! all device memory freed on unload.

use std::path::PathBuf;
use std::sync::Arc;

use fish_core::backend::ComputeBackend;
use fish_core::model::{LogitsFor, Model, PlacementLimits};
use fish_core::sampling::argmax;
use fish_core::session::Session;
use fish_span::VulkanBackend;

const PROMPT: [u32; 5] = [504, 3575, 282, 4649, 314]; // "The capital of France is"
const PARIS: u32 = 7042;
const GPU_LAYERS: usize = 6;

fn default_model() -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        p.exists(),
        "{} is missing: run scripts/fetch-model.sh",
        p.display()
    );
    p
}

fn backend() -> Option<Arc<VulkanBackend>> {
    match VulkanBackend::open_owned() {
        Ok(b) => Some(Arc::new(b)),
        Err(e) if std::env::var("FISH_REQUIRE_GPU").is_ok_and(|v| v == "1") => {
            panic!("FISH_REQUIRE_GPU=1 but no Vulkan device: {e}")
        }
        Err(e) => {
            eprintln!("skipping: no Vulkan device ({e})");
            None
        }
    }
}

fn teacher_forced(model: &Model, forced: &[u32]) -> Vec<Vec<f32>> {
    let mut s = Session::new(model, 128, 2).expect("session");
    let mut out = vec![s.set_prompt(&PROMPT).expect("prompt")];
    for &t in forced {
        out.push(s.eval(&[t], LogitsFor::Last).expect("decode"));
    }
    out
}

/// (steps with the same argmax, worst max |dlogit| / max |logit|)
fn compare(a: &[Vec<f32>], b: &[Vec<f32>]) -> (usize, f32) {
    let (mut same, mut worst) = (0, 0f32);
    for (x, y) in a.iter().zip(b) {
        same += usize::from(argmax(x) == argmax(y));
        let max_abs = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = x.iter().zip(y).fold(0f32, |m, (p, q)| m.max((p - q).abs()));
        worst = worst.max(d / max_abs);
    }
    (same, worst)
}

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
    let (resident0, free0) = (gpu.bytes_resident(), gpu.memory_free());
    let cpu = Model::load(default_model()).expect("load");
    let mut s = Session::new(&cpu, 128, 2).expect("session");
    let mut logits = s.set_prompt(&PROMPT).expect("prompt");
    let mut forced = Vec::new();
    for _ in 0..32 {
        let t = argmax(&logits);
        forced.push(t);
        logits = s.eval(&[t], LogitsFor::Last).expect("decode");
    }
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
    assert_eq!(same, 33, "span and per-matmul argmax differ");
    assert!(worst <= 0.02, "span vs per-matmul {:.3}%", worst * 100.0);
    let (same, worst) = compare(&span_logits, &cpu_logits);
    eprintln!(
        "span vs CPU (information): argmax {same}/33, max |dlogit| {:.3}%",
        worst * 100.0
    );

    assert_eq!(gpu.bytes_resident(), resident0);
    assert_eq!(
        gpu.memory_free(),
        free0,
        "all device memory freed on unload"
    );
    assert_eq!(gpu.gpu().validation_messages(), 0);
}
