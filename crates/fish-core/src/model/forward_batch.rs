//! The batched decode forward: one new token for each of several independent
//! sequences. Every matmul serves all rows in one pass over its weight; only
//! the KV store and the attention are per sequence, each row in its own cache
//! at its own position.

use super::attention::{attend, AttentionShape, TILED_MIN_TOKENS};
use super::forward::{embed, output_logits, run_layers, KvSite};
use super::kv_cache::KvCache;
use super::Model;
use crate::error::{EngineError, Result};

/// The largest number of tokens one forward can evaluate with the same
/// attention kernel as single-token decode. Larger batches switch to the
/// tiled kernel, whose rounding differs, so speculative verification stays
/// below this to keep greedy output identical to plain decoding.
pub const MAX_DECODE_EXACT_TOKENS: usize = TILED_MIN_TOKENS - 1;

/// Row `b` belongs to `caches[b]` at position `positions[b]`.
struct PerSequence<'a, 'c> {
    caches: &'a mut [&'c mut KvCache],
    positions: &'a [usize],
}

impl KvSite for PerSequence<'_, '_> {
    fn store(&mut self, il: usize, t: usize, k: &[f32], v: &[f32]) {
        self.caches[t].store(il, self.positions[t], k, v);
    }

    fn attend(&self, shape: &AttentionShape, il: usize, q: &[f32], out: &mut [f32]) {
        let q_row = shape.n_head * shape.head_dim;
        let out_row = shape.n_head * shape.head_dim_v;
        for (b, cache) in self.caches.iter().enumerate() {
            attend(
                shape,
                cache,
                il,
                &q[b * q_row..][..q_row],
                self.positions[b],
                &mut out[b * out_row..][..out_row],
            );
        }
    }
}

/// Appends `tokens[b]` to `caches[b]` (at that cache's current length) for
/// every `b`, and returns `tokens.len()` rows of logits, row `b` for sequence `b`.
pub fn forward_batch(
    model: &Model,
    caches: &mut [&mut KvCache],
    tokens: &[u32],
) -> Result<Vec<f32>> {
    if tokens.is_empty() {
        return Err(EngineError::EmptyInput);
    }
    if caches.len() != tokens.len() {
        return Err(EngineError::BadHyperParameter(format!(
            "batched decode of {} tokens over {} caches",
            tokens.len(),
            caches.len()
        )));
    }
    let positions: Vec<usize> = caches.iter().map(|c| c.len()).collect();
    for (c, &p) in caches.iter().zip(&positions) {
        c.check_append(p, 1)?;
    }
    let mut x = embed(&model.gguf, &model.cfg, &model.weights, tokens)?;
    run_layers(
        model,
        &mut x,
        &positions,
        &mut PerSequence {
            caches,
            positions: &positions,
        },
        0..model.cfg.n_layer,
    )?;
    for (c, &p) in caches.iter_mut().zip(&positions) {
        c.set_len(p + 1);
    }
    output_logits(model, &x)
}
