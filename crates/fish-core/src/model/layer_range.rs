//! A range of layers applied to a residual stream the caller holds: the
//! reference a device span is checked against, and how the engine runs the
//! layers below a span. The arithmetic is the full forward's own layer loop.

use std::ops::Range;

use super::forward::{embed, output_logits, run_layers, OneSequence};
use super::kv_cache::KvCache;
use super::Model;
use crate::error::{EngineError, Result};

/// The token embeddings (scaled where the architecture does): the residual
/// stream before layer 0, n_tok x n_embd.
pub fn embed_tokens(model: &Model, tokens: &[u32]) -> Result<Vec<f32>> {
    embed(&model.gguf, &model.cfg, &model.weights, tokens)
}

/// Runs `layers` on `x` (n_tok x n_embd) for tokens at positions `pos0..`,
/// storing their keys and values in `cache` (which must hold the earlier
/// positions of these layers), and advances the cache to `pos0 + n_tok`.
pub fn forward_layers(
    model: &Model,
    cache: &mut KvCache,
    x: &mut [f32],
    pos0: usize,
    layers: Range<usize>,
) -> Result<()> {
    let cfg = &model.cfg;
    let n_tok = x.len() / cfg.n_embd;
    if n_tok == 0 {
        return Err(EngineError::EmptyInput);
    }
    if x.len() != n_tok * cfg.n_embd || layers.end > cfg.n_layer {
        return Err(EngineError::BadHyperParameter(format!(
            "{} values for rows of {} through layers {layers:?} of {}",
            x.len(),
            cfg.n_embd,
            cfg.n_layer
        )));
    }
    cache.check_append(pos0, n_tok)?;
    let positions: Vec<usize> = (pos0..pos0 + n_tok).collect();
    run_layers(
        model,
        x,
        &positions,
        &mut OneSequence { cache, pos0 },
        layers,
    )?;
    cache.set_len(pos0 + n_tok);
    Ok(())
}

/// The final norm and output projection of hidden rows (n_rows x n_embd):
/// n_rows x n_vocab logits, as the engine's forward computes them.
pub fn output_rows(model: &Model, rows: &[f32]) -> Result<Vec<f32>> {
    if rows.is_empty() || !rows.len().is_multiple_of(model.cfg.n_embd) {
        return Err(EngineError::BadHyperParameter(format!(
            "{} values for rows of {}",
            rows.len(),
            model.cfg.n_embd
        )));
    }
    output_logits(model, rows)
}
