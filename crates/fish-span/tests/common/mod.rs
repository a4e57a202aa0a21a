//! Helpers shared by fish-span's device tests.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;

use fish_core::model::{LogitsFor, Model, PlacementLimits};
use fish_core::sampling::argmax;
use fish_core::session::Session;
use fish_span::VulkanBackend;

/// "The capital of France is"
pub const PROMPT: [u32; 5] = [504, 3575, 282, 4649, 314];
pub const PARIS: u32 = 7042;

/// The tiny Q4_K_M model (`fish-cli synth --shape tiny --type q4_k_m`,
/// named by FISH_TEST_TINY_Q4K; scripts/test.sh makes it), or None (skip)
/// where neither it nor a device is required.
pub fn tiny_model() -> Option<PathBuf> {
    synthesised_model("FISH_TEST_TINY_Q4K")
}

/// The tiny model of 2048-value rows (`fish-cli synth --shape tiny-wide
/// --type q4_k_m`, named by FISH_TEST_TINY_WIDE_Q4K; scripts/test.sh makes
/// it), or None as for `tiny_model`.
pub fn tiny_wide_model() -> Option<PathBuf> {
    synthesised_model("FISH_TEST_TINY_WIDE_Q4K")
}

/// A prompt, then one forced token per step, all inside the synthesised
/// models' 512-token vocabulary: the logits of the prompt's last token and
/// of each of `steps` decode steps.
pub fn tiny_vocab_decode(model: &Model, steps: u32) -> Vec<Vec<f32>> {
    let prompt: Vec<u32> = (0..6).map(|i| 3 + i * 61 % 500).collect();
    let mut s = Session::new(model, 64, 2).expect("session");
    let mut out = vec![s.set_prompt(&prompt).expect("prompt")];
    for i in 0..steps {
        out.push(
            s.eval(&[5 + i * 37 % 500], LogitsFor::Last)
                .expect("decode"),
        );
    }
    out
}

/// Whether a span model's decode waits gave up (its `gpu:` description
/// says so), after checking that it has a span and has not failed.
pub fn decode_waits_gave_up(model: &Model) -> bool {
    assert!(!model.gpu.as_ref().unwrap().has_failed());
    let described = model.gpu_describe().expect("a GPU model");
    assert!(described.contains("span "), "{described}");
    described.contains("decode waits gave up")
}

/// The model file named by the variable `var`, or None (skip) where neither
/// it nor a device is required.
fn synthesised_model(var: &str) -> Option<PathBuf> {
    match std::env::var(var) {
        Ok(p) if !p.is_empty() => {
            let p = PathBuf::from(p);
            assert!(p.exists(), "{var}={} is missing", p.display());
            Some(p)
        }
        _ if std::env::var("FISH_REQUIRE_GPU").as_deref() == Ok("1") => {
            panic!("{var} is not set (scripts/test.sh makes the file)")
        }
        _ => {
            eprintln!("skipped: {var} is not set");
            None
        }
    }
}

pub fn model_path(file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models")
        .join(file)
}

/// The default model; scripts/test.sh fetches it, so its absence is a failure.
pub fn default_model() -> PathBuf {
    let p = model_path("SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        p.exists(),
        "{} is missing: run scripts/fetch-model.sh",
        p.display()
    );
    p
}

/// `backend()` with float matvecs (the int8 policy Never, as FISH_VK_INT8=0
/// would give), for the tests that hold the span to a float reference (stage-1
/// matmuls, one-token runs, the CPU reference rows) within the seeds' 1-2%.
/// Where the device accelerates int8 products (the H200) int8 steps are
/// the default, and their rounding alone exceeds those bounds against any
/// other path (SmolLM2 on the H200: span vs per-matmul 3.4% of max |logit|,
/// chunked vs stepped prefill rows 4.6%, the hidden state over 5 layers
/// 1.3% of max |x|; stage-1 matmuls vs the CPU 4.4% against 3.3% float);
/// span_int8.rs and stage1.rs hold int8 steps to the CPU with a bound of
/// their own. On lavapipe float is the default anyway.
pub fn float_backend() -> Option<Arc<VulkanBackend>> {
    backend_with_int8(fish_vk::Int8Policy::Never)
}

