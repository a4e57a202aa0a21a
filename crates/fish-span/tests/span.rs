//! Stage 2 on a real device (lavapipe in CI): the span's residual stream
//! against the same layers run with stage-1 matmuls and CPU attention, over a
//! prefill chunk and decode steps; the gap refusal; truncate-and-repeat; and
//! all device memory freed after span_end and unload.

mod common;

use std::sync::Arc;

use common::{
    assert_memory_returned, float_backend as backend, memory_mark, model_path, optional_model,
};
use fish_core::backend::ComputeBackend;
use fish_core::model::layer_range::{embed_tokens, forward_layers, output_rows};
use fish_core::model::{KvCache, Model, PlacementLimits};
use fish_span::VulkanBackend;

/// "The capital of France is Paris. It" and a few more tokens.
const TOKENS: [u32; 11] = [504, 3575, 282, 4649, 314, 7042, 30, 657, 314, 253, 1789];
const N_CTX: usize = 160;

/// The model with its last `n` layers placed, and the first placed layer.
fn placed(gpu: &Arc<VulkanBackend>, file: &str, n: usize) -> (Model, usize) {
    place(gpu, Model::load(model_path(file)).expect("load"), file, n)
}

/// `model` with its last `n` layers placed, and the first placed layer.
fn place(gpu: &Arc<VulkanBackend>, mut model: Model, file: &str, n: usize) -> (Model, usize) {
    model.place_on(
        gpu.clone(),
        PlacementLimits {
            max_layers: Some(n),
        },
    );
    let placement = model.gpu.as_ref().expect("placed");
    assert_eq!(placement.n_layers_placed(), n, "{file}: layers placed");
    let first = model.cfg.n_layer - n;
    (model, first)
}

/// Opens the span over the placed layers.
fn begin_span(gpu: &VulkanBackend, model: &Model, first: usize) -> u64 {
    let spec = model.span_spec(first, N_CTX).expect("placed");
    gpu.as_span()
        .expect("spans")
        .span_begin(&spec)
        .expect("span_begin")
}

/// Runs tokens through the layers below the span (CPU) and, as the
/// reference, through the span's layers (stage-1 matmuls, CPU attention).
struct Reference<'a> {
    model: &'a Model,
    first: usize,
    below: KvCache,
    above: KvCache,
}

impl<'a> Reference<'a> {
    fn new(model: &'a Model, first: usize) -> Self {
        Self::with_context(model, first, N_CTX)
    }

    fn with_context(model: &'a Model, first: usize, n_ctx: usize) -> Self {
        Reference {
            model,
            first,
            below: model.new_cache(n_ctx),
            above: model.new_cache(n_ctx),
        }
    }

    /// (the span's input, the reference output) for `tokens` at `pos0`.
    fn step(&mut self, tokens: &[u32], pos0: usize) -> (Vec<f32>, Vec<f32>) {
        let mut x = embed_tokens(self.model, tokens).expect("embed");
        forward_layers(self.model, &mut self.below, &mut x, pos0, 0..self.first).expect("below");
        let input = x.clone();
        let n_layer = self.model.cfg.n_layer;
        forward_layers(
            self.model,
            &mut self.above,
            &mut x,
            pos0,
            self.first..n_layer,
        )
        .expect("reference");
        (input, x)
    }
}

/// max |a - b| / max |b|.
fn relative_error(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let max_abs = b.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    d / max_abs
}

