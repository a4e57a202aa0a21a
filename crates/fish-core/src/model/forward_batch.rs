//! The batched decode forward: one new token for each of several independent
//! sequences. Every matmul serves all rows in one pass over its weight; only
//! the KV store and the attention are per sequence, each row in its own cache
//! at its own position. With a GPU span, the span's layers run in one device
//! submit in which each sequence has its own device KV slot.

use thiserror::Error;

use super::attention::{attend, AttentionShape, TILED_MIN_TOKENS};
use super::forward::{embed, output_logits, run_layers, KvSite, LogitsFor};
use super::kv_cache::KvCache;
use super::layer_range::forward_layers;
use super::Model;
use crate::backend::{BackendError, SpanBackend, SpanRow};
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

/// Why a batched step did not run through the GPU span; the caller takes the
/// host path instead.
#[derive(Debug, Error)]
pub enum SpanBatchError {
    #[error("the model runs no batched GPU span")]
    NoSpan,
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("GPU span: {0}")]
    Backend(#[from] BackendError),
}

/// One sequence of a batched span step.
pub struct SpanSequence<'a> {
    /// Its host cache: the layers below the span, and its length.
    pub cache: &'a mut KvCache,
    /// The tokens at positions `0..cache.len()`, to rebuild positions its
    /// device KV slot lacks.
    pub history: &'a [u32],
}

