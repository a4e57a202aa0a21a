//! Batched decoding of independent sequences: each has its own KV cache, and
//! one step advances every chosen sequence by one token with a single forward
//! in which each weight is read once for all of them.
//!
//! With a GPU span, prompts and steps run the span's layers on the device,
//! each sequence in a device KV slot of its own; the host cache then holds
//! only the layers below the span for those positions. Any backend error moves the session to
//! the host path for good: the positions the host lacks are first rebuilt
//! from each sequence's tokens, so none is lost.

use thiserror::Error;

use crate::error::EngineError;
use crate::model::forward_batch::{
    forward_batch, forward_batch_span, forward_span_prompt, release_span_slots, truncate_span_slot,
    SpanBatchError, SpanSequence,
};
use crate::model::{KvCache, LogitsFor, Model};

#[derive(Debug, Error)]
pub enum BatchError {
    #[error("sequence {seq} does not exist (the batch has {n_seq})")]
    NoSuchSequence { seq: usize, n_seq: usize },
    #[error("sequences of a step must be listed once each, in increasing order")]
    UnorderedSequences,
    #[error("{n_tokens} tokens for {n_seqs} sequences: a step takes one token per sequence")]
    TokenCount { n_tokens: usize, n_seqs: usize },
    #[error(transparent)]
    Engine(#[from] EngineError),
}

pub type Result<T> = std::result::Result<T, BatchError>;

/// What the session's steps ran on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BatchStats {
    /// Steps whose span layers ran on the device in one batched submit.
    pub span_steps: usize,
    /// Steps on the host path (CPU, or per-matmul offload).
    pub host_steps: usize,
    /// Positions run again to fill a device slot or the host cache.
    pub rebuilt_positions: usize,
}

/// One sequence: its host cache and the tokens of its positions.
struct Sequence {
    cache: KvCache,
    tokens: Vec<u32>,
    /// Positions `< host_len` have every layer's keys and values in `cache`
    /// (span steps write only the layers below the span).
    host_len: usize,
}

/// The logits of one batched step: one row of `n_vocab` values per listed
/// sequence, in order, in one buffer (the rows as the forward returned
/// them: a step of 8 llama-sized rows is 4 MB, and copying it into a vector
/// per row cost as much as reading it from the device).
#[derive(Clone, Debug, PartialEq)]
pub struct BatchLogits {
    values: Vec<f32>,
    n_rows: usize,
}

impl BatchLogits {
    /// Rows of the step (one per listed sequence).
    pub fn len(&self) -> usize {
        self.n_rows
    }

    pub fn is_empty(&self) -> bool {
        self.n_rows == 0
    }

    /// Row `i` (the i-th listed sequence's logits); panics past the last
    /// row, as indexing does.
    pub fn row(&self, i: usize) -> &[f32] {
        let n_vocab = self.values.len() / self.n_rows.max(1);
        &self.values[i * n_vocab..(i + 1) * n_vocab]
    }

    /// The rows in order.
    pub fn rows(&self) -> impl ExactSizeIterator<Item = &[f32]> + '_ {
        (0..self.n_rows).map(|i| self.row(i))
    }

    /// Each row as a vector of its own.
    pub fn into_rows(self) -> Vec<Vec<f32>> {
        self.rows().map(<[f32]>::to_vec).collect()
    }
}

/// Several sequences over one model, and the thread pool that runs them.
pub struct BatchSession<'m> {
    model: &'m Model,
    seqs: Vec<Sequence>,
    pool: rayon::ThreadPool,
    /// Why steps left the GPU span for the host path (None while they may use it).
    span_off: Option<String>,
    stats: BatchStats,
}

impl<'m> BatchSession<'m> {
    /// `n_seq` empty sequences of `n_ctx` positions each; `n_threads` 0 uses
    /// one thread per core.
    pub fn new(
        model: &'m Model,
        n_seq: usize,
        n_ctx: usize,
        n_threads: usize,
    ) -> Result<BatchSession<'m>> {
        if n_ctx == 0 || n_seq == 0 {
            return Err(EngineError::BadHyperParameter(format!(
                "batch of {n_seq} sequences of {n_ctx} positions"
            ))
            .into());
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(n_threads)
            .build()
            .map_err(|e| EngineError::ThreadPool(e.to_string()))?;
        let seqs = (0..n_seq)
            .map(|_| Sequence {
                cache: model.new_cache(n_ctx),
                tokens: Vec::new(),
                host_len: 0,
            })
            .collect();
        Ok(BatchSession {
            model,
            seqs,
            pool,
            span_off: None,
            stats: BatchStats::default(),
        })
    }

