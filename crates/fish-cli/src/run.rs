//! `fish-cli run`: generate text from a prompt (or chat interactively), streaming to stdout.

use std::io::{BufRead, Write};
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use fish_core::chat::{ChatMessage, RenderOptions};
use fish_core::generate::{generate, Flow, GenerateOptions, GenerationStats};
use fish_core::session::Session;
use fish_core::speculative::{
    check_vocab, generate_speculative, SpeculativeOptions, SpeculativeStats,
};
use fish_core::tokenizer::EncodeOptions;
use serde_json::json;

use crate::args::{GpuArgs, SamplingArgs, SpecArgs, ThreadArgs};
use crate::load::{load, Loaded};

#[derive(Args)]
pub struct RunArgs {
    /// Path to a GGUF model.
    model: PathBuf,
    /// The prompt.
    #[arg(short = 'p', long = "prompt", conflicts_with = "file")]
    prompt: Option<String>,
    /// Read the prompt from a file.
    #[arg(short = 'f', long = "file")]
    file: Option<PathBuf>,
    /// Tokens to generate (-1: until end of generation or a full context).
    #[arg(short = 'n', long = "n-predict", default_value_t = -1, allow_negative_numbers = true)]
    n_predict: i64,
    /// Context size in tokens (0: the model's training context).
    #[arg(short = 'c', long = "ctx-size", default_value_t = 4096)]
    ctx_size: usize,
    #[command(flatten)]
    threads: ThreadArgs,
    #[command(flatten)]
    gpu: GpuArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    spec: SpecArgs,
    /// Apply the model's chat template; with no prompt, chat interactively.
    #[arg(long)]
    chat: bool,
    /// Print one JSON object instead of streaming text.
    #[arg(long)]
    json: bool,
}

fn n_ctx(args: &RunArgs, loaded: &Loaded) -> usize {
    if args.ctx_size == 0 {
        loaded.model.cfg.n_ctx_train
    } else {
        args.ctx_size
    }
}

pub fn run(args: &RunArgs) -> Result<()> {
    let prompt = match (&args.prompt, &args.file) {
        (Some(p), _) => Some(p.clone()),
        (None, Some(f)) => {
            Some(std::fs::read_to_string(f).with_context(|| f.display().to_string())?)
        }
        (None, None) => None,
    };
    let loaded = load(&args.model, &args.gpu)?;
    let mut session = Session::new(&loaded.model, n_ctx(args, &loaded), args.threads.resolve())?;
    let draft = load_draft(args, &loaded)?;
    let mut draft_session = match &draft {
        Some(d) => Some(Session::new(
            &d.model,
            n_ctx(args, &loaded),
            args.threads.resolve(),
        )?),
        None => None,
    };
    let draft = draft_session.as_mut();
    match prompt {
        Some(p) => {
            let text = if args.chat {
                render_chat(&loaded, &[ChatMessage::new("user", p)])?
            } else {
                p
            };
            one_shot(args, &loaded, &mut session, draft, &text)
        }
        None if args.chat => interactive(args, &loaded, &mut session, draft),
        None => bail!("no prompt: give -p PROMPT, -f FILE, or --chat for an interactive chat"),
    }
}

fn render_chat(loaded: &Loaded, messages: &[ChatMessage]) -> Result<String> {
    let opts = RenderOptions {
        add_generation_prompt: true,
    };
    Ok(loaded.template.render(messages, opts)?)
}

fn options(args: &RunArgs, session: &Session<'_>, n_prompt: usize) -> GenerateOptions {
    let room = session.n_ctx().saturating_sub(n_prompt);
    let n_predict = if args.n_predict < 0 {
        room
    } else {
        (args.n_predict as usize).min(room)
    };
    GenerateOptions {
        n_predict,
        sampler: args.sampling.config(),
    }
}

fn one_shot(
    args: &RunArgs,
    loaded: &Loaded,
    session: &mut Session<'_>,
    draft: Option<&mut Session<'_>>,
    text: &str,
) -> Result<()> {
    let tok = &loaded.tokenizer;
    let prompt = tok.encode(text, EncodeOptions::PROMPT);
    let opts = options(args, session, prompt.len());
    let mut generated = Vec::new();
    let mut out = std::io::stdout().lock();
    let mut stream = tok.stream();
    let (stats, spec) = generate_with(
        session,
        draft,
        &prompt,
        &opts,
        args,
        |t| tok.is_eog(t),
        &mut |t| {
            generated.push(t);
            if !args.json {
                let piece = stream.push(t).unwrap_or_default();
                if out
                    .write_all(piece.as_bytes())
                    .and_then(|_| out.flush())
                    .is_err()
                {
                    return Flow::Stop;
                }
            }
            Flow::Continue
        },
    )?;
    if args.json {
        let v = json!({
            "prompt_tokens": prompt,
            "tokens": generated,
            "text": tok.decode(&generated)?,
            "timings": {
                "load_ms": loaded.load_time.as_secs_f64() * 1e3,
                "prompt_tok_per_s": stats.prompt_tok_per_s(),
                "gen_tok_per_s": stats.gen_tok_per_s(),
            },
            "gpu": loaded.model.gpu_describe(),
            "speculative": spec.as_ref().map(|s| json!({
                "drafted": s.n_drafted,
                "accepted": s.n_accepted,
                "acceptance_rate": s.acceptance_rate(),
                "mean_draft_len": s.mean_draft_len(),
                "tokens_per_target_forward": s.tokens_per_target_forward(),
            })),
        });
        writeln!(out, "{v}")?;
    } else {
        write!(out, "{}", stream.finish())?;
        writeln!(out)?;
        print_stats(loaded, session, &stats);
        print_spec_stats(spec.as_ref());
    }
    Ok(())
}