/// [`forward_batch`] with the span's layers on the device: appends
/// `tokens[b]` to sequence `b` and returns one row of logits per sequence.
/// Each sequence gets a device KV slot of its own (kept across steps); a
/// slot holding fewer positions than the sequence is first rebuilt from its
/// history, so no row attends to a device KV that lacks positions. Returns
/// the logits and how many positions were rebuilt. On error no cache has
/// advanced; the host caches of the span's layers were never written here.
pub fn forward_batch_span(
    model: &Model,
    seqs: &mut [SpanSequence<'_>],
    tokens: &[u32],
) -> std::result::Result<(Vec<f32>, usize), SpanBatchError> {
    let placement = model.gpu.as_ref().ok_or(SpanBatchError::NoSpan)?;
    let (run, span) = placement.span().ok_or(SpanBatchError::NoSpan)?;
    if span.span_max_batch_rows() == 0 {
        return Err(SpanBatchError::NoSpan);
    }
    if tokens.is_empty() {
        return Err(EngineError::EmptyInput.into());
    }
    if seqs.len() != tokens.len() {
        return Err(EngineError::BadHyperParameter(format!(
            "batched decode of {} tokens over {} sequences",
            tokens.len(),
            seqs.len()
        ))
        .into());
    }
    let positions: Vec<usize> = seqs.iter().map(|s| s.cache.len()).collect();
    for (s, &p) in seqs.iter().zip(&positions) {
        s.cache.check_append(p, 1)?;
        if s.history.len() != p {
            return Err(EngineError::BadHyperParameter(format!(
                "a history of {} tokens for {p} positions",
                s.history.len()
            ))
            .into());
        }
    }
    let ids: Vec<u64> = seqs.iter().map(|s| s.cache.id()).collect();
    let slots = run.claim_slots(span, &ids);
    let device_failed = |e: BackendError| {
        if matches!(e, BackendError::Device(_)) {
            placement.mark_failed(&e);
        }
        SpanBatchError::Backend(e)
    };
    let mut rebuilt = 0;
    for ((seq, &slot), &p) in seqs.iter_mut().zip(&slots).zip(&positions) {
        rebuilt += sync_slot(model, run.first_layer, span, seq, slot, p).map_err(|e| match e {
            SpanBatchError::Backend(b) => device_failed(b),
            other => other,
        })?;
    }
    let rows: Vec<SpanRow> = slots
        .iter()
        .zip(&positions)
        .map(|(&slot, &pos)| SpanRow { slot, pos })
        .collect();
    let mut x = embed(&model.gguf, &model.cfg, &model.weights, tokens)?;
    {
        let mut caches: Vec<&mut KvCache> = seqs.iter_mut().map(|s| &mut *s.cache).collect();
        run_layers(
            model,
            &mut x,
            &positions,
            &mut PerSequence {
                caches: &mut caches,
                positions: &positions,
            },
            0..run.first_layer,
        )?;
    }
    let logits = span_rows_logits(model, span, &mut x, &rows).map_err(|e| match e {
        SpanBatchError::Backend(b) => device_failed(b),
        other => other,
    })?;
    for (s, &p) in seqs.iter_mut().zip(&positions) {
        s.cache.set_len(p + 1);
    }
    Ok((logits, rebuilt))
}

/// Appends `tokens` (a prompt) to one sequence through its device slot:
/// the layers below the span on the host, the span's layers in the slot
/// (64 rows per submit). Returns the logits `logits_for` asks for; on error
/// the cache is back at its length before the call.
pub fn forward_span_prompt(
    model: &Model,
    seq: &mut SpanSequence<'_>,
    tokens: &[u32],
    logits_for: LogitsFor,
) -> std::result::Result<Vec<f32>, SpanBatchError> {
    let placement = model.gpu.as_ref().ok_or(SpanBatchError::NoSpan)?;
    let (run, span) = placement.span().ok_or(SpanBatchError::NoSpan)?;
    if span.span_max_batch_rows() == 0 {
        return Err(SpanBatchError::NoSpan);
    }
    if tokens.is_empty() {
        return Err(EngineError::EmptyInput.into());
    }
    let p = seq.cache.len();
    seq.cache.check_append(p, tokens.len())?;
    if seq.history.len() != p {
        return Err(EngineError::BadHyperParameter(format!(
            "a history of {} tokens for {p} positions",
            seq.history.len()
        ))
        .into());
    }
    let slot = run.claim_slots(span, &[seq.cache.id()])[0];
    let ran = sync_slot(model, run.first_layer, span, seq, slot, p).and_then(|_| {
        let mut x = embed(&model.gguf, &model.cfg, &model.weights, tokens)?;
        forward_layers(model, seq.cache, &mut x, p, 0..run.first_layer)?;
        let rows: Vec<SpanRow> = (p..p + tokens.len())
            .map(|pos| SpanRow { slot, pos })
            .collect();
        prompt_rows_logits(model, span, &mut x, &rows, logits_for)
    });
    ran.map_err(|e| {
        seq.cache.truncate(p);
        match e {
            SpanBatchError::Backend(b) => {
                if matches!(b, BackendError::Device(_)) {
                    placement.mark_failed(&b);
                }
                SpanBatchError::Backend(b)
            }
            other => other,
        }
    })
}

/// The span over a prompt's rows (one slot's consecutive positions) in one
/// forward, as a single session runs its prompt (`forward_with_span`), so
/// that the prompt's KV and logits are a single session's at any length;
/// the logits of the last row (or of every row) in the submit, or from the
/// host output where the span does not return that many.
fn prompt_rows_logits(
    model: &Model,
    span: &dyn SpanBackend,
    x: &mut [f32],
    rows: &[SpanRow],
    logits_for: LogitsFor,
) -> std::result::Result<Vec<f32>, SpanBatchError> {
    let wanted = match logits_for {
        LogitsFor::All => rows.len(),
        LogitsFor::Last => 1,
    };
    if wanted <= span.span_max_logit_rows() {
        return Ok(span.span_forward_batch_logits(x, rows, wanted)?);
    }
    span.span_forward_batch(x, rows)?;
    let n_embd = model.cfg.n_embd;
    Ok(output_logits(model, &x[(rows.len() - wanted) * n_embd..])?)
}

/// Makes device slot `slot` hold exactly the sequence's `p` positions:
/// drops any beyond, or runs the missing ones from its history through the
/// layers below the span (host) and the span. Returns the positions run.
fn sync_slot(
    model: &Model,
    first_layer: usize,
    span: &dyn SpanBackend,
    seq: &mut SpanSequence<'_>,
    slot: usize,
    p: usize,
) -> std::result::Result<usize, SpanBatchError> {
    let held = span.span_kv_slot_len(slot);
    if held >= p {
        if held > p {
            span.span_kv_slot_truncate(slot, p);
        }
        return Ok(0);
    }
    let mut x = embed(
        &model.gguf,
        &model.cfg,
        &model.weights,
        &seq.history[held..p],
    )?;
    // Rewrites the layers below the span with the values they already hold,
    // and yields the span's input.
    forward_layers(model, seq.cache, &mut x, held, 0..first_layer)?;
    // One slot's consecutive rows: one forward, however many.
    let rows: Vec<SpanRow> = (held..p).map(|pos| SpanRow { slot, pos }).collect();
    span.span_forward_batch(&mut x, &rows)?;
    Ok(p - held)
}

/// The logits of every row after the span: in the span's submit where it
/// runs the output, else on the host from the span's output rows.
fn span_rows_logits(
    model: &Model,
    span: &dyn SpanBackend,
    x: &mut [f32],
    rows: &[SpanRow],
) -> std::result::Result<Vec<f32>, SpanBatchError> {
    let n_embd = model.cfg.n_embd;
    let max_rows = span.span_max_batch_rows();
    let mut logits: Vec<f32> = Vec::new();
    for (xc, rc) in x.chunks_mut(max_rows * n_embd).zip(rows.chunks(max_rows)) {
        let chunk = if rc.len() <= span.span_max_logit_rows() {
            span.span_forward_batch_logits(xc, rc, rc.len())?
        } else {
            span.span_forward_batch(xc, rc)?;
            output_logits(model, xc)?
        };
        // The first forward's vector is kept as it came (a step of up to
        // max_rows sequences is one forward: 4 MB for 8 llama-sized rows,
        // not copied); later ones are appended.
        if logits.is_empty() {
            logits = chunk;
        } else {
            logits.extend(chunk);
        }
    }
    Ok(logits)
}

/// Drops positions from `n` on in the device slot of the cache `id`, when it
/// has one (the other slots are untouched).
pub fn truncate_span_slot(model: &Model, id: u64, n: usize) {
    if let Some((run, span)) = model.gpu.as_ref().and_then(|p| p.span()) {
        if let Some(slot) = run.slot_of(id) {
            span.span_kv_slot_truncate(slot, n);
        }
    }
}

/// Frees the device slots of these caches (their sequences are gone).
pub fn release_span_slots(model: &Model, ids: &[u64]) {
    if let Some((run, span)) = model.gpu.as_ref().and_then(|p| p.span()) {
        run.release_slots(span, ids);
    }
}