    pub fn n_seq(&self) -> usize {
        self.seqs.len()
    }

    pub fn n_threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// What the steps so far ran on.
    pub fn stats(&self) -> BatchStats {
        self.stats
    }

    /// Why steps no longer use the GPU span, after a backend error.
    pub fn span_fallback_reason(&self) -> Option<&str> {
        self.span_off.as_deref()
    }

    /// Positions filled in sequence `seq`.
    pub fn n_past(&self, seq: usize) -> Result<usize> {
        self.check_seq(seq)?;
        Ok(self.seqs[seq].cache.len())
    }

    /// Drops positions from `n` on in sequence `seq` (and in its device KV
    /// slot; the other sequences are untouched).
    pub fn truncate(&mut self, seq: usize, n: usize) -> Result<()> {
        self.check_seq(seq)?;
        let s = &mut self.seqs[seq];
        s.cache.truncate(n);
        s.tokens.truncate(n);
        s.host_len = s.host_len.min(n);
        truncate_span_slot(self.model, s.cache.id(), n);
        Ok(())
    }

    /// Appends `tokens` to sequence `seq` alone (a prompt) and returns their
    /// logits: through the sequence's device slot while steps use the span,
    /// else with every layer in the host cache.
    pub fn eval_one(
        &mut self,
        seq: usize,
        tokens: &[u32],
        logits_for: LogitsFor,
    ) -> Result<Vec<f32>> {
        self.check_seq(seq)?;
        let logits = match self.span_prompt(seq, tokens, logits_for) {
            Ok(logits) => logits,
            Err(e) => {
                self.note_span_error(&e);
                self.host_prompt(seq, tokens, logits_for)?
            }
        };
        self.seqs[seq].tokens.extend_from_slice(tokens);
        Ok(logits)
    }

    /// A prompt through the sequence's device slot.
    fn span_prompt(
        &mut self,
        seq: usize,
        tokens: &[u32],
        logits_for: LogitsFor,
    ) -> std::result::Result<Vec<f32>, SpanBatchError> {
        if self.span_off.is_some() {
            return Err(SpanBatchError::NoSpan);
        }
        let (model, s) = (self.model, &mut self.seqs[seq]);
        let mut sequence = SpanSequence {
            cache: &mut s.cache,
            history: &s.tokens,
        };
        self.pool
            .install(|| forward_span_prompt(model, &mut sequence, tokens, logits_for))
    }

    /// A prompt with every layer's keys and values in the host cache.
    fn host_prompt(
        &mut self,
        seq: usize,
        tokens: &[u32],
        logits_for: LogitsFor,
    ) -> Result<Vec<f32>> {
        self.complete_host(seq)?;
        let (model, s) = (self.model, &mut self.seqs[seq]);
        let pos0 = s.cache.len();
        let logits = self
            .pool
            .install(|| model.forward_host_kv(&mut s.cache, tokens, pos0, logits_for))?;
        s.host_len = s.cache.len();
        Ok(logits)
    }

    /// After a backend error the session stays on the host path.
    fn note_span_error(&mut self, e: &SpanBatchError) {
        if let SpanBatchError::Backend(_) = e {
            if verbose() {
                eprintln!("fish: batched decode leaves the GPU span ({e})");
            }
            self.span_off = Some(e.to_string());
        }
    }

    /// Appends `tokens[i]` to sequence `seqs[i]` for every i in one forward
    /// and returns one row of logits per listed sequence, in order.
    pub fn step(&mut self, seqs: &[usize], tokens: &[u32]) -> Result<BatchLogits> {
        if seqs.len() != tokens.len() {
            return Err(BatchError::TokenCount {
                n_tokens: tokens.len(),
                n_seqs: seqs.len(),
            });
        }
        for &s in seqs {
            self.check_seq(s)?;
        }
        if seqs.windows(2).any(|w| w[0] >= w[1]) {
            return Err(BatchError::UnorderedSequences);
        }
        let logits = match self.span_step(seqs, tokens) {
            Ok(logits) => logits,
            Err(e) => {
                self.note_span_error(&e);
                self.host_step(seqs, tokens)?
            }
        };
        for (&s, &t) in seqs.iter().zip(tokens) {
            self.seqs[s].tokens.push(t);
        }
        Ok(BatchLogits {
            values: logits,
            n_rows: tokens.len(),
        })
    }

