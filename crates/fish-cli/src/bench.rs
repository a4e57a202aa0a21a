//! `fish-cli bench`: llama-bench-like prefill (pp) and decode (tg) throughput.

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Result;
use clap::Args;
use fish_core::batch::BatchSession;
use fish_core::model::LogitsFor;
use fish_core::session::Session;
use serde_json::json;

use crate::args::{GpuArgs, ThreadArgs};
use crate::load::{load, load_cpu};

#[derive(Args)]
pub struct BenchArgs {
    /// Path to a GGUF model.
    model: PathBuf,
    /// Prompt tokens for the prefill test (0: skip).
    #[arg(short = 'p', long = "n-prompt", default_value_t = 512)]
    n_prompt: usize,
    /// Generated tokens for the decode test (0: skip).
    #[arg(short = 'n', long = "n-gen", default_value_t = 128)]
    n_gen: usize,
    /// Measured repetitions (one extra warm-up run is discarded).
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    reps: usize,
    /// Also decode B independent sequences together (one forward per step)
    /// and report their aggregate tok/s: B sequences x n tokens / time.
    #[arg(long = "batch")]
    batch: Option<usize>,
    #[command(flatten)]
    threads: ThreadArgs,
    #[command(flatten)]
    gpu: GpuArgs,
    /// Run the same tests again on the CPU only, in the same process, and
    /// report them as `<test> cpu` rows (GPU and CPU figures paired).
    #[arg(long = "pair-cpu")]
    pair_cpu: bool,
    /// Print a JSON list instead of a table.
    #[arg(long)]
    json: bool,
    /// Also print each measured repetition's tok/s on stderr (a mean and
    /// deviation cannot tell one slow repetition from a slow build).
    #[arg(long)]
    each: bool,
}

struct Row {
    test: String,
    mean: f64,
    sd: f64,
}

fn mean_sd(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let var = if xs.len() > 1 {
        xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    (mean, var.sqrt())
}

/// Deterministic token ids spread over the vocabulary (the content does not
/// matter for throughput; determinism makes runs comparable).
fn bench_tokens(n: usize, n_vocab: usize) -> Vec<u32> {
    (0..n)
        .map(|i| ((i as u64 * 2_654_435_761 + 17) % n_vocab as u64) as u32)
        .collect()
}

pub fn run(args: &BenchArgs) -> Result<()> {
    let loaded = load(&args.model, &args.gpu)?;
    let model = &loaded.model;
    // Sessions build their pool with exactly this many threads.
    let n_threads = args.threads.resolve();
    let mut rows = measure(args, model, "")?;
    if args.pair_cpu {
        let cpu = load_cpu(&args.model)?;
        rows.extend(measure(args, &cpu.model, " cpu")?);
    }

    if let Some(gpu) = model.gpu_describe() {
        eprintln!("gpu: {gpu}");
    }
    if let Some(profile) = model.gpu_profile() {
        eprintln!("span profile: {profile}");
    }
    let mut out = std::io::stdout().lock();
    if args.json {
        let v: Vec<_> = rows
            .iter()
            .map(|r| json!({"test": r.test, "tok_per_s": r.mean, "sd": r.sd}))
            .collect();
        writeln!(out, "{}", serde_json::to_string_pretty(&v)?)?;
    } else {
        let name = args
            .model
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        let size = model.gguf.file_len() as f64 / (1u64 << 20) as f64;
        writeln!(out, "| model | size | threads | test | t/s |")?;
        writeln!(out, "| --- | ---: | ---: | ---: | ---: |")?;
        for r in &rows {
            writeln!(
                out,
                "| {name} | {size:.1} MiB | {} | {} | {:.2} ± {:.2} |",
                n_threads, r.test, r.mean, r.sd
            )?;
        }
    }
    Ok(())
}

/// The pp, tg (and batched) rows of one model; `suffix` tags the test names.
fn measure(args: &BenchArgs, model: &fish_core::model::Model, suffix: &str) -> Result<Vec<Row>> {
    let n_ctx = (args.n_prompt.max(args.n_gen)).max(1);
    let mut session = Session::new(model, n_ctx, args.threads.resolve())?;
    let n_vocab = model.cfg.n_vocab;
    let mut rows = Vec::new();

    if args.n_prompt > 0 {
        let toks = bench_tokens(args.n_prompt, n_vocab);
        let test = format!("pp{}{suffix}", args.n_prompt);
        rows.push(rate_row(test, args, args.n_prompt, || {
            session.truncate(0);
            let t0 = Instant::now();
            session.eval(&toks, LogitsFor::Last)?;
            Ok(t0.elapsed())
        })?);
    }
    if args.n_gen > 0 {
        let toks = bench_tokens(args.n_gen, n_vocab);
        let test = format!("tg{}{suffix}", args.n_gen);
        rows.push(rate_row(test, args, args.n_gen, || {
            session.truncate(0);
            let t0 = Instant::now();
            for &t in &toks {
                session.eval(&[t], LogitsFor::Last)?;
            }
            Ok(t0.elapsed())
        })?);
    }
    drop(session);
    if let (Some(b), true) = (args.batch, args.n_gen > 0) {
        let mut row = batched_decode(args, model, b)?;
        row.test.push_str(suffix);
        rows.push(row);
    }
    Ok(rows)
}

/// Aggregate decode speed of `n_seq` sequences stepped together: each step
/// feeds one token to every sequence in one forward (with a GPU span, one
/// submit in which each sequence has its own device KV slot).
fn batched_decode(args: &BenchArgs, model: &fish_core::model::Model, n_seq: usize) -> Result<Row> {
    anyhow::ensure!(n_seq > 0, "--batch must be at least 1");
    let mut batch = BatchSession::new(model, n_seq, args.n_gen, args.threads.resolve())?;
    let toks = bench_tokens(args.n_gen * n_seq, model.cfg.n_vocab);
    let test = format!("tg{} x{n_seq}", args.n_gen);
    let row = rate_row(test, args, args.n_gen * n_seq, || {
        for s in 0..n_seq {
            batch.truncate(s, 0)?;
        }
        let t0 = Instant::now();
        for step in toks.chunks_exact(n_seq) {
            batch.step_all(step)?;
        }
        Ok(t0.elapsed())
    })?;
    // Which path the steps took: a number measured on the host path is not
    // a span number.
    let stats = batch.stats();
    eprintln!(
        "batch x{n_seq}: {} steps through the GPU span, {} on the host{}",
        stats.span_steps,
        stats.host_steps,
        batch
            .span_fallback_reason()
            .map_or_else(String::new, |r| format!(" (left the span: {r})"))
    );
    Ok(row)
}

/// Tokens per second of `args.reps` timed runs after one discarded warm-up
/// run; `run_once` resets its state, then returns the time of the measured
/// work.
fn rate_row(
    test: String,
    args: &BenchArgs,
    n_tokens: usize,
    mut run_once: impl FnMut() -> Result<Duration>,
) -> Result<Row> {
    let mut speeds = Vec::new();
    for rep in 0..=args.reps {
        let elapsed = run_once()?;
        if rep > 0 {
            let speed = n_tokens as f64 / elapsed.as_secs_f64();
            if args.each {
                eprintln!("{test} repetition {rep}: {speed:.2} tok/s");
            }
            speeds.push(speed);
        }
    }
    let (mean, sd) = mean_sd(&speeds);
    Ok(Row { test, mean, sd })
}