/// Prefill of `n_prefill` tokens then single-token decode steps through the
/// span; each output against the reference. Returns the worst error.
fn span_vs_reference(gpu: &VulkanBackend, model: &Model, first: usize, n_prefill: usize) -> f32 {
    let span = gpu.as_span().expect("spans");
    let tokens: Vec<u32> = (0..n_prefill + 4)
        .map(|i| TOKENS[i % TOKENS.len()])
        .collect();
    let mut reference = Reference::new(model, first);
    let (input, want) = reference.step(&tokens[..n_prefill], 0);
    let mut x = input;
    span.span_forward(&mut x, n_prefill, 0).expect("prefill");
    let mut worst = relative_error(&x, &want);
    assert_eq!(span.span_kv_len(), n_prefill);
    for pos in n_prefill..tokens.len() {
        let (input, want) = reference.step(&tokens[pos..pos + 1], pos);
        let mut x = input;
        span.span_forward(&mut x, 1, pos).expect("decode");
        worst = worst.max(relative_error(&x, &want));
    }
    assert_eq!(span.span_kv_len(), tokens.len());
    worst
}

fn check_model(file: &str, n_layers: usize, prefills: &[usize]) {
    let Some(gpu) = backend() else { return };
    let (model, first) = placed(&gpu, file, n_layers);
    check_placed(&gpu, &model, first, file, n_layers, prefills);
}

/// check_model on a model already placed from its layer `first` on.
fn check_placed(
    gpu: &Arc<VulkanBackend>,
    model: &Model,
    first: usize,
    file: &str,
    n_layers: usize,
    prefills: &[usize],
) {
    for &n_prefill in prefills {
        let bytes = begin_span(gpu, model, first);
        assert!(bytes > 0);
        assert!(gpu.describe().contains(&format!("span {n_layers} layers")));
        let worst = span_vs_reference(gpu, model, first, n_prefill);
        eprintln!(
            "{file}: span vs stage 1 + CPU over {n_layers} layers, prefill {n_prefill} + 4 decode steps: max |dx| {:.4}% of max |x|",
            worst * 100.0
        );
        assert!(worst < 0.01, "{file}: max |dx| {:.3}%", worst * 100.0);
        gpu.as_span().unwrap().span_end();
    }
    assert_eq!(gpu.gpu().validation_messages(), 0);
}

#[test]
fn span_matches_the_layers_with_stage1_matmuls_on_smollm2() {
    // 150 positions: attention folds more than one block of keys.
    check_model("SmolLM2-135M-Instruct.Q4_1.gguf", 5, &[7, 70, 150]);
}

#[test]
fn span_matches_with_a_sliding_window_shorter_than_the_prompt() {
    // Every other layer slides over 24 positions (the CPU reference reads
    // the same configuration): the prefill chunk's blocks of queries then
    // mask keys at both ends, and so do the decode steps.
    let Some(gpu) = backend() else { return };
    let file = "SmolLM2-135M-Instruct.Q4_1.gguf";
    let mut model = Model::load(model_path(file)).expect("load");
    model.cfg.sliding_window = 24;
    model.cfg.swa_period = 2;
    model.cfg.rope_base_swa = model.cfg.rope_base;
    let (model, first) = place(&gpu, model, file, 4);
    assert!((first..model.cfg.n_layer).any(|il| model.cfg.is_swa_layer(il)));
    check_placed(&gpu, &model, first, file, 4, &[70]);
}

#[test]
fn span_matches_on_qwen2_with_biases_and_neox_rope() {
    let file = "qwen2.5-coder-0.5b-instruct.gguf";
    if optional_model("qwen05", file) {
        check_model(file, 4, &[7, 70]);
    }
}

#[test]
fn span_matches_on_gemma3_with_qk_norms_post_norms_and_geglu() {
    let file = "gemma-3-270m-q4_k_m.gguf";
    if optional_model("gemma3", file) {
        check_model(file, 6, &[7, 70]);
    }
}