    /// Advances every sequence by one token (`tokens[s]` for sequence `s`).
    pub fn step_all(&mut self, tokens: &[u32]) -> Result<BatchLogits> {
        let seqs: Vec<usize> = (0..self.n_seq()).collect();
        self.step(&seqs, tokens)
    }

    /// One step through the GPU span (`seqs` checked and increasing).
    fn span_step(
        &mut self,
        seqs: &[usize],
        tokens: &[u32],
    ) -> std::result::Result<Vec<f32>, SpanBatchError> {
        if self.span_off.is_some() {
            return Err(SpanBatchError::NoSpan);
        }
        let mut chosen: Vec<SpanSequence<'_>> = self
            .seqs
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| seqs.binary_search(i).is_ok())
            .map(|(_, s)| SpanSequence {
                cache: &mut s.cache,
                history: &s.tokens,
            })
            .collect();
        let model = self.model;
        let (logits, rebuilt) = self
            .pool
            .install(|| forward_batch_span(model, &mut chosen, tokens))?;
        self.stats.span_steps += 1;
        self.stats.rebuilt_positions += rebuilt;
        Ok(logits)
    }

    /// One step with every layer's keys and values in the host caches.
    fn host_step(&mut self, seqs: &[usize], tokens: &[u32]) -> Result<Vec<f32>> {
        for &s in seqs {
            self.complete_host(s)?;
        }
        let mut chosen: Vec<&mut KvCache> = self
            .seqs
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| seqs.binary_search(i).is_ok())
            .map(|(_, s)| &mut s.cache)
            .collect();
        let model = self.model;
        let logits = self
            .pool
            .install(|| forward_batch(model, &mut chosen, tokens))?;
        for &s in seqs {
            let s = &mut self.seqs[s];
            s.host_len = s.cache.len();
        }
        self.stats.host_steps += 1;
        Ok(logits)
    }

    /// Rebuilds the host cache's positions that span steps left without the
    /// span's layers, from the sequence's tokens.
    fn complete_host(&mut self, seq: usize) -> Result<()> {
        let (model, s) = (self.model, &mut self.seqs[seq]);
        let from = s.host_len;
        let to = s.cache.len();
        if from < to {
            self.pool.install(|| {
                model.forward_host_kv(&mut s.cache, &s.tokens[from..to], from, LogitsFor::Last)
            })?;
            s.host_len = to;
            self.stats.rebuilt_positions += to - from;
        }
        Ok(())
    }

    fn check_seq(&self, seq: usize) -> Result<()> {
        if seq >= self.seqs.len() {
            return Err(BatchError::NoSuchSequence {
                seq,
                n_seq: self.seqs.len(),
            });
        }
        Ok(())
    }
}

impl Drop for BatchSession<'_> {
    fn drop(&mut self) {
        let ids: Vec<u64> = self.seqs.iter().map(|s| s.cache.id()).collect();
        release_span_slots(self.model, &ids);
    }
}

/// FISH_GPU_VERBOSE=1: the session says why it left the GPU span.
fn verbose() -> bool {
    std::env::var("FISH_GPU_VERBOSE").is_ok_and(|v| v == "1")
}

#[cfg(test)]
mod tests {
    use super::BatchLogits;

    #[test]
    fn batch_logits_are_rows_of_one_buffer_in_order() {
        let logits = BatchLogits {
            values: (0..12).map(|v| v as f32).collect(),
            n_rows: 3,
        };
        assert_eq!(logits.len(), 3);
        assert!(!logits.is_empty());
        assert_eq!(logits.row(1), &[4.0, 5.0, 6.0, 7.0]);
        let rows: Vec<&[f32]> = logits.rows().collect();
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[2], &[8.0, 9.0, 10.0, 11.0]);
        assert_eq!(
            logits.into_rows(),
            vec![
                vec![0.0, 1.0, 2.0, 3.0],
                vec![4.0, 5.0, 6.0, 7.0],
                vec![8.0, 9.0, 10.0, 11.0]
            ]
        );
    }
}
