//! The multi-chunk prompt of tests/span_chunks.rs and tests/span_prefill_f16.rs:
//! its text, its logits per row, and the check of chunked rows against the
//! same span fed one token per forward.
#![allow(dead_code)]

use crate::common::{compare, float_backend};
use fish_core::model::{LogitsFor, Model, PlacementLimits};
use fish_core::session::Session;
use fish_core::tokenizer::{EncodeOptions, Tokenizer};

pub const TEXT: &str = "The river starts high in the mountains, where snow melts each spring \
and feeds a chain of small lakes. From there it runs west through pine forests, past old \
mills and wooden bridges, until it reaches the plain. Farmers along its banks grow wheat, \
barley and sunflowers, and every village keeps a record of the floods. In the town at the \
river's mouth, fishing boats leave before dawn and come back at noon with their nets full. \
Visitors come in summer for the beaches and in autumn for the markets, where the harvest \
is sold by the same families who have worked the land for generations. The museum by the \
harbour tells the story of the river, from the first settlers to the railway.";

pub fn prompt_logits(model: &Model, prompt: &[u32]) -> Vec<Vec<f32>> {
    let mut s = Session::new(model, 256, 2).expect("session");
    let all = s.eval(prompt, LogitsFor::All).expect("prompt");
    let vocab = all.len() / prompt.len();
    all.chunks_exact(vocab).map(<[f32]>::to_vec).collect()
}

/// Checks the chunked prompt's logits against the same span stepping one
/// token per forward (same argmax on every row, the seeds' 2% bound) and
/// returns the chunked logits.
pub fn chunked_vs_stepped(model: &Model, prompt: &[u32]) -> Vec<Vec<f32>> {
    let chunked = prompt_logits(model, prompt);
    // Every row of the stepped run comes from a single-token chunk reading
    // the KV of earlier submits.
    let mut session = Session::new(model, 256, 2).expect("session");
    let stepped: Vec<Vec<f32>> = prompt
        .iter()
        .map(|&t| session.eval(&[t], LogitsFor::Last).expect("step"))
        .collect();
    assert!(!model.gpu.as_ref().unwrap().has_failed());
    let rows = prompt.len();
    let (same, worst) = compare(&chunked, &stepped);
    eprintln!(
        "{rows} prompt rows in chunks of 64 vs one token per forward: argmax {same}/{rows}, max |dlogit| {:.3}% of max |logit|",
        worst * 100.0
    );
    assert_eq!(same, rows, "chunked and stepped spans pick other tokens");
    assert!(worst <= 0.02, "chunked vs stepped {:.3}%", worst * 100.0);
    chunked
}

/// Asserts that most prompt rows of `logits` share the CPU's argmax (at
/// least 90%): against the CPU (int8 activations; docs/GPU.md, "Where the
/// GPU and the CPU differ": on an f32 copy of the weights both agree to 1e-5
/// in perplexity) the flat distributions of prompt rows leave near-ties. A
/// chunk that missed the KV of the chunks before it, or garbage products,
/// would lose most rows.
pub fn assert_mostly_cpu_argmax(logits: &[Vec<f32>], cpu_logits: &[Vec<f32>], what: &str) {
    let rows = logits.len();
    let (same, worst) = compare(logits, cpu_logits);
    eprintln!(
        "{what} vs CPU: argmax {same}/{rows}, max |dlogit| {:.3}%",
        worst * 100.0
    );
    assert!(same * 10 >= rows * 9, "{what}: argmax vs CPU {same}/{rows}");
}

pub fn setup() -> Option<std::sync::Arc<fish_span::VulkanBackend>> {
    std::env::set_var("FISH_GPU_SPAN_CHUNK", "64");
    // Float steps, so that chunked and stepped rows differ only by the
    // chunking (H200 with int8 steps: 134/140 argmax, 4.6%, either prefill
    // attention kernel; float steps 140/140, 0.32%).
    float_backend()
}

pub fn prompt_of(model: &Model) -> Vec<u32> {
    let tok = Tokenizer::from_gguf(&model.gguf).expect("tokenizer");
    tok.encode(TEXT, EncodeOptions::PROMPT)
}

pub fn on_gpu(gpu: &std::sync::Arc<fish_span::VulkanBackend>, mut model: Model) -> Model {
    model.place_on(gpu.clone(), PlacementLimits { max_layers: None });
    let describe = model.gpu_describe().unwrap();
    assert!(describe.contains("span"), "{describe}");
    model
}
