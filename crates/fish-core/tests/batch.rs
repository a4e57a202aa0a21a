//! Batched decode: B sequences advanced together (one matmul per weight over
//! all B tokens, attention per sequence) give exactly the logits and greedy
//! tokens of B separate runs.

mod common;

use fish_core::batch::{BatchError, BatchSession};
use fish_core::model::{LogitsFor, Model};
use fish_core::sampling::argmax;
use fish_core::session::Session;
use fish_core::tokenizer::{EncodeOptions, Tokenizer};

const N_CTX: usize = 128;
const STEPS: usize = 10;
const PROMPTS: [&str; 4] = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea, there lived",
    "{\"id\": 7,",
];

/// Greedy tokens and every step's logits of one sequence run alone.
fn single_run(model: &Model, prompt: &[u32]) -> (Vec<u32>, Vec<Vec<f32>>) {
    let mut s = Session::new(model, N_CTX, 2).expect("session");
    let mut logits = s.set_prompt(prompt).expect("prompt");
    let (mut toks, mut all) = (Vec::new(), Vec::new());
    for _ in 0..STEPS {
        let t = argmax(&logits);
        toks.push(t);
        logits = s.eval(&[t], LogitsFor::Last).expect("decode");
        all.push(logits.clone());
    }
    (toks, all)
}

#[test]
fn batched_sequences_equal_single_runs() {
    let model = Model::load(common::default_model()).expect("load");
    let tok = Tokenizer::from_gguf(&model.gguf).expect("tokenizer");
    let prompts: Vec<Vec<u32>> = PROMPTS
        .iter()
        .map(|p| tok.encode(p, EncodeOptions::PROMPT))
        .collect();
    // Prompts of different lengths: the rows sit at different positions.
    assert!(prompts.iter().any(|p| p.len() != prompts[0].len()));

    let mut batch = BatchSession::new(&model, prompts.len(), N_CTX, 2).expect("batch");
    let mut logits: Vec<Vec<f32>> = prompts
        .iter()
        .enumerate()
        .map(|(s, p)| batch.eval_one(s, p, LogitsFor::Last).expect("prompt"))
        .collect();
    let mut toks = vec![Vec::new(); prompts.len()];
    let mut step_logits = vec![Vec::new(); prompts.len()];
    for _ in 0..STEPS {
        let next: Vec<u32> = logits.iter().map(|l| argmax(l)).collect();
        for (s, &t) in next.iter().enumerate() {
            toks[s].push(t);
        }
        logits = batch.step_all(&next).expect("step").into_rows();
        for (s, l) in logits.iter().enumerate() {
            step_logits[s].push(l.clone());
        }
    }
    for (s, p) in prompts.iter().enumerate() {
        let (want_toks, want_logits) = single_run(&model, p);
        assert_eq!(toks[s], want_toks, "sequence {s}");
        for (i, (a, b)) in step_logits[s].iter().zip(&want_logits).enumerate() {
            assert!(
                a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
                "sequence {s} step {i}: batched logits differ"
            );
        }
        assert_eq!(batch.n_past(s).expect("seq"), p.len() + STEPS);
    }
}

#[test]
fn a_subset_of_sequences_can_step() {
    let model = Model::load(common::default_model()).expect("load");
    let tok = Tokenizer::from_gguf(&model.gguf).expect("tokenizer");
    let mut batch = BatchSession::new(&model, 3, N_CTX, 2).expect("batch");
    for (s, text) in PROMPTS.iter().take(3).enumerate() {
        let p = tok.encode(text, EncodeOptions::PROMPT);
        batch.eval_one(s, &p, LogitsFor::Last).expect("prompt");
    }
    let before: Vec<usize> = (0..3).map(|s| batch.n_past(s).expect("seq")).collect();
    let rows = batch.step(&[0, 2], &[10, 20]).expect("step");
    assert_eq!(rows.len(), 2);
    assert_eq!(batch.n_past(0).expect("seq"), before[0] + 1);
    assert_eq!(batch.n_past(1).expect("seq"), before[1]);
    assert_eq!(batch.n_past(2).expect("seq"), before[2] + 1);
    assert!(matches!(
        batch.step(&[2, 0], &[1, 1]),
        Err(BatchError::UnorderedSequences)
    ));
    assert!(matches!(
        batch.step(&[5], &[1]),
        Err(BatchError::NoSuchSequence { seq: 5, n_seq: 3 })
    ));
    assert!(matches!(
        batch.step(&[0, 1], &[1]),
        Err(BatchError::TokenCount { .. })
    ));
}
