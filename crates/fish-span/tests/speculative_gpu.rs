//! Speculative and batched decoding with the target on the GPU (lavapipe in
//! CI). The target's trailing layers run as a stage-2 span: a verification
//! round evaluates the drafts in one `span_forward`, and rejected positions
//! leave the device KV through `span_kv_truncate`. Greedy speculative output
//! (fixed and adaptive draft lengths) must equal plain greedy decoding of the
//! same placement; batched decode must equal single runs on its placement.

mod common;

use std::sync::{Arc, Mutex, MutexGuard};

use common::{assert_round_equals_one_by_one, backend, default_model, requantised_copy};
use fish_core::backend::{BackendError, ComputeBackend, SpanBackend, SpanSpec};
use fish_core::batch::BatchSession;
use fish_core::generate::{generate, Flow, GenerateOptions};
use fish_core::model::{LogitsFor, Model, PlacementLimits};
use fish_core::sampling::{argmax, SamplerConfig};
use fish_core::session::Session;
use fish_core::spec_controller::DraftLength;
use fish_core::speculative::{generate_speculative, SpeculativeOptions, SpeculativeStats};
use fish_core::tokenizer::{EncodeOptions, Tokenizer};
use fish_gguf::GgmlType;
use fish_span::VulkanBackend;

/// Trailing layers on the device: enough for a real span, few enough for lavapipe.
const GPU_LAYERS: usize = 4;
const N_GEN: usize = 24;
const N_CTX: usize = 128;
const PROSE: &str = "The old lighthouse keeper climbed the stairs every evening, and";
const JSON: &str =
    "Here is the user record as JSON: {\"name\": \"Ada\", \"age\": 36, \"languages\": [";

/// The tests share the 2-core machine's one lavapipe device and set
/// FISH_GPU_SPAN (read at placement), so they run one at a time.
fn device_lock() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// One call the engine made to the span, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SpanCall {
    Forward {
        pos0: usize,
        n_tok: usize,
    },
    /// `span_kv_truncate(to)` while the device KV held `held` positions.
    Truncate {
        held: usize,
        to: usize,
    },
}

/// The Vulkan backend, with every span call logged.
struct Recording {
    inner: Arc<VulkanBackend>,
    log: Mutex<Vec<SpanCall>>,
}

impl Recording {
    /// Matmuls are not recorded.
    fn before_matmul(&self) -> Result<(), BackendError> {
        Ok(())
    }

    fn new(inner: Arc<VulkanBackend>) -> Recording {
        Recording {
            inner,
            log: Mutex::default(),
        }
    }

    fn take_log(&self) -> Vec<SpanCall> {
        std::mem::take(&mut *self.log())
    }

    fn log(&self) -> MutexGuard<'_, Vec<SpanCall>> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }
}

forwarding_backend!(Recording, span);

impl SpanBackend for Recording {
    fn span_begin(&self, spec: &SpanSpec<'_>) -> Result<u64, BackendError> {
        self.inner.span_begin(spec)
    }
    fn span_kv_reserve(&self, n_pos: usize) -> Result<(), BackendError> {
        self.inner.span_kv_reserve(n_pos)
    }
    fn span_kv_len(&self) -> usize {
        self.inner.span_kv_len()
    }
    fn span_kv_truncate(&self, n: usize) {
        let held = self.inner.span_kv_len();
        self.log().push(SpanCall::Truncate { held, to: n });
        self.inner.span_kv_truncate(n)
    }
    fn span_forward(&self, x: &mut [f32], n_tok: usize, pos0: usize) -> Result<(), BackendError> {
        self.log().push(SpanCall::Forward { pos0, n_tok });
        self.inner.span_forward(x, n_tok, pos0)
    }
    fn span_end(&self) {
        self.inner.span_end()
    }
    fn span_profile(&self) -> Option<String> {
        self.inner.span_profile()
    }
}

/// SmolLM2 with its last [`GPU_LAYERS`] layers placed on `gpu`, spans on or off.
fn placed(gpu: Arc<dyn ComputeBackend>, spans: &str) -> Model {
    std::env::set_var("FISH_GPU_SPAN", spans);
    // Decode steps run RoPE inside attention (the default), verification
    // the RoPE kernel: the identity with plain greedy decoding needs both
    // to give the same bits.
    let mut model = Model::load(default_model()).expect("load");
    model.place_on(
        gpu,
        PlacementLimits {
            max_layers: Some(GPU_LAYERS),
        },
    );
    let placement = model.gpu.as_ref().expect("placement");
    assert_eq!(placement.n_layers_placed(), GPU_LAYERS);
    assert_eq!(
        placement.span().is_some(),
        spans == "1",
        "{:?}",
        model.gpu_describe()
    );
    model
}