/// A device whose matvecs take int8 activations as `policy` says (the rest
/// of its settings from the environment).
pub fn backend_with_int8(policy: fish_vk::Int8Policy) -> Option<Arc<VulkanBackend>> {
    let config = fish_vk::Config {
        int8_matvec: policy,
        ..fish_vk::Config::from_env()
    };
    opened(VulkanBackend::open_owned_with(&config))
}

/// `backend_with_int8(WhenSupported)` where the device multiplies Q4_1 (the
/// default model's layers) on int8 activations; None (the test skipped)
/// where it does not, which FISH_REQUIRE_GPU=1 turns into a failure.
pub fn int8_backend_or_skip() -> Option<Arc<VulkanBackend>> {
    let gpu = backend_with_int8(fish_vk::Int8Policy::WhenSupported)?;
    if !gpu.gpu().int8_matvec(fish_gguf::GgmlType::Q4_1) {
        assert!(
            std::env::var("FISH_REQUIRE_GPU").as_deref() != Ok("1"),
            "FISH_REQUIRE_GPU=1 but the device has no packed int8 dot products"
        );
        eprintln!("skipped: no packed int8 dot products");
        return None;
    }
    Some(gpu)
}

/// Whether `gpu` has subgroup arithmetic (the fused decode kernels and the
/// key-split attention need it); false (the test skipped) where it has
/// not, which FISH_REQUIRE_GPU=1 turns into a failure.
pub fn has_subgroup_arithmetic_or_skip(gpu: &Arc<VulkanBackend>) -> bool {
    let has = gpu.gpu().info().subgroup_arithmetic;
    assert!(
        has || std::env::var("FISH_REQUIRE_GPU").as_deref() != Ok("1"),
        "FISH_REQUIRE_GPU=1 but the device has no subgroup arithmetic"
    );
    has
}

/// An int8 path's max |dlogit| against the CPU (`int8_worst`, a fraction of
/// max |logit|) within twice the float path's (`float_worst`, at least 1%):
/// two int8 roundings (GPU and CPU) of slightly different inputs, where the
/// float kernels round only on the CPU.
pub fn assert_int8_within_float_bound(what: &str, int8_worst: f32, float_worst: f32) {
    let bound = 2.0 * float_worst.max(0.01);
    assert!(
        int8_worst <= bound,
        "{what} vs CPU {:.3}% (float {:.3}%)",
        int8_worst * 100.0,
        float_worst * 100.0
    );
}

/// The device memory in use when a test starts: the allocator's live
/// allocations (exact) and the driver's free-memory figure (information).
pub struct MemoryMark {
    in_use: u64,
    free: u64,
}

pub fn memory_mark(gpu: &VulkanBackend) -> MemoryMark {
    use fish_core::backend::ComputeBackend;
    MemoryMark {
        in_use: gpu.gpu().allocator_bytes_in_use(),
        free: gpu.memory_free(),
    }
}

/// Every allocation made since `mark` freed: the allocator's live bytes in
/// the device heap back to their value then. The driver's free-memory
/// figure is only printed: on the H200 it stayed 268-521 MiB lower after an
/// unload with the allocator holding no allocation and no idle block of
/// ours, memory the driver keeps for itself once pipelines have run (on
/// lavapipe it comes back exactly). Leaks of ours also show in
/// `allocation_count` and `bytes_resident`, which the tests compare exactly.
pub fn assert_memory_returned(gpu: &VulkanBackend, mark: &MemoryMark, what: &str) {
    use fish_core::backend::ComputeBackend;
    let in_use = gpu.gpu().allocator_bytes_in_use();
    let free = gpu.memory_free();
    if free != mark.free {
        eprintln!(
            "{what}: the driver reports {free} bytes free, {} before (information)",
            mark.free
        );
    }
    assert!(
        in_use <= mark.in_use,
        "{what}: {in_use} bytes of live allocations, {} before",
        mark.in_use
    );
}

