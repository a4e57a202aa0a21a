//! `fish-cli perplexity`: perplexity of a text file, scored like llama.cpp
//! (chunks of -c tokens, each scored on its second half).

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use fish_core::model::LogitsFor;
use fish_core::session::Session;
use fish_core::tokenizer::EncodeOptions;

use crate::args::{GpuArgs, ThreadArgs};
use crate::load::load;

#[derive(Args)]
pub struct PerplexityArgs {
    /// Path to a GGUF model.
    model: PathBuf,
    /// The text to score.
    #[arg(short = 'f', long = "file")]
    file: PathBuf,
    /// Chunk length in tokens.
    #[arg(short = 'c', long = "ctx-size", default_value_t = 256)]
    ctx_size: usize,
    #[command(flatten)]
    threads: ThreadArgs,
    #[command(flatten)]
    gpu: GpuArgs,
}

/// -log softmax(logits)[target]
fn nll(logits: &[f32], target: u32) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    -(logits[target as usize] as f64 - max - sum.ln())
}

pub fn run(args: &PerplexityArgs) -> Result<()> {
    let text =
        std::fs::read_to_string(&args.file).with_context(|| args.file.display().to_string())?;
    let loaded = load(&args.model, &args.gpu)?;
    let tok = &loaded.tokenizer;
    let tokens = tok.encode(&text, EncodeOptions::PLAIN);
    let n_ctx = args.ctx_size;
    if n_ctx < 8 {
        bail!("--ctx-size must be at least 8");
    }
    let n_chunks = tokens.len() / n_ctx;
    if n_chunks == 0 {
        bail!(
            "the file has {} tokens; need at least {} (one chunk of -c)",
            tokens.len(),
            n_ctx
        );
    }
    let n_vocab = loaded.model.cfg.n_vocab;
    let mut session = Session::new(&loaded.model, n_ctx, args.threads.resolve())?;
    let (mut sum, mut count) = (0f64, 0usize);
    for c in 0..n_chunks {
        let mut chunk = tokens[c * n_ctx..(c + 1) * n_ctx].to_vec();
        if let Some(bos) = tok.bos().filter(|_| tok.adds_bos()) {
            chunk[0] = bos;
        }
        session.truncate(0);
        let logits = session.eval(&chunk, LogitsFor::All)?;
        // Score the second half: those predictions have at least n_ctx/2 tokens of context.
        for i in n_ctx / 2..n_ctx - 1 {
            sum += nll(&logits[i * n_vocab..(i + 1) * n_vocab], chunk[i + 1]);
            count += 1;
        }
        eprint!("[{}]{:.4} ", c + 1, (sum / count as f64).exp());
    }
    eprintln!();
    if let Some(gpu) = loaded.model.gpu_describe() {
        eprintln!("gpu: {gpu}");
    }
    println!("PPL = {:.4}", (sum / count as f64).exp());
    Ok(())
}
