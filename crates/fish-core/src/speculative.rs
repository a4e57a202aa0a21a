//! Speculative decoding: a small draft model proposes several tokens, the
//! target model verifies all of them in one forward pass, and rejected
//! tokens are dropped from both KV caches.
//!
//! Acceptance is standard speculative rejection sampling, so the output
//! follows the target's sampling distribution exactly: a drafted token `d`
//! is kept with probability min(1, p(d) / q(d)) (p: target, q: draft); on a
//! rejection the replacement is drawn from norm(max(0, p - q)). Greedy
//! decoding is the special case where both are one-hot, which makes the
//! output identical to plain greedy decoding (verification evaluates at
//! most [`crate::model::Model::decode_exact_tokens`] tokens, so every row's
//! logits equal those of one-token decoding, on the CPU and on the GPU).

use std::time::Instant;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use thiserror::Error;

use crate::error::EngineError;
use crate::generate::{Flow, GenerationStats, StopReason};
use crate::model::LogitsFor;
use crate::sampling::{Sampler, SamplerConfig};
use crate::session::Session;
use crate::spec_controller::{DraftController, DraftLength, DraftLengthError};
use crate::tokenizer::Tokenizer;

#[derive(Debug, Error)]
pub enum SpeculativeError {
    #[error(
        "the draft vocabulary has {draft} tokens, the target's {target}: the models cannot pair"
    )]
    VocabSize { target: usize, draft: usize },
    #[error("token {id} is {target:?} for the target but {draft:?} for the draft: the vocabularies differ")]
    VocabToken {
        id: u32,
        target: String,
        draft: String,
    },
    #[error("the target produces {target} logits per token, the draft {draft}")]
    LogitWidth { target: usize, draft: usize },
    #[error(transparent)]
    DraftLength(#[from] DraftLengthError),
    #[error(transparent)]
    Engine(#[from] EngineError),
}

pub type Result<T> = std::result::Result<T, SpeculativeError>;

/// Checks that a draft model speaks the target's vocabulary: the same size
/// and the same text for every token id.
pub fn check_vocab(target: &Tokenizer, draft: &Tokenizer) -> Result<()> {
    if target.n_vocab() != draft.n_vocab() {
        return Err(SpeculativeError::VocabSize {
            target: target.n_vocab(),
            draft: draft.n_vocab(),
        });
    }
    for id in 0..target.n_vocab() as u32 {
        let (t, d) = (target.token_bytes(id), draft.token_bytes(id));
        if t != d {
            let text =
                |b: Option<&[u8]>| String::from_utf8_lossy(b.unwrap_or_default()).into_owned();
            return Err(SpeculativeError::VocabToken {
                id,
                target: text(t),
                draft: text(d),
            });
        }
    }
    Ok(())
}

#[derive(Clone, Debug)]
pub struct SpeculativeOptions {
    /// Maximum tokens to generate.
    pub n_predict: usize,
    pub sampler: SamplerConfig,
    pub draft: DraftLength,
}

#[derive(Clone, Debug)]
pub struct SpeculativeStats {
    pub generation: GenerationStats,
    /// Target forward passes during generation (one per round).
    pub n_rounds: usize,
    /// Tokens the draft proposed.
    pub n_drafted: usize,
    /// Proposed tokens the target accepted.
    pub n_accepted: usize,
}

impl SpeculativeStats {
    /// Accepted over drafted tokens.
    pub fn acceptance_rate(&self) -> f64 {
        ratio(self.n_accepted, self.n_drafted)
    }

    /// Drafted tokens per round.
    pub fn mean_draft_len(&self) -> f64 {
        ratio(self.n_drafted, self.n_rounds)
    }

    /// Generated tokens per target forward (the first token comes from the
    /// prompt's forward and is not counted).
    pub fn tokens_per_target_forward(&self) -> f64 {
        ratio(self.generation.n_generated.saturating_sub(1), self.n_rounds)
    }
}

fn ratio(a: usize, b: usize) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

/// A sampling distribution: (token, probability), as [`Sampler::distribution`] gives it.
type Dist = Vec<(u32, f32)>;

/// The sampler's distribution for `logits` after the tokens in `history`
/// (the repetition penalty looks at them).
fn distribution(cfg: &SamplerConfig, history: &[u32], logits: &[f32]) -> Dist {
    let mut s = Sampler::new(cfg.clone());
    if cfg.repeat_penalty != 1.0 {
        let start = history.len().saturating_sub(cfg.repeat_last_n);
        history[start..].iter().for_each(|&t| s.accept(t));
    }
    s.distribution(logits)
}

fn prob(d: &Dist, token: u32) -> f32 {
    d.iter().find(|e| e.0 == token).map_or(0.0, |e| e.1)
}

/// Draws from a distribution (one-hot ones without using the generator).
fn draw(d: &[(u32, f32)], rng: &mut StdRng) -> u32 {
    if d.len() == 1 {
        return d[0].0;
    }
    let total: f32 = d.iter().map(|e| e.1).sum();
    let r = rng.gen::<f32>() * total;
    let mut cum = 0.0;
    for &(tok, p) in d {
        cum += p;
        if r < cum {
            return tok;
        }
    }
    d[d.len() - 1].0
}

/// Whether to keep a drafted token with target probability `p` and draft
/// probability `q`: always when p >= q, else with probability p / q.
fn accept(p: f32, q: f32, rng: &mut StdRng) -> bool {
    if p >= q {
        return true;
    }
    p > 0.0 && rng.gen::<f32>() * q < p
}

/// The replacement after a rejection: norm(max(0, p - q)); `p` itself in the
/// degenerate case where nothing is left (p == q up to rounding).
fn draw_residual(p: &Dist, q: &Dist, rng: &mut StdRng) -> u32 {
    let residual: Dist = p
        .iter()
        .map(|&(t, pt)| (t, (pt - prob(q, t)).max(0.0)))
        .filter(|e| e.1 > 0.0)
        .collect();
    if residual.is_empty() {
        draw(p, rng)
    } else {
        draw(&residual, rng)
    }
}

/// Hands generated tokens to the caller and decides when generation stops,
/// with the same checks in the same order as plain generation.
struct Emitter<'a, E, T> {
    n_predict: usize,
    n_ctx: usize,
    /// Prompt and generated tokens (the committed context).
    history: Vec<u32>,
    n_generated: usize,
    is_eog: &'a E,
    on_token: &'a mut T,
}

