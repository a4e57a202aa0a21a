//! Calibration: one short CPU forward that records, for every weight
//! matrix, the mean square of each input column's activations. A
//! re-quantiser weighs each weight's error by this energy (the error of
//! `W x` from a weight error `e_j` grows with `e_j² E[x_j²]`), so the
//! columns the model drives hard get the finer fit.

use std::collections::HashMap;

use super::forward::{embed, run_layers_observed, OneSequence};
use super::ops;
use super::weights::Matrix;
use super::Model;
use crate::error::{EngineError, Result};

/// A fixed text for calibration runs: code and prose, so both kinds of
/// activations are seen; deliberately not the quality command's prompt.
pub const CALIBRATION_TEXT: &str = "The function below reads a list of \
records from a file, keeps those whose score is above a threshold, and \
returns them sorted by name.\n\ndef load_records(path, threshold):\n    \
with open(path) as f:\n        rows = [line.strip().split(',') for line in f]\n    \
kept = [r for r in rows if float(r[1]) > threshold]\n    \
return sorted(kept, key=lambda r: r[0])\n\nIn the evening the river was \
quiet, and the old bridge cast a long shadow across the water.";

/// Mean square of every input column, per weight tensor name (matrices that
/// share an input hold equal vectors).
#[derive(Clone, Debug, Default)]
pub struct InputImportance {
    pub by_tensor: HashMap<String, Vec<f32>>,
}

impl InputImportance {
    /// The vector of tensor `name` (one entry per input column).
    pub fn get(&self, name: &str) -> Option<&[f32]> {
        self.by_tensor.get(name).map(Vec::as_slice)
    }
}

/// Per-column sums of squares over the rows seen so far.
#[derive(Default)]
struct Energy {
    sums: Vec<f64>,
    rows: usize,
}

impl Energy {
    fn add(&mut self, x: &[f32], n_in: usize) {
        if self.sums.len() != n_in {
            self.sums = vec![0.0; n_in];
            self.rows = 0;
        }
        for row in x.chunks_exact(n_in) {
            for (s, &v) in self.sums.iter_mut().zip(row) {
                *s += (v as f64) * (v as f64);
            }
            self.rows += 1;
        }
    }

    fn mean(&self) -> Vec<f32> {
        let n = self.rows.max(1) as f64;
        self.sums.iter().map(|&s| (s / n) as f32).collect()
    }
}

/// Runs `tokens` through every layer and the output projection on the
/// model's current placement and returns the input energy of each matrix.
pub fn calibrate(model: &Model, tokens: &[u32]) -> Result<InputImportance> {
    if tokens.is_empty() {
        return Err(EngineError::EmptyInput);
    }
    let mut energy: HashMap<String, Energy> = HashMap::new();
    let mut record = |mats: &[&Matrix], x: &[f32]| {
        for m in mats {
            energy
                .entry(m.info.name.clone())
                .or_default()
                .add(x, m.n_in);
        }
    };
    let mut cache = model.new_cache(tokens.len());
    let mut x = embed(&model.gguf, &model.cfg, &model.weights, tokens)?;
    let positions: Vec<usize> = (0..tokens.len()).collect();
    run_layers_observed(
        model,
        &mut x,
        &positions,
        &mut OneSequence {
            cache: &mut cache,
            pos0: 0,
        },
        0..model.cfg.n_layer,
        &mut record,
    )?;
    ops::rms_norm_rows(&mut x, &model.weights.output_norm, model.cfg.rms_eps);
    record(&[&model.weights.output], &x);
    Ok(InputImportance {
        by_tensor: energy.into_iter().map(|(k, e)| (k, e.mean())).collect(),
    })
}
