//! The generation loop: prompt, then sample until an end-of-generation token,
//! the token limit or the end of the context.

use std::time::{Duration, Instant};

use crate::error::Result;
use crate::model::LogitsFor;
use crate::sampling::{Sampler, SamplerConfig};
use crate::session::Session;

#[derive(Clone, Debug)]
pub struct GenerateOptions {
    /// Maximum tokens to generate.
    pub n_predict: usize,
    pub sampler: SamplerConfig,
}

/// What the token callback wants next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    Continue,
    Stop,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    EndOfGeneration,
    TokenLimit,
    ContextFull,
    Caller,
}

#[derive(Clone, Debug)]
pub struct GenerationStats {
    pub n_prompt: usize,
    /// Prompt tokens actually evaluated (the rest came from the cache).
    pub n_prompt_evaluated: usize,
    pub prompt_time: Duration,
    pub n_generated: usize,
    pub gen_time: Duration,
    pub stop: StopReason,
}

impl GenerationStats {
    pub fn prompt_tok_per_s(&self) -> f64 {
        per_second(self.n_prompt_evaluated, self.prompt_time)
    }

    /// Decode speed: generated tokens after the first over the time they took
    /// (the first token comes from the prompt's logits).
    pub fn gen_tok_per_s(&self) -> f64 {
        per_second(self.n_generated.saturating_sub(1), self.gen_time)
    }
}

fn per_second(n: usize, t: Duration) -> f64 {
    if t.is_zero() {
        0.0
    } else {
        n as f64 / t.as_secs_f64()
    }
}

/// Generates from `prompt`. `on_token` sees each generated token (EOG tokens
/// are not passed on) and may stop the loop.
pub fn generate(
    session: &mut Session<'_>,
    prompt: &[u32],
    opts: &GenerateOptions,
    is_eog: impl Fn(u32) -> bool,
    mut on_token: impl FnMut(u32) -> Flow,
) -> Result<GenerationStats> {
    let mut sampler = Sampler::new(opts.sampler.clone());
    prompt.iter().for_each(|&t| sampler.accept(t));
    let reused = session
        .tokens()
        .iter()
        .zip(prompt)
        .take_while(|(a, b)| a == b)
        .count()
        .min(prompt.len().saturating_sub(1));
    let t0 = Instant::now();
    let mut logits = session.set_prompt(prompt)?;
    let prompt_time = t0.elapsed();
    let n_prompt_evaluated = prompt.len() - reused;

    let t1 = Instant::now();
    let mut n_generated = 0;
    let stop = loop {
        if n_generated >= opts.n_predict {
            break StopReason::TokenLimit;
        }
        let tok = sampler.sample(&logits);
        if is_eog(tok) {
            break StopReason::EndOfGeneration;
        }
        n_generated += 1;
        sampler.accept(tok);
        if on_token(tok) == Flow::Stop {
            break StopReason::Caller;
        }
        if n_generated >= opts.n_predict {
            break StopReason::TokenLimit;
        }
        if session.n_past() >= session.n_ctx() {
            break StopReason::ContextFull;
        }
        logits = session.eval(&[tok], LogitsFor::Last)?;
    };
    Ok(GenerationStats {
        n_prompt: prompt.len(),
        n_prompt_evaluated,
        prompt_time,
        n_generated,
        gen_time: t1.elapsed(),
        stop,
    })
}