impl<E: Fn(u32) -> bool, T: FnMut(u32) -> Flow> Emitter<'_, E, T> {
    fn emit(&mut self, tok: u32) -> Option<StopReason> {
        if (self.is_eog)(tok) {
            return Some(StopReason::EndOfGeneration);
        }
        self.n_generated += 1;
        self.history.push(tok);
        if (self.on_token)(tok) == Flow::Stop {
            return Some(StopReason::Caller);
        }
        if self.n_generated >= self.n_predict {
            return Some(StopReason::TokenLimit);
        }
        // Every committed token but the newest has its keys in the cache.
        if self.history.len() > self.n_ctx {
            return Some(StopReason::ContextFull);
        }
        None
    }
}

/// Generates from `prompt` with `target`, `draft` proposing tokens. The
/// sessions must pair (see [`check_vocab`]); both keep their contexts for
/// prefix reuse. `on_token` sees each generated token and may stop the loop.
pub fn generate_speculative(
    target: &mut Session<'_>,
    draft: &mut Session<'_>,
    prompt: &[u32],
    opts: &SpeculativeOptions,
    is_eog: impl Fn(u32) -> bool,
    mut on_token: impl FnMut(u32) -> Flow,
) -> Result<SpeculativeStats> {
    let (n_target, n_draft) = (target.model().cfg.n_vocab, draft.model().cfg.n_vocab);
    if n_target != n_draft {
        return Err(SpeculativeError::LogitWidth {
            target: n_target,
            draft: n_draft,
        });
    }
    let mut controller = DraftController::new(opts.draft)?;
    controller.begin();
    let cfg = &opts.sampler;
    let mut rng = StdRng::seed_from_u64(cfg.seed);

    let reused = common_prefix(target.tokens(), prompt).min(prompt.len().saturating_sub(1));
    let t0 = Instant::now();
    let logits = target.set_prompt(prompt)?;
    draft.set_prompt(prompt)?;
    let prompt_time = t0.elapsed();

    let t1 = Instant::now();
    let mut out = Emitter {
        n_predict: opts.n_predict,
        n_ctx: target.n_ctx(),
        history: prompt.to_vec(),
        n_generated: 0,
        is_eog: &is_eog,
        on_token: &mut on_token,
    };
    let (mut n_rounds, mut n_drafted, mut n_accepted) = (0, 0, 0);
    // The newest sampled token, not yet emitted nor in either cache.
    let mut last = draw(&distribution(cfg, &out.history, &logits), &mut rng);
    let stop = loop {
        if opts.n_predict == 0 {
            break StopReason::TokenLimit;
        }
        if let Some(stop) = out.emit(last) {
            break stop;
        }
        let base = target.n_past();
        let n_committed = out.history.len();
        // Verification evaluates `last` and the drafts: it must fit the
        // context, stay on the exact decode kernel, and not draft past the
        // token limit (a round yields up to n + 1 tokens).
        let n = controller
            .next_len()
            .min(target.n_ctx() - base - 1)
            .min((draft.n_ctx() + 1).saturating_sub(n_committed))
            .min(
                target
                    .model()
                    .decode_exact_tokens()
                    .saturating_sub(1)
                    .max(1),
            )
            .min(opts.n_predict - out.n_generated - 1);

        let (drafted, q_dists) = propose(draft, &out.history, n, cfg, &is_eog, &mut rng)?;
        let mut batch = Vec::with_capacity(1 + drafted.len());
        batch.push(last);
        batch.extend_from_slice(&drafted);
        let rows = target.eval(&batch, LogitsFor::All)?;
        n_rounds += 1;
        let n_vocab = rows.len() / batch.len();

        let mut accepted = 0;
        let mut stop = None;
        let mut next = None;
        for (i, (&d, q)) in drafted.iter().zip(&q_dists).enumerate() {
            let p = distribution(cfg, &out.history, &rows[i * n_vocab..][..n_vocab]);
            if accept(prob(&p, d), prob(q, d), &mut rng) {
                accepted += 1;
                stop = out.emit(d);
                if stop.is_some() {
                    break;
                }
            } else {
                next = Some(draw_residual(&p, q, &mut rng));
                break;
            }
        }
        // Keep `last` and the accepted drafts, but never an end-of-generation
        // token: it was accepted, yet it is not part of the context.
        target.truncate((base + 1 + accepted).min(out.history.len()));
        controller.observe(drafted.len(), accepted);
        n_drafted += drafted.len();
        n_accepted += accepted;
        if let Some(stop) = stop {
            break stop;
        }
        last = next.unwrap_or_else(|| {
            // Every draft was accepted: the last row gives one more token.
            let row = &rows[drafted.len() * n_vocab..][..n_vocab];
            draw(&distribution(cfg, &out.history, row), &mut rng)
        });
    };
    Ok(SpeculativeStats {
        generation: GenerationStats {
            n_prompt: prompt.len(),
            n_prompt_evaluated: prompt.len() - reused,
            prompt_time,
            n_generated: out.n_generated,
            gen_time: t1.elapsed(),
            stop,
        },
        n_rounds,
        n_drafted,
        n_accepted,
    })
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Brings the draft's context up to `committed` (dropping its rejected
/// proposals) and lets it propose up to `n` tokens, each drawn from its own
/// sampling distribution, which is returned alongside for the acceptance test.
fn propose(
    draft: &mut Session<'_>,
    committed: &[u32],
    n: usize,
    cfg: &SamplerConfig,
    is_eog: &impl Fn(u32) -> bool,
    rng: &mut StdRng,
) -> Result<(Vec<u32>, Vec<Dist>)> {
    let mut drafted = Vec::with_capacity(n);
    let mut dists = Vec::with_capacity(n);
    if n == 0 {
        return Ok((drafted, dists));
    }
    let keep = common_prefix(draft.tokens(), committed).min(committed.len() - 1);
    draft.truncate(keep);
    let mut logits = draft.eval(&committed[keep..], LogitsFor::Last)?;
    let mut history = committed.to_vec();
    loop {
        let q = distribution(cfg, &history, &logits);
        let d = draw(&q, rng);
        drafted.push(d);
        dists.push(q);
        history.push(d);
        // Nothing follows an end-of-generation token.
        if drafted.len() == n || is_eog(d) {
            return Ok((drafted, dists));
        }
        logits = draft.eval(&[d], LogitsFor::Last)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drafting from q and accepting/resampling as above yields samples from p.
    #[test]
    fn rejection_sampling_preserves_the_target_distribution() {
        let p: Dist = vec![(0, 0.5), (1, 0.3), (2, 0.2)];
        let q: Dist = vec![(0, 0.2), (1, 0.2), (2, 0.3), (3, 0.3)];
        let mut rng = StdRng::seed_from_u64(5);
        let n = 200_000;
        let mut counts = [0usize; 4];
        for _ in 0..n {
            let d = draw(&q, &mut rng);
            let t = if accept(prob(&p, d), prob(&q, d), &mut rng) {
                d
            } else {
                draw_residual(&p, &q, &mut rng)
            };
            counts[t as usize] += 1;
        }
        for (t, want) in [0.5, 0.3, 0.2, 0.0].into_iter().enumerate() {
            let got = counts[t] as f64 / n as f64;
            assert!((got - want).abs() < 0.01, "token {t}: {got} vs {want}");
        }
    }

    #[test]
    fn greedy_acceptance_needs_no_random_draws() {
        let mut rng = StdRng::seed_from_u64(1);
        let before = rng.clone().gen::<u64>();
        let (p, q): (Dist, Dist) = (vec![(4, 1.0)], vec![(7, 1.0)]);
        assert!(!accept(prob(&p, 7), prob(&q, 7), &mut rng));
        assert_eq!(draw_residual(&p, &q, &mut rng), 4);
        assert!(accept(1.0, 1.0, &mut rng));
        assert_eq!(rng.gen::<u64>(), before);
    }
}
