//! Batched decoding of independent sequences: each has its own KV cache, and
//! one step advances every chosen sequence by one token with a single forward
//! in which each weight is read once for all of them.

use thiserror::Error;

use crate::error::EngineError;
use crate::model::forward_batch::forward_batch;
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

/// Several sequences over one model, and the thread pool that runs them.
pub struct BatchSession<'m> {
    model: &'m Model,
    caches: Vec<KvCache>,
    pool: rayon::ThreadPool,
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
        Ok(BatchSession {
            model,
            caches: (0..n_seq).map(|_| model.new_cache(n_ctx)).collect(),
            pool,
        })
    }

    pub fn n_seq(&self) -> usize {
        self.caches.len()
    }

    pub fn n_threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// Positions filled in sequence `seq`.
    pub fn n_past(&self, seq: usize) -> Result<usize> {
        Ok(self.cache(seq)?.len())
    }

    /// Drops positions from `n` on in sequence `seq`.
    pub fn truncate(&mut self, seq: usize, n: usize) -> Result<()> {
        self.check_seq(seq)?;
        self.caches[seq].truncate(n);
        Ok(())
    }

    /// Appends `tokens` to sequence `seq` alone (a prompt) and returns their logits.
    pub fn eval_one(
        &mut self,
        seq: usize,
        tokens: &[u32],
        logits_for: LogitsFor,
    ) -> Result<Vec<f32>> {
        self.check_seq(seq)?;
        let (model, cache) = (self.model, &mut self.caches[seq]);
        let pos0 = cache.len();
        Ok(self
            .pool
            .install(|| model.forward_host_kv(cache, tokens, pos0, logits_for))?)
    }

    /// Appends `tokens[i]` to sequence `seqs[i]` for every i in one forward
    /// and returns one row of logits per listed sequence, in order.
    pub fn step(&mut self, seqs: &[usize], tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
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
        let mut chosen: Vec<&mut KvCache> = self
            .caches
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| seqs.binary_search(i).is_ok())
            .map(|(_, c)| c)
            .collect();
        let model = self.model;
        let logits = self
            .pool
            .install(|| forward_batch(model, &mut chosen, tokens))?;
        let n_vocab = logits.len() / tokens.len().max(1);
        Ok(logits.chunks_exact(n_vocab).map(<[f32]>::to_vec).collect())
    }

    /// Advances every sequence by one token (`tokens[s]` for sequence `s`).
    pub fn step_all(&mut self, tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
        let seqs: Vec<usize> = (0..self.n_seq()).collect();
        self.step(&seqs, tokens)
    }

    fn cache(&self, seq: usize) -> Result<&KvCache> {
        self.check_seq(seq)?;
        Ok(&self.caches[seq])
    }

    fn check_seq(&self, seq: usize) -> Result<()> {
        if seq >= self.caches.len() {
            return Err(BatchError::NoSuchSequence {
                seq,
                n_seq: self.caches.len(),
            });
        }
        Ok(())
    }
}