fn print_stats(loaded: &Loaded, session: &Session<'_>, s: &GenerationStats) {
    eprintln!(
        "\nload {:.0} ms | prompt {} tokens, {:.1} tok/s | generated {} tokens, {:.1} tok/s | {} threads | stop: {:?}",
        loaded.load_time.as_secs_f64() * 1e3,
        s.n_prompt,
        s.prompt_tok_per_s(),
        s.n_generated,
        s.gen_tok_per_s(),
        session.n_threads(),
        s.stop,
    );
    if let Some(gpu) = loaded.model.gpu_describe() {
        eprintln!("gpu: {gpu}");
    }
    if let Some(profile) = loaded.model.gpu_profile() {
        eprintln!("span profile: {profile}");
    }
}

fn interactive(
    args: &RunArgs,
    loaded: &Loaded,
    session: &mut Session<'_>,
    mut draft: Option<&mut Session<'_>>,
) -> Result<()> {
    let tok = &loaded.tokenizer;
    let mut messages: Vec<ChatMessage> = Vec::new();
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    loop {
        write!(out, "> ")?;
        out.flush()?;
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 {
            writeln!(out)?;
            return Ok(());
        }
        let line = line.trim_end_matches(['\n', '\r']);
        if line.is_empty() {
            continue;
        }
        messages.push(ChatMessage::new("user", line.to_owned()));
        let prompt = tok.encode(&render_chat(loaded, &messages)?, EncodeOptions::PROMPT);
        if prompt.len() >= session.n_ctx() {
            bail!(
                "the conversation ({} tokens) no longer fits the context of {}",
                prompt.len(),
                session.n_ctx()
            );
        }
        let opts = options(args, session, prompt.len());
        let mut reply = Vec::new();
        let mut stream = tok.stream();
        let (stats, spec) = generate_with(
            session,
            draft.as_deref_mut(),
            &prompt,
            &opts,
            args,
            |t| tok.is_eog(t),
            &mut |t| {
                reply.push(t);
                let piece = stream.push(t).unwrap_or_default();
                let _ = out.write_all(piece.as_bytes()).and_then(|_| out.flush());
                Flow::Continue
            },
        )?;
        writeln!(out, "{}", stream.finish())?;
        print_stats(loaded, session, &stats);
        print_spec_stats(spec.as_ref());
        messages.push(ChatMessage::new("assistant", tok.decode(&reply)?));
    }
}

/// Loads the draft model of `--model-draft` and checks that it pairs with the model.
fn load_draft(args: &RunArgs, target: &Loaded) -> Result<Option<Loaded>> {
    let Some(path) = &args.spec.model_draft else {
        return Ok(None);
    };
    let draft = load(path, &args.gpu)?;
    check_vocab(&target.tokenizer, &draft.tokenizer)
        .with_context(|| format!("draft model {}", path.display()))?;
    Ok(Some(draft))
}

/// Plain generation, or speculative generation when a draft session is given.
fn generate_with(
    session: &mut Session<'_>,
    draft: Option<&mut Session<'_>>,
    prompt: &[u32],
    opts: &GenerateOptions,
    args: &RunArgs,
    is_eog: impl Fn(u32) -> bool,
    on_token: &mut dyn FnMut(u32) -> Flow,
) -> Result<(GenerationStats, Option<SpeculativeStats>)> {
    match draft {
        None => Ok((generate(session, prompt, opts, is_eog, on_token)?, None)),
        Some(draft) => {
            let spec_opts = SpeculativeOptions {
                n_predict: opts.n_predict,
                sampler: opts.sampler.clone(),
                draft: args.spec.policy(),
            };
            let s = generate_speculative(session, draft, prompt, &spec_opts, is_eog, on_token)?;
            Ok((s.generation.clone(), Some(s)))
        }
    }
}

fn print_spec_stats(spec: Option<&SpeculativeStats>) {
    if let Some(s) = spec {
        eprintln!(
            "speculative: drafted {}, accepted {} ({:.1}%) | mean draft length {:.2} | {:.2} tokens per target forward",
            s.n_drafted,
            s.n_accepted,
            s.acceptance_rate() * 100.0,
            s.mean_draft_len(),
            s.tokens_per_target_forward(),
        );
    }
}