/// A device, or None (skip) — but a failure when FISH_REQUIRE_GPU=1 (CI).
pub fn backend() -> Option<Arc<VulkanBackend>> {
    opened(VulkanBackend::open_owned())
}

/// The opened device, or None (skip) — but a failure when
/// FISH_REQUIRE_GPU=1 (CI).
fn opened(result: Result<VulkanBackend, String>) -> Option<Arc<VulkanBackend>> {
    match result {
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

/// Logits of [`PROMPT`] and of each forced token after it.
pub fn teacher_forced(model: &Model, forced: &[u32]) -> Vec<Vec<f32>> {
    let mut s = Session::new(model, 128, 2).expect("session");
    let mut out = vec![s.set_prompt(&PROMPT).expect("prompt")];
    for &t in forced {
        out.push(s.eval(&[t], LogitsFor::Last).expect("decode"));
    }
    out
}

/// `n` greedy tokens after [`PROMPT`] (the tokens the other runs are forced on).
pub fn greedy_after_prompt(model: &Model, n: usize) -> Vec<u32> {
    let mut s = Session::new(model, 128, 2).expect("session");
    let mut logits = s.set_prompt(&PROMPT).expect("prompt");
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let t = argmax(&logits);
        out.push(t);
        logits = s.eval(&[t], LogitsFor::Last).expect("decode");
    }
    out
}

/// `n` greedy tokens after [`PROMPT`] on the CPU with the default model.
pub fn default_greedy(n: usize) -> Vec<u32> {
    greedy_after_prompt(&Model::load(default_model()).expect("load"), n)
}

/// `f`'s result with the environment variables `vars` set, which are
/// removed afterwards (span choices read them when a span records).
pub fn with_env<T>(vars: &[(&str, &str)], f: impl FnOnce() -> T) -> T {
    for (k, v) in vars {
        std::env::set_var(k, v);
    }
    let out = f();
    for (k, _) in vars {
        std::env::remove_var(k);
    }
    out
}

/// Asserts that `gpu` built a matmul pipeline whose name (module and
/// specialisation constants) `ran` accepts, and that validation stayed
/// silent.
pub fn assert_built(gpu: &VulkanBackend, ran: impl Fn(&str) -> bool, what: &str) {
    let built = gpu.gpu().built_matmul_pipelines();
    assert!(built.iter().any(|p| ran(p)), "{what}: {built:?}");
    assert_eq!(gpu.gpu().validation_messages(), 0);
}

/// How many values of two runs' rows differ in their bits.
pub fn differing_bits(a: &[Vec<f32>], b: &[Vec<f32>]) -> usize {
    a.iter()
        .flatten()
        .zip(b.iter().flatten())
        .filter(|(x, y)| x.to_bits() != y.to_bits())
        .count()
}

/// (steps with the same argmax, worst max |dlogit| / max |logit|)
pub fn compare(a: &[Vec<f32>], b: &[Vec<f32>]) -> (usize, f32) {
    let (mut same, mut worst) = (0, 0f32);
    for (x, y) in a.iter().zip(b) {
        same += usize::from(argmax(x) == argmax(y));
        let max_abs = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = x.iter().zip(y).fold(0f32, |m, (p, q)| m.max((p - q).abs()));
        worst = worst.max(d / max_abs);
    }
    (same, worst)
}

/// The stage names of the middle layer in a FISH_GPU_PROFILE=3 profile, in
/// order (its list ends at the next `;`, where the output's begins).
pub fn middle_layer_stages(profile: &str) -> Vec<String> {
    let at = profile
        .find("middle layer, us: ")
        .expect("level 3 lists a layer");
    let list = &profile[at + "middle layer, us: ".len()..];
    list[..list.find(';').unwrap_or(list.len())]
        .split(", ")
        .map(|stage| stage.rsplit_once(' ').expect("name and time").0.to_string())
        .collect()
}

/// Optional models (scripts/fetch-model.sh): run when present, required when
/// listed in FISH_TEST_MODELS.
pub fn optional_model(key: &str, file: &str) -> bool {
    let listed = std::env::var("FISH_TEST_MODELS").is_ok_and(|v| v.split(' ').any(|m| m == key));
    let present = model_path(file).exists();
    assert!(present || !listed, "{file} is listed but missing");
    if !present {
        eprintln!("skipping: {file} is not fetched");
    }
    present
}

/// Teacher-forced logits (as [`teacher_forced`]) of the default model with
/// every layer and the output in a span on `gpu`, and the model (its span
/// ends when it is dropped).
pub fn span_teacher_forced(gpu: &Arc<VulkanBackend>, forced: &[u32]) -> (Model, Vec<Vec<f32>>) {
    span_teacher_forced_on(gpu, &default_model(), forced)
}

/// [`span_teacher_forced`] for the model at `path`.
pub fn span_teacher_forced_on(
    gpu: &Arc<VulkanBackend>,
    path: &std::path::Path,
    forced: &[u32],
) -> (Model, Vec<Vec<f32>>) {
    let model = span_model_on(gpu, path);
    let logits = teacher_forced(&model, forced);
    assert!(!model.gpu.as_ref().unwrap().has_failed());
    (model, logits)
}

/// The model at `path` with every layer and the output in a span on `gpu`.
pub fn span_model_on(gpu: &Arc<VulkanBackend>, path: &std::path::Path) -> Model {
    let mut model = Model::load(path).expect("load");
    model.place_on(gpu.clone(), PlacementLimits { max_layers: None });
    let describe = model.gpu_describe().unwrap();
    assert!(describe.contains("span"), "{describe}");
    model
}

/// Implements `ComputeBackend` for a test wrapper around the real backend
/// (its `inner` field): every method forwards to it, the two matmuls after
/// the wrapper's `before_matmul()` hook (which may inject a failure), and
/// with `span` `as_span` returns the wrapper itself, which then implements
/// `SpanBackend` as the test needs.
#[macro_export]
macro_rules! forwarding_backend {
    ($ty:ty) => {
        forwarding_backend!(@impl $ty, plain);
    };
    ($ty:ty, span) => {
        forwarding_backend!(@impl $ty, span);
    };
    (@impl $ty:ty, $span:ident) => {
        impl ::fish_core::backend::ComputeBackend for $ty {
            fn status(&self) -> String {
                ::fish_core::backend::ComputeBackend::status(&*self.inner)
            }
            fn describe(&self) -> String {
                ::fish_core::backend::ComputeBackend::describe(&*self.inner)
            }
            fn supports(&self, ty: ::fish_gguf::GgmlType) -> bool {
                ::fish_core::backend::ComputeBackend::supports(&*self.inner, ty)
            }
            fn memory_free(&self) -> u64 {
                ::fish_core::backend::ComputeBackend::memory_free(&*self.inner)
            }
            fn upload(
                &self,
                name: &str,
                w: ::fish_quant::Weights<'_>,
            ) -> Result<::fish_core::backend::TensorId, ::fish_core::backend::BackendError> {
                ::fish_core::backend::ComputeBackend::upload(&*self.inner, name, w)
            }
            fn bytes_resident(&self) -> u64 {
                ::fish_core::backend::ComputeBackend::bytes_resident(&*self.inner)
            }
            fn free(&self, id: ::fish_core::backend::TensorId) {
                ::fish_core::backend::ComputeBackend::free(&*self.inner, id)
            }
            fn matmul(
                &self,
                id: ::fish_core::backend::TensorId,
                x: &[f32],
                n_tok: usize,
            ) -> Result<Vec<f32>, ::fish_core::backend::BackendError> {
                self.before_matmul()?;
                ::fish_core::backend::ComputeBackend::matmul(&*self.inner, id, x, n_tok)
            }
            fn matmul_group(
                &self,
                ids: &[::fish_core::backend::TensorId],
                x: &[f32],
                n_tok: usize,
            ) -> Result<Vec<Vec<f32>>, ::fish_core::backend::BackendError> {
                self.before_matmul()?;
                ::fish_core::backend::ComputeBackend::matmul_group(&*self.inner, ids, x, n_tok)
            }
            fn set_placement_note(&self, note: String) {
                ::fish_core::backend::ComputeBackend::set_placement_note(&*self.inner, note)
            }
            fn exact_batch_tokens(&self) -> usize {
                ::fish_core::backend::ComputeBackend::exact_batch_tokens(&*self.inner)
            }
            forwarding_backend!(@as_span $span);
        }
    };
    (@as_span span) => {
        fn as_span(&self) -> Option<&dyn ::fish_core::backend::SpanBackend> {
            Some(self)
        }
    };
    (@as_span plain) => {};
}

/// Checks that a verification round over `round` after `prompt` (one
/// forward, logits for every row) gives each row the logits of decoding
/// that token alone, bit for bit: speculative greedy decoding rests on it.
pub fn assert_round_equals_one_by_one(model: &Model, prompt: &[u32], round: &[u32], n_ctx: usize) {
    let mut single = Session::new(model, n_ctx, 2).expect("session");
    single.set_prompt(prompt).expect("prompt");
    let ones: Vec<Vec<f32>> = round
        .iter()
        .map(|&t| single.eval(&[t], LogitsFor::Last).expect("decode"))
        .collect();
    drop(single);
    let mut batched = Session::new(model, n_ctx, 2).expect("session");
    batched.set_prompt(prompt).expect("prompt");
    let rows = batched.eval(round, LogitsFor::All).expect("verification");
    let n_vocab = model.cfg.n_vocab;
    for (i, one) in ones.iter().enumerate() {
        let row = &rows[i * n_vocab..][..n_vocab];
        assert!(
            row.iter().zip(one).all(|(a, b)| a.to_bits() == b.to_bits()),
            "row {i} of a {}-token verification differs from one-token decode",
            round.len()
        );
    }
}

/// A copy of the model at `src` in the temporary folder (its name tagged
/// with `tag` and the process id) with each tensor re-quantised to
/// `new_ty(name, type)` where that differs from its type. The caller
/// removes the file.
pub fn requantised_copy(
    src: &std::path::Path,
    tag: &str,
    new_ty: impl Fn(&str, fish_gguf::GgmlType) -> fish_gguf::GgmlType,
) -> PathBuf {
    let g = fish_gguf::Gguf::open(src).expect("open");
    let mut w = fish_gguf::GgufWriter::new();
    for (k, v) in g.metadata() {
        w.kv(k, v.to_owned_value());
    }
    for t in g.tensors() {
        w.tensor(fish_gguf::TensorSpec::new(
            &t.name,
            &t.dims,
            new_ty(&t.name, t.ty),
        ));
    }
    let path = std::env::temp_dir().join(format!("fish-span-{tag}-{}.gguf", std::process::id()));
    let file = std::fs::File::create(&path).expect("create the copy");
    w.write(std::io::BufWriter::new(file), |i, spec, out| {
        let info = &g.tensors()[i];
        let data = g.tensor_data(info);
        if spec.ty == info.ty {
            return out.write_all(data);
        }
        let n = info.row_len() as usize;
        let src_row = data.len() / info.n_rows() as usize;
        let mut vals = vec![0f32; n];
        let mut dst = vec![0u8; fish_quant::row_bytes(spec.ty, n).expect("row bytes")];
        for row in data.chunks_exact(src_row) {
            fish_quant::dequant_row(info.ty, row, &mut vals).expect("dequant");
            fish_quant::quantize_row(spec.ty, &vals, &mut dst).expect("quantize");
            out.write_all(&dst)?;
        }
        Ok(())
    })
    .expect("write the copy");
    path
}