#[test]
fn a_gap_is_refused_and_truncate_then_reforward_repeats() {
    let Some(gpu) = backend() else { return };
    let (model, first) = placed(&gpu, "SmolLM2-135M-Instruct.Q4_1.gguf", 4);
    begin_span(&gpu, &model, first);
    let span = gpu.as_span().unwrap();
    let mut reference = Reference::new(&model, first);
    let (input, _) = reference.step(&TOKENS[..7], 0);
    let mut x = input.clone();
    span.span_forward(&mut x, 7, 0).expect("prefill");

    // Position 9 would leave 7 and 8 empty.
    let n_embd = model.cfg.n_embd;
    let mut probe = input[..2 * n_embd].to_vec();
    let before = probe.clone();
    assert!(span.span_forward(&mut probe, 2, 9).is_err());
    assert_eq!(probe, before, "x untouched by a refused forward");
    assert_eq!(span.span_kv_len(), 7);

    // Dropping positions 4.. and evaluating tokens 4..7 again reproduces them.
    span.span_kv_truncate(4);
    assert_eq!(span.span_kv_len(), 4);
    let tail = input[4 * n_embd..].to_vec();
    let mut again = tail.clone();
    span.span_forward(&mut again, 3, 4).expect("re-forward");
    span.span_kv_truncate(4);
    let mut third = tail;
    span.span_forward(&mut third, 3, 4).expect("re-forward");
    assert_eq!(again, third, "the same positions give the same output");
    let err = relative_error(&again, &x[4 * n_embd..]);
    assert!(err < 1e-4, "re-forward vs prefill rows: {err}");
    span.span_end();
    assert_eq!(span.span_kv_len(), 0);
    assert_eq!(gpu.gpu().validation_messages(), 0);
}

#[test]
fn the_kv_grows_on_demand_within_the_context() {
    let Some(gpu) = backend() else { return };
    let (model, first) = placed(&gpu, "SmolLM2-135M-Instruct.Q4_1.gguf", 2);
    let reserved = begin_span(&gpu, &model, first);
    let span = gpu.as_span().unwrap();
    span.span_kv_reserve(N_CTX)
        .expect("reserve the whole context");
    assert!(span.span_kv_reserve(N_CTX + 1).is_err(), "never past n_ctx");
    let mut x = vec![0.5f32; model.cfg.n_embd];
    span.span_forward(&mut x, 1, 0).expect("forward");
    assert!(x.iter().all(|v| v.is_finite()));
    assert!(gpu.describe().contains("span 2 layers, KV"));
    span.span_end();
    assert!(reserved > 0);
    assert_eq!(gpu.gpu().validation_messages(), 0);
}

#[test]
fn span_end_and_unload_free_all_device_memory() {
    let Some(gpu) = backend() else { return };
    let (resident0, allocs0, mark) = (
        gpu.bytes_resident(),
        gpu.gpu().allocation_count(),
        memory_mark(&gpu),
    );
    let (model, first) = placed(&gpu, "SmolLM2-135M-Instruct.Q4_1.gguf", 3);
    begin_span(&gpu, &model, first);
    let span = gpu.as_span().unwrap();
    let mut x = vec![0.25f32; 9 * model.cfg.n_embd];
    span.span_forward(&mut x, 9, 0).expect("forward");
    span.span_end();
    drop(model);
    assert_eq!(gpu.bytes_resident(), resident0);
    assert_eq!(gpu.gpu().allocation_count(), allocs0);
    assert_memory_returned(&gpu, &mark, "after span_end and unload");
    assert_eq!(gpu.gpu().validation_messages(), 0);
}