fn plain_greedy(model: &Model, prompt: &[u32], tok: &Tokenizer) -> Vec<u32> {
    let mut session = Session::new(model, N_CTX, 2).expect("session");
    let opts = GenerateOptions {
        n_predict: N_GEN,
        sampler: SamplerConfig::greedy(),
    };
    let mut out = Vec::new();
    generate(
        &mut session,
        prompt,
        &opts,
        |t| tok.is_eog(t),
        |t| {
            out.push(t);
            Flow::Continue
        },
    )
    .expect("generate");
    out
}

fn speculative_greedy(
    target: &Model,
    draft: &Model,
    prompt: &[u32],
    policy: DraftLength,
    tok: &Tokenizer,
) -> (Vec<u32>, SpeculativeStats) {
    let mut ts = Session::new(target, N_CTX, 2).expect("target session");
    let mut ds = Session::new(draft, N_CTX, 2).expect("draft session");
    let opts = SpeculativeOptions {
        n_predict: N_GEN,
        sampler: SamplerConfig::greedy(),
        draft: policy,
    };
    let mut out = Vec::new();
    let stats = generate_speculative(
        &mut ts,
        &mut ds,
        prompt,
        &opts,
        |t| tok.is_eog(t),
        |t| {
            out.push(t);
            Flow::Continue
        },
    )
    .expect("speculative generation");
    (out, stats)
}

fn policies() -> [DraftLength; 2] {
    [
        DraftLength::Fixed(3),
        DraftLength::Adaptive {
            n_min: 1,
            n_max: 16,
        },
    ]
}

/// Checks the span calls of one speculative run and returns how many
/// rejected positions left the device KV through `span_kv_truncate`.
///
/// Expected: the prompt once at position 0, then one forward per round,
/// each starting right after the previous round's kept tokens (never a
/// replay of the history, which would hide a device KV that failed to
/// follow the rollback); when a round kept fewer tokens than it evaluated,
/// the device KV is cut back to the kept length before the next round.
fn rolled_back_positions(log: &[SpanCall], prompt_len: usize, stats: &SpeculativeStats) -> usize {
    let forwards: Vec<(usize, usize)> = log
        .iter()
        .filter_map(|c| match *c {
            SpanCall::Forward { pos0, n_tok } => Some((pos0, n_tok)),
            SpanCall::Truncate { .. } => None,
        })
        .collect();
    assert_eq!(forwards.first(), Some(&(0, prompt_len)), "{log:?}");
    let rounds = &forwards[1..];
    assert_eq!(
        rounds.len(),
        stats.n_rounds,
        "one span forward per round: {log:?}"
    );
    let drafted: usize = rounds.iter().map(|&(_, n)| n - 1).sum();
    assert_eq!(
        drafted, stats.n_drafted,
        "drafts verified on the device: {log:?}"
    );
    assert!(
        rounds.iter().any(|&(_, n)| n > 1),
        "no multi-token verification: {log:?}"
    );

    let (mut rolled_back, mut accepted_before_last) = (0, 0);
    for pair in rounds.windows(2) {
        let ((pos0, n_tok), (next, _)) = (pair[0], pair[1]);
        assert!(
            pos0 < next && next <= pos0 + n_tok,
            "round at {next} after {n_tok} tokens at {pos0}: {log:?}"
        );
        accepted_before_last += next - pos0 - 1;
        if next < pos0 + n_tok {
            let cut = SpanCall::Truncate {
                held: pos0 + n_tok,
                to: next,
            };
            assert!(log.contains(&cut), "no {cut:?}: {log:?}");
            rolled_back += pos0 + n_tok - next;
        }
    }
    // The last round's verdict needs no device rollback (nothing follows),
    // but it must account for the remaining accepted drafts.
    let (_, last_n) = rounds[rounds.len() - 1];
    let accepted_last = stats.n_accepted.checked_sub(accepted_before_last);
    assert!(
        accepted_last.is_some_and(|a| a < last_n),
        "{stats:?} vs {log:?}"
    );
    rolled_back
}

