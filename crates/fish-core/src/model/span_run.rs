//! Stage 2 in the forward pass: the layers below the span on the CPU (or
//! stage 1), the span's layers in one device submit, then the output.

use std::sync::atomic::{AtomicU64, Ordering};

use super::forward::{output_logits, LogitsFor};
use super::kv_cache::KvCache;
use super::layer_range::{embed_tokens, forward_layers};
use super::Model;
use crate::backend::SpanBackend;
use crate::error::{EngineError, Result};

/// A span that began on the device: layers `first_layer..n_layer`.
pub struct SpanRun {
    pub first_layer: usize,
    /// Id of the KV cache whose positions the device KV holds (0: none).
    owner: AtomicU64,
}

impl SpanRun {
    pub fn new(first_layer: usize) -> SpanRun {
        SpanRun {
            first_layer,
            owner: AtomicU64::new(0),
        }
    }

    /// Makes the device KV hold exactly `cache`'s positions `< pos0`, or
    /// asks the caller to replay its history when it cannot (another
    /// sequence owns the device KV, or it holds fewer positions).
    fn claim(&self, span: &dyn SpanBackend, cache: &KvCache, pos0: usize) -> Result<()> {
        if self.owner.load(Ordering::Relaxed) != cache.id() {
            if pos0 != 0 {
                return Err(EngineError::SpanReplay);
            }
            span.span_kv_truncate(0);
            self.owner.store(cache.id(), Ordering::Relaxed);
        }
        if span.span_kv_len() > pos0 {
            span.span_kv_truncate(pos0);
        }
        if span.span_kv_len() < pos0 {
            return Err(EngineError::SpanReplay);
        }
        Ok(())
    }
}

pub(super) fn forward_with_span(
    model: &Model,
    run: &SpanRun,
    span: &dyn SpanBackend,
    cache: &mut KvCache,
    tokens: &[u32],
    pos0: usize,
    logits_for: LogitsFor,
) -> Result<Vec<f32>> {
    let n_tok = tokens.len();
    if n_tok == 0 {
        return Err(EngineError::EmptyInput);
    }
    cache.check_append(pos0, n_tok)?;
    run.claim(span, cache, pos0)?;
    let mut x = embed_tokens(model, tokens)?;
    // Layers below the span keep their keys/values in the CPU cache; this
    // also advances the cache's length for the span's positions.
    forward_layers(model, cache, &mut x, pos0, 0..run.first_layer)?;
    if let Err(e) = span.span_forward(&mut x, n_tok, pos0) {
        // The device KV may now be incomplete: nothing can trust it again.
        if let Some(p) = model.gpu.as_ref() {
            p.mark_failed(&e);
        }
        cache.truncate(pos0);
        return Err(EngineError::SpanReplay);
    }
    let n_embd = model.cfg.n_embd;
    let rows = match logits_for {
        LogitsFor::Last => &x[(n_tok - 1) * n_embd..],
        LogitsFor::All => &x[..],
    };
    output_logits(model, rows)
}
