//! `fish-cli`: a thin binary that assembles the fish crates behind llama.cpp-style commands.

mod args;
mod bench;
mod divergence;
mod info;
mod load;
mod mix;
mod perplexity;
mod quality;
mod quantize;
mod run;
mod synth;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "fish-cli",
    version,
    about = "Run GGUF language models on the CPU and Vulkan GPUs"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt, or chat.
    Run(run::RunArgs),
    /// Measure prefill and decode throughput.
    Bench(bench::BenchArgs),
    /// Perplexity of a text file.
    Perplexity(perplexity::PerplexityArgs),
    /// Write a llama-shaped model with random weights.
    Synth(synth::SynthArgs),
    /// Print a model's metadata and tensor table.
    Info(info::InfoArgs),
    /// Rewrite a model's weights in another type or mix, like llama-quantize.
    Quantize(quantize::QuantizeArgs),
    /// Compare the GPU placement (and its re-quantisation) with the CPU:
    /// top-1 agreement and KL over a teacher-forced greedy run.
    Quality(quality::QualityArgs),
}

fn main() -> ExitCode {
    // llama.cpp spells the layer count `-ngl N`; clap has no multi-letter
    // short flags, so that spelling is mapped to the long one.
    let args = std::env::args_os().map(|a| {
        if a == "-ngl" {
            "--n-gpu-layers".into()
        } else {
            a
        }
    });
    let cli = Cli::parse_from(args);
    let result = match cli.command {
        Command::Run(args) => run::run(&args),
        Command::Bench(args) => bench::run(&args),
        Command::Perplexity(args) => perplexity::run(&args),
        Command::Synth(args) => synth::run(&args),
        Command::Info(args) => info::run(&args),
        Command::Quantize(args) => quantize::run(&args),
        Command::Quality(args) => quality::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}
