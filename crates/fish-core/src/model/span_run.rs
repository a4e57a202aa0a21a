//! Stage 2 in the forward pass: the layers below the span on the CPU (or
//! stage 1), the span's layers in one device submit, then the output.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use super::forward::{output_logits, LogitsFor};
use super::kv_cache::KvCache;
use super::layer_range::{embed_tokens, forward_layers};
use super::residual_buffer::recycle;
use super::Model;
use crate::backend::SpanBackend;
use crate::error::{EngineError, Result};

/// A span that began on the device: layers `first_layer..n_layer`.
pub struct SpanRun {
    pub first_layer: usize,
    /// Per device KV slot, the id of the KV cache whose positions it holds
    /// (0: none). Slot 0 is the one plain forwards use.
    owners: Mutex<Vec<u64>>,
    /// Host wall time of the last forward's phases, in nanoseconds: the
    /// KV claim and the embedding, the layers below the span, the span
    /// call, and the output (norm and projection).
    phase_ns: [AtomicU64; 4],
}

impl SpanRun {
    pub fn new(first_layer: usize) -> SpanRun {
        SpanRun {
            first_layer,
            owners: Mutex::new(vec![0]),
            phase_ns: Default::default(),
        }
    }

    /// e.g. `host 0.61 ms: before span 0.02 (embedding 0.01), span 0.45,
    /// output 0.14`.
    pub fn host_summary(&self) -> String {
        let ms = |i: usize| self.phase_ns[i].load(Ordering::Relaxed) as f64 / 1e6;
        format!(
            "host {:.3} ms: before span {:.3} (embedding {:.3}), span {:.3}, output {:.3}",
            ms(0) + ms(1) + ms(2) + ms(3),
            ms(0) + ms(1),
            ms(0),
            ms(2),
            ms(3)
        )
    }

    fn record_phases(&self, marks: [Instant; 5]) {
        for (i, slot) in self.phase_ns.iter().enumerate() {
            let ns = marks[i + 1].duration_since(marks[i]).as_nanos();
            slot.store(ns.min(u128::from(u64::MAX)) as u64, Ordering::Relaxed);
        }
    }

    fn owners(&self) -> MutexGuard<'_, Vec<u64>> {
        self.owners.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes the device KV hold exactly `cache`'s positions `< pos0`, or
    /// asks the caller to replay its history when it cannot (another
    /// sequence owns the device KV, or it holds fewer positions).
    fn claim(&self, span: &dyn SpanBackend, cache: &KvCache, pos0: usize) -> Result<()> {
        {
            let mut owners = self.owners();
            if owners[0] != cache.id() {
                if pos0 != 0 {
                    return Err(EngineError::SpanReplay);
                }
                span.span_kv_truncate(0);
                owners[0] = cache.id();
            }
        }
        if span.span_kv_len() > pos0 {
            span.span_kv_truncate(pos0);
        }
        if span.span_kv_len() < pos0 {
            return Err(EngineError::SpanReplay);
        }
        Ok(())
    }

    /// The device KV slot of each cache id: the slot it already owns, else
    /// a free one (emptied), else a new one. The caller checks how many of
    /// its positions the slot holds (`span_kv_slot_len`).
    pub(super) fn claim_slots(&self, span: &dyn SpanBackend, ids: &[u64]) -> Vec<usize> {
        let mut owners = self.owners();
        ids.iter()
            .map(|&id| {
                if let Some(slot) = owners.iter().position(|&o| o == id) {
                    return slot;
                }
                let slot = owners.iter().position(|&o| o == 0).unwrap_or_else(|| {
                    owners.push(0);
                    owners.len() - 1
                });
                owners[slot] = id;
                span.span_kv_slot_truncate(slot, 0);
                slot
            })
            .collect()
    }

    /// The slot `id` owns, if any.
    pub(super) fn slot_of(&self, id: u64) -> Option<usize> {
        self.owners().iter().position(|&o| o == id)
    }

    /// Frees the slots of these cache ids (their sequences are gone) for
    /// other sequences.
    pub(super) fn release_slots(&self, span: &dyn SpanBackend, ids: &[u64]) {
        let mut owners = self.owners();
        for (slot, owner) in owners.iter_mut().enumerate() {
            if ids.contains(owner) {
                *owner = 0;
                span.span_kv_slot_truncate(slot, 0);
            }
        }
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
    let start = Instant::now();
    cache.check_append(pos0, n_tok)?;
    run.claim(span, cache, pos0)?;
    let mut x = embed_tokens(model, tokens)?;
    let embedded = Instant::now();
    // Layers below the span keep their keys/values in the CPU cache; this
    // also advances the cache's length for the span's positions.
    forward_layers(model, cache, &mut x, pos0, 0..run.first_layer)?;
    let span_start = Instant::now();
    let rows = match logits_for {
        LogitsFor::Last => 1,
        LogitsFor::All => n_tok,
    };
    // The span runs the output too when it can: one submit returns logits.
    let fused = rows <= span.span_max_logit_rows();
    let ran = if fused {
        span.span_forward_logits(&x, n_tok, pos0, rows).map(Some)
    } else {
        span.span_forward(&mut x, n_tok, pos0).map(|()| None)
    };
    let logits = match ran {
        Ok(logits) => logits,
        Err(e) => {
            // The device KV may now be incomplete: nothing can trust it again.
            if let Some(p) = model.gpu.as_ref() {
                p.mark_failed(&e);
            }
            cache.truncate(pos0);
            return Err(EngineError::SpanReplay);
        }
    };
    if let Some(logits) = logits {
        let now = Instant::now();
        run.record_phases([start, embedded, span_start, now, now]);
        recycle(x);
        return Ok(logits);
    }
    let n_embd = model.cfg.n_embd;
    let rows = match logits_for {
        LogitsFor::Last => &x[(n_tok - 1) * n_embd..],
        LogitsFor::All => &x[..],
    };
    let output_start = Instant::now();
    let logits = output_logits(model, rows)?;
    run.record_phases([start, embedded, span_start, output_start, Instant::now()]);
    recycle(x);
    Ok(logits)
}
