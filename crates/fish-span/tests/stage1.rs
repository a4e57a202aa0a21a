//! Stage 1 on a real device (lavapipe in CI): teacher-forced agreement with
//! the CPU, "Paris", device memory freed on unload, and the CPU fallback when
//! the device fails mid-run.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::{
    assert_int8_within_float_bound, assert_memory_returned, compare, default_model,
    greedy_after_prompt, memory_mark, teacher_forced, PARIS,
};
use fish_core::backend::{BackendError, ComputeBackend};
use fish_core::model::{Model, PlacementLimits};
use fish_core::sampling::argmax;
use fish_span::VulkanBackend;

/// Layers placed in these tests: enough to exercise every group, few enough
/// that a software rasteriser runs 33 steps quickly.
const GPU_LAYERS: usize = 6;

/// A device with spans turned off (these tests are about per-matmul
/// offload) and float matvecs (the int8 ones are held to their own bound).
fn backend() -> Option<Arc<VulkanBackend>> {
    std::env::set_var("FISH_GPU_SPAN", "0");
    common::float_backend()
}

/// The default model with its last `layers` layers (and the output) placed on `gpu`.
fn placed_on(gpu: Arc<dyn ComputeBackend>, layers: usize) -> Model {
    let mut model = Model::load(default_model()).expect("load");
    model.place_on(
        gpu,
        PlacementLimits {
            max_layers: Some(layers),
        },
    );
    model
}

/// `model`'s logits teacher-forced on `forced` (no device failure on the
/// way), compared with the CPU's: (steps with the same argmax, max |dlogit|
/// as a share of max |logit|), printed as `what`.
fn forced_vs_cpu(
    model: &Model,
    forced: &[u32],
    cpu_logits: &[Vec<f32>],
    what: &str,
) -> (Vec<Vec<f32>>, usize, f32) {
    let logits = teacher_forced(model, forced);
    assert!(!model.gpu.as_ref().unwrap().has_failed());
    let (same, worst) = compare(cpu_logits, &logits);
    eprintln!(
        "{what} vs CPU: argmax {same}/33, max |dlogit| {:.2}% of max |logit|",
        worst * 100.0
    );
    (logits, same, worst)
}

#[test]
fn stage1_agrees_with_the_cpu_over_33_teacher_forced_steps() {
    let Some(gpu) = backend() else { return };
    let cpu = Model::load(default_model()).expect("load");
    // The reference: 32 greedy CPU tokens.
    let forced = greedy_after_prompt(&cpu, 32);
    let cpu_logits = teacher_forced(&cpu, &forced[..32]);

    let model = placed_on(gpu.clone(), GPU_LAYERS);
    let placement = model.gpu.as_ref().expect("placed");
    assert_eq!(placement.n_layers_placed(), GPU_LAYERS);
    assert!(placement.output.is_some(), "output projection placed first");
    let (gpu_logits, same, worst) = forced_vs_cpu(&model, &forced[..32], &cpu_logits, "stage 1");
    assert!(same >= 32, "argmax agreed at {same}/33 steps");
    assert!(worst <= 0.04, "max |dlogit| {:.2}%", worst * 100.0);
    assert_eq!(argmax(&gpu_logits[0]), PARIS);
    assert!(model
        .gpu_describe()
        .unwrap()
        .contains(&format!("{GPU_LAYERS}/30 layers + output")));

    // The int8 matvecs (the default where the device accelerates the
    // products; forced here so that lavapipe runs them too): their rounding
    // of x differs from the CPU's, so the bound is twice the float
    // distance, as for int8 spans (span_int8.rs). On the H200: 4.44%
    // against 3.25% float.
    let Some(int8_gpu) = common::backend_with_int8(fish_vk::Int8Policy::WhenSupported) else {
        return;
    };
    assert!(int8_gpu.gpu().int8_matvec(fish_gguf::GgmlType::Q4_1));
    drop(model);
    let model = placed_on(int8_gpu, GPU_LAYERS);
    let (_, int8_same, int8_worst) =
        forced_vs_cpu(&model, &forced[..32], &cpu_logits, "stage 1 int8");
    assert!(
        int8_same >= 32,
        "int8: argmax agreed at {int8_same}/33 steps"
    );
    assert_int8_within_float_bound("stage 1", int8_worst, worst);
}

#[test]
fn unloading_frees_all_device_memory() {
    let Some(gpu) = backend() else { return };
    let (resident0, allocs0, mark) = (
        gpu.bytes_resident(),
        gpu.gpu().allocation_count(),
        memory_mark(&gpu),
    );
    let model = placed_on(gpu.clone(), 2);
    assert!(
        gpu.bytes_resident() > resident0 + 30_000_000,
        "output + 2 layers resident"
    );
    drop(model);
    assert_eq!(gpu.bytes_resident(), resident0);
    assert_eq!(gpu.gpu().allocation_count(), allocs0);
    assert_memory_returned(
        &gpu,
        &mark,
        "memory in use back to its value before the load",
    );
    assert_eq!(gpu.gpu().validation_messages(), 0);
}

/// Delegates to a real backend until `fail_after` matmul calls, then fails
/// every call, like a lost device.
struct Flaky {
    inner: Arc<VulkanBackend>,
    calls: AtomicUsize,
    fail_after: usize,
}

impl Flaky {
    /// Every matmul counts; from the fail_after-th on they fail.
    fn before_matmul(&self) -> Result<(), BackendError> {
        if self.calls.fetch_add(1, Ordering::Relaxed) >= self.fail_after {
            return Err(BackendError::Device("injected device loss".into()));
        }
        Ok(())
    }
}

forwarding_backend!(Flaky);

#[test]
fn a_device_failure_mid_run_moves_the_rest_to_the_cpu() {
    let Some(gpu) = backend() else { return };
    let cpu = Model::load(default_model()).expect("load");
    // Prompt (4 groups x 2 layers + output = 9 calls) succeeds; the device
    // dies during the first decode step.
    let flaky = Arc::new(Flaky {
        inner: gpu,
        calls: AtomicUsize::new(0),
        fail_after: 12,
    });
    let model = placed_on(flaky, 2);
    let forced = [PARIS, 30, 198];
    let gpu_logits = teacher_forced(&model, &forced);
    let cpu_logits = teacher_forced(&cpu, &forced);
    let placement = model.gpu.as_ref().unwrap();
    assert!(placement.has_failed());
    assert!(
        placement.layer(29).is_none() && placement.output().is_none(),
        "all work back on the CPU"
    );
    // The output stays correct: same tokens, logits within the stage-1 bound
    // (earlier positions' keys/values came from the device).
    let (same, worst) = compare(&cpu_logits, &gpu_logits);
    assert_eq!(same, cpu_logits.len(), "same tokens");
    assert!(worst <= 0.04, "max |dlogit| {:.2}%", worst * 100.0);
}
