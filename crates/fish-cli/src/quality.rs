//! `fish-cli quality`: how closely the GPU placement (with any
//! re-quantisation) follows the CPU. A greedy CPU run of N tokens is the
//! reference; the GPU placement is then teacher-forced on the same tokens and
//! each step's distribution is compared: top-1 agreement with the reference
//! token and KL(P_cpu || P_gpu).

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;
use fish_core::model::LogitsFor;
use fish_core::sampling::argmax;
use fish_core::session::Session;
use fish_core::tokenizer::EncodeOptions;
use serde_json::json;

use crate::args::{GpuArgs, ThreadArgs};
use crate::divergence::{kl_divergence, log_softmax};
use crate::load::{attach_gpu, load_cpu};

#[derive(Args)]
pub struct QualityArgs {
    /// Path to a GGUF model.
    model: PathBuf,
    /// Greedy tokens in the reference run (steps compared).
    #[arg(short = 'n', long = "n-predict", default_value_t = 64)]
    n_predict: usize,
    /// The prompt the reference run continues.
    #[arg(
        short = 'p',
        long = "prompt",
        default_value = "Write a Python function that returns the n-th Fibonacci number, \
                         then explain how it works."
    )]
    prompt: String,
    /// The least top-1 agreement that passes (exit status 1 below it).
    #[arg(long = "min-top1", default_value_t = 0.95)]
    min_top1: f64,
    #[command(flatten)]
    threads: ThreadArgs,
    #[command(flatten)]
    gpu: GpuArgs,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// The comparison over all steps.
struct Agreement {
    steps: usize,
    top1_same: usize,
    mean_kl: f64,
    max_kl: f64,
}

impl Agreement {
    fn top1(&self) -> f64 {
        self.top1_same as f64 / self.steps.max(1) as f64
    }
}

/// The reference: `n` greedy tokens after the prompt and the CPU logits
/// that chose each of them.
fn cpu_reference(
    session: &mut Session<'_>,
    prompt: &[u32],
    n: usize,
) -> Result<(Vec<u32>, Vec<Vec<f32>>)> {
    let mut logits = session.set_prompt(prompt)?;
    let (mut tokens, mut all) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n {
        let t = argmax(&logits);
        tokens.push(t);
        all.push(std::mem::take(&mut logits));
        if i + 1 < n {
            logits = session.eval(&[t], LogitsFor::Last)?;
        }
    }
    Ok((tokens, all))
}

/// Teacher-forces `session` on the reference tokens and compares each step.
fn compare(
    session: &mut Session<'_>,
    prompt: &[u32],
    tokens: &[u32],
    reference: &[Vec<f32>],
) -> Result<Agreement> {
    let mut logits = session.set_prompt(prompt)?;
    let mut agreement = Agreement {
        steps: tokens.len(),
        top1_same: 0,
        mean_kl: 0.0,
        max_kl: 0.0,
    };
    let mut kl_sum = 0.0;
    for (i, (&t, cpu)) in tokens.iter().zip(reference).enumerate() {
        agreement.top1_same += usize::from(argmax(&logits) == t);
        let kl = kl_divergence(&log_softmax(cpu), &log_softmax(&logits));
        kl_sum += kl;
        agreement.max_kl = agreement.max_kl.max(kl);
        if i + 1 < tokens.len() {
            logits = session.eval(&[t], LogitsFor::Last)?;
        }
    }
    agreement.mean_kl = kl_sum / tokens.len().max(1) as f64;
    Ok(agreement)
}

pub fn run(args: &QualityArgs) -> Result<()> {
    if args.n_predict == 0 {
        bail!("-n must be at least 1");
    }
    let mut loaded = load_cpu(&args.model)?;
    let prompt = loaded.tokenizer.encode(&args.prompt, EncodeOptions::PROMPT);
    if prompt.is_empty() {
        bail!("the prompt is empty");
    }
    let n_ctx = prompt.len() + args.n_predict;
    let threads = args.threads.resolve();
    let (tokens, reference) = {
        let mut session = Session::new(&loaded.model, n_ctx, threads)?;
        cpu_reference(&mut session, &prompt, args.n_predict)?
    };
    attach_gpu(&mut loaded.model, &args.gpu);
    let on_gpu = loaded
        .model
        .gpu
        .as_ref()
        .is_some_and(|p| p.n_layers_placed() > 0 || p.output.is_some());
    let (true, Some(gpu)) = (on_gpu, loaded.model.gpu_describe()) else {
        bail!("nothing was placed on a GPU to compare (FISH_GPU off, no device, or no room)");
    };
    let agreement = {
        let mut session = Session::new(&loaded.model, n_ctx, threads)?;
        compare(&mut session, &prompt, &tokens, &reference)?
    };
    let top1 = agreement.top1();
    if args.json {
        let v = json!({
            "steps": agreement.steps,
            "top1_same": agreement.top1_same,
            "top1": top1,
            "mean_kl": agreement.mean_kl,
            "max_kl": agreement.max_kl,
            "requant": args.gpu.requant_level(),
            "gpu": gpu,
        });
        println!("{v}");
    } else {
        eprintln!("gpu: {gpu}");
        println!(
            "top-1 agreement {}/{} ({:.1}%), mean KL(P_cpu || P_gpu) {:.5} nats, max {:.4}",
            agreement.top1_same,
            agreement.steps,
            100.0 * top1,
            agreement.mean_kl,
            agreement.max_kl
        );
    }
    if top1 < args.min_top1 {
        bail!(
            "top-1 agreement {:.1}% is below {:.1}%",
            100.0 * top1,
            100.0 * args.min_top1
        );
    }
    Ok(())
}