#[test]
fn span_logits_match_the_output_of_the_reference_rows() {
    let Some(gpu) = backend() else { return };
    let (model, first) = placed(&gpu, "SmolLM2-135M-Instruct.Q4_1.gguf", 3);
    begin_span(&gpu, &model, first);
    let span = gpu.as_span().expect("spans");
    assert!(span.span_max_logit_rows() >= 3, "the span runs the output");
    let n_embd = model.cfg.n_embd;
    let mut reference = Reference::new(&model, first);

    // A prefill returning the logits of its last three tokens.
    let (input, want_x) = reference.step(&TOKENS[..7], 0);
    let logits = span
        .span_forward_logits(&input, 7, 0, 3)
        .expect("prefill logits");
    let want = output_rows(&model, &want_x[4 * n_embd..]).expect("reference output");
    assert_eq!(logits.len(), want.len());
    let prefill_err = relative_error(&logits, &want);

    // A decode step returning one row.
    let (input, want_x) = reference.step(&TOKENS[7..8], 7);
    let logits = span
        .span_forward_logits(&input, 1, 7, 1)
        .expect("decode logits");
    let want = output_rows(&model, &want_x).expect("reference output");
    let decode_err = relative_error(&logits, &want);
    eprintln!(
        "span output vs reference output: prefill {:.4}%, decode {:.4}% of max |logit|",
        prefill_err * 100.0,
        decode_err * 100.0
    );
    assert!(prefill_err < 0.02 && decode_err < 0.02);

    // More rows than tokens is refused without touching the device KV.
    assert!(span.span_forward_logits(&input, 1, 8, 2).is_err());
    assert_eq!(span.span_kv_len(), 8);
    span.span_end();
    assert_eq!(gpu.gpu().validation_messages(), 0);
}

/// Decode steps reuse their recorded command buffer; when the device KV
/// grows (past its first 256 positions) the recordings must be dropped with
/// the old buffers. Steps across that boundary against the reference.
#[test]
fn recorded_decode_steps_survive_kv_growth() {
    let Some(gpu) = backend() else { return };
    let (model, first) = placed(&gpu, "SmolLM2-135M-Instruct.Q4_1.gguf", 2);
    let n_ctx = 300;
    let spec = model.span_spec(first, n_ctx).expect("placed");
    let span = gpu.as_span().expect("spans");
    span.span_begin(&spec).expect("span_begin");
    let tokens: Vec<u32> = (0..262).map(|i| TOKENS[i % TOKENS.len()]).collect();
    let mut reference = Reference::with_context(&model, first, n_ctx);
    let n_prefill = 250;
    let (input, want) = reference.step(&tokens[..n_prefill], 0);
    let mut x = input;
    span.span_forward(&mut x, n_prefill, 0).expect("prefill");
    let mut worst = relative_error(&x, &want);
    for pos in n_prefill..tokens.len() {
        let (input, want) = reference.step(&tokens[pos..pos + 1], pos);
        let mut x = input;
        span.span_forward(&mut x, 1, pos).expect("decode");
        worst = worst.max(relative_error(&x, &want));
    }
    eprintln!(
        "decode across KV growth: max |dx| {:.4}% of max |x|",
        worst * 100.0
    );
    assert!(worst < 0.01, "max |dx| {:.3}%", worst * 100.0);
    assert_eq!(span.span_kv_len(), tokens.len());
    span.span_end();
    assert_eq!(gpu.gpu().validation_messages(), 0);
}

/// Placement holds the span's memory before any layer: the hold is an upper
/// bound of what the span then allocates, and releasing it gives every byte
/// back.
#[test]
fn the_span_hold_covers_the_span_and_is_handed_back() {
    let Some(gpu) = backend() else { return };
    let (model, first) = placed(&gpu, "SmolLM2-135M-Instruct.Q4_1.gguf", 4);
    let span = gpu.as_span().expect("spans");
    span.span_end();
    let (allocs0, free0) = (gpu.gpu().allocation_count(), gpu.memory_free());
    let held = span.span_hold(&model.cfg, 4, N_CTX, true).expect("hold");
    assert!(held > 0);
    assert!(
        free0 - gpu.memory_free() >= held,
        "the hold takes its bytes from the budget"
    );
    span.span_release_hold();
    assert_eq!(gpu.gpu().allocation_count(), allocs0);
    assert_eq!(gpu.memory_free(), free0);
    let used = begin_span(&gpu, &model, first);
    assert!(
        used <= held,
        "the span allocated {used} bytes, more than the {held} held for it"
    );
    span.span_end();
    assert_eq!(gpu.gpu().validation_messages(), 0);
}