#[test]
fn speculative_on_a_span_equals_plain_greedy() {
    let _device = device_lock();
    let Some(gpu) = backend() else { return };
    let resident0 = gpu.bytes_resident();
    let recording = Arc::new(Recording::new(gpu.clone()));
    let target = placed(recording.clone(), "1");
    let cpu = Model::load(default_model()).expect("load");
    let tok = Tokenizer::from_gguf(&target.gguf).expect("tokenizer");
    let prompt = tok.encode(JSON, EncodeOptions::PROMPT);

    let want = plain_greedy(&target, &prompt, &tok);
    assert_eq!(want.len(), N_GEN);
    // The span keeps f16 keys and values, the CPU f32, so the two could part
    // ways at a near tie; on this prompt they agree (on PROSE they part after
    // 15 tokens), which makes the CPU copy a draft the span accepts in full.
    assert_eq!(
        want,
        plain_greedy(&cpu, &prompt, &tok),
        "span vs CPU greedy"
    );

    // Greedy identity rests on a verification round's rows being the logits
    // of one-token decode. The span keeps them bit for bit up to the matvec
    // kernel's batch limit (larger rounds run the tiled kernel; SmolLM2's
    // rows then differ by ~2e-4 on lavapipe).
    let exact = fish_vk::MATVEC_MAX_TOKENS;
    assert_round_equals_one_by_one(&target, &prompt, &want[..exact], N_CTX);
    recording.take_log();

    for policy in policies() {
        let (got, stats) = speculative_greedy(&target, &cpu, &prompt, policy, &tok);
        assert_eq!(got, want, "CPU draft, {policy:?}");
        assert_eq!(stats.n_accepted, stats.n_drafted, "{policy:?}: {stats:?}");
        let rolled_back = rolled_back_positions(&recording.take_log(), prompt.len(), &stats);
        assert_eq!(
            rolled_back, 0,
            "{policy:?}: nothing rejected, nothing to cut"
        );
    }

    // A re-quantised draft disagrees now and then: the rejected positions
    // must leave the device KV, and the output stay the same.
    // Every Q4_1 matrix re-quantised to Q4_0: close enough to draft well,
    // different enough that some drafts are rejected.
    let requant_path = requantised_copy(&default_model(), "spec-draft", |_, ty| match ty {
        GgmlType::Q4_1 => GgmlType::Q4_0,
        ty => ty,
    });
    let requant = Model::load(&requant_path).expect("load draft");
    let _ = std::fs::remove_file(&requant_path);
    for policy in policies() {
        let (got, stats) = speculative_greedy(&target, &requant, &prompt, policy, &tok);
        assert_eq!(got, want, "Q4_0 draft, {policy:?}");
        let rolled_back = rolled_back_positions(&recording.take_log(), prompt.len(), &stats);
        eprintln!(
            "Q4_0 draft, {policy:?}: accepted {}/{} in {} rounds, \
             {rolled_back} device positions rolled back",
            stats.n_accepted, stats.n_drafted, stats.n_rounds
        );
        assert!(stats.n_accepted < stats.n_drafted, "{policy:?}: {stats:?}");
        assert!(
            rolled_back > 0,
            "{policy:?}: no rejection reached the device KV"
        );
    }

    assert!(!target.gpu.as_ref().is_some_and(|p| p.has_failed()));
    drop(target);
    assert_eq!(
        gpu.bytes_resident(),
        resident0,
        "all weights freed on unload"
    );
    assert_eq!(gpu.gpu().validation_messages(), 0);
}

#[test]
fn batched_decode_on_a_gpu_placement_equals_single_runs() {
    let _device = device_lock();
    let Some(gpu) = backend() else { return };
    // Spans on: batched decode gives each sequence its own device KV slot
    // and runs every step's span layers in one submit (span_batch.rs tests
    // that path in detail); here its tokens must equal single runs.
    let model = placed(gpu.clone(), "1");
    let tok = Tokenizer::from_gguf(&model.gguf).expect("tokenizer");
    let prompts: Vec<Vec<u32>> = [PROSE, JSON, "Rust is a programming language that"]
        .iter()
        .map(|t| tok.encode(t, EncodeOptions::PROMPT))
        .collect();
    const STEPS: usize = 12;

    let single: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| {
            let mut s = Session::new(&model, N_CTX, 2).expect("session");
            let mut logits = s.set_prompt(p).expect("prompt");
            let mut out = Vec::new();
            for _ in 0..STEPS {
                let t = argmax(&logits);
                out.push(t);
                logits = s.eval(&[t], LogitsFor::Last).expect("decode");
            }
            out
        })
        .collect();

    let mut batch = BatchSession::new(&model, prompts.len(), N_CTX, 2).expect("batch");
    let mut next: Vec<u32> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| argmax(&batch.eval_one(i, p, LogitsFor::Last).expect("prompt")))
        .collect();
    let mut batched = vec![Vec::new(); prompts.len()];
    for step in 0..STEPS {
        for (out, &t) in batched.iter_mut().zip(&next) {
            out.push(t);
        }
        if step + 1 == STEPS {
            break;
        }
        let rows = batch.step_all(&next).expect("batched step");
        next = rows.rows().map(argmax).collect();
    }
    for (i, (b, s)) in batched.iter().zip(&single).enumerate() {
        assert_eq!(b, s, "sequence {i}: batched vs single");
    }
    assert!(!model.gpu.as_ref().is_some_and(|p| p.has_failed()));
    drop(batch);
    drop(model);
    assert_eq!(gpu.gpu().validation_messages(), 0);
}
