//! A span whose weights are split across several device buffers
//! (FISH_VK_CHUNK_MB=1, as tensors beyond a device's buffer limits are):
//! every chunk is a dispatch, and the gate/up matvec with the activation in
//! its epilogue pairs gate chunk i with up chunk i. Teacher-forced decode on
//! Qwen2.5-Coder-0.5B (its 3 MB Q5_0 gate and up tensors take three chunks
//! each) gives the logits of the same span over unsplit weights (the seeds'
//! bound: same argmax, max |dlogit| <= 2% of max |logit|). One test
//! only: the chunk size is read from the environment when a device opens.

mod common;

use common::{
    backend, compare, greedy_after_prompt, middle_layer_stages, model_path, optional_model,
    span_teacher_forced_on,
};
use fish_core::backend::SpanBackend;
use fish_core::model::Model;

#[test]
fn a_span_over_split_weights_gives_the_logits_of_unsplit_ones() {
    let file = "qwen2.5-coder-0.5b-instruct.gguf";
    if !optional_model("qwen05", file) {
        return;
    }
    std::env::set_var("FISH_GPU_PROFILE", "3");
    let path = model_path(file);
    let cpu = Model::load(&path).expect("load");
    let forced = greedy_after_prompt(&cpu, 6);
    drop(cpu);

    std::env::set_var("FISH_VK_CHUNK_MB", "1");
    let split_gpu = backend();
    std::env::remove_var("FISH_VK_CHUNK_MB");
    let Some(split_gpu) = split_gpu else { return };
    let (split_model, split_logits) = span_teacher_forced_on(&split_gpu, &path, &forced);
    let split_allocations = split_gpu.gpu().allocation_count();
    // The decode step's layers ran the gate/up epilogue (no act*mul stage).
    // Their q/k/v follow a norm dispatch: a down projection of several
    // chunks cannot prepare the deferred norm (one sum per workgroup of one
    // dispatch); Qwen2's q/k/v biases add a stage.
    let profile = split_gpu.span_profile().expect("profiled span");
    assert_eq!(
        middle_layer_stages(&profile),
        [
            "rmsnorm",
            "matvec",
            "add",
            "attention",
            "matvec",
            "matvec",
            "matvec"
        ],
        "{profile}"
    );
    assert_eq!(split_gpu.gpu().validation_messages(), 0);
    drop(split_model);
    drop(split_gpu);

    let Some(gpu) = backend() else { return };
    let (_model, logits) = span_teacher_forced_on(&gpu, &path, &forced);
    assert!(
        split_allocations > gpu.gpu().allocation_count(),
        "the 1 MB chunks split the weights ({split_allocations} allocations vs {})",
        gpu.gpu().allocation_count()
    );
    // Each row sums as in one buffer; the unsplit span defers its q/k/v
    // norms (scaling the sums, not the inputs), so the seeds' bound applies.
    let (same, worst) = compare(&split_logits, &logits);
    eprintln!(
        "split vs unsplit weights over {} steps: argmax {same}, max |dlogit| {:.4}% of max |logit|",
        logits.len(),
        worst * 100.0,
    );
    assert_eq!(same, logits.len());
    assert!(worst <= 0.02, "{:.4}%", worst * 100.0);
    assert_eq!(gpu.gpu().validation_messages(), 0);
}
