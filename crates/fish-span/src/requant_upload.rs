//! The upload path with re-quantisation: decides per weight what the device
//! gets, converts on the rayon pool, and records what it cost.

use fish_core::backend::BackendError;
use fish_gguf::GgmlType;
use std::sync::Arc;

use fish_core::model::calibration::InputImportance;
use fish_quant::requant::{requantize, requantize_weighted, RequantTarget};
use fish_quant::Weights;
use fish_vk::{TensorHandle, WeightFormat};

use crate::backend::{map_err, VulkanBackend};
use crate::requant::{plan, Conversion, KeptReason};
use crate::requant_mix::{RequantOutcome, RequantRecord};

/// Whether the device runs the kernels of a re-quantisation target (weights
/// bound for a target without kernels keep their source type, counted as kept).
pub fn device_has(target: RequantTarget) -> bool {
    fish_vk::supports(device_format(target))
}

/// The device format of a re-quantisation target (FQ3 has no GGUF type id).
fn device_format(target: RequantTarget) -> WeightFormat {
    match target {
        RequantTarget::Q4K => WeightFormat::Ggml(GgmlType::Q4_K),
        RequantTarget::Fq3 => WeightFormat::Fq3,
    }
}

fn verbose() -> bool {
    std::env::var("FISH_GPU_VERBOSE").is_ok_and(|v| v == "1")
}

impl VulkanBackend {
    /// Calibration input energy for the weighted re-quantisation fit (see
    /// `fish_core::model::calibration`); tensors it does not cover, or
    /// covers with another width, keep the plain fit. None turns it off.
    pub fn set_requant_importance(&self, importance: Option<Arc<InputImportance>>) {
        *self
            .requant_importance
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = importance;
    }

    fn importance_of(&self, name: &str, n_in: usize) -> Option<Vec<f32>> {
        let guard = self
            .requant_importance
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let v = guard.as_ref()?.get(name)?;
        (v.len() == n_in).then(|| v.to_vec())
    }

    /// Uploads `w` as the re-quantisation mode wants it, with the record of
    /// what was done when the mode applies to its type.
    pub(crate) fn upload_requantized(
        &self,
        name: &str,
        w: &Weights<'_>,
    ) -> Result<(TensorHandle, Option<RequantRecord>), BackendError> {
        let gpu = self.gpu();
        let original = || gpu.upload(w.ty, w.data, w.n_in, w.n_out).map_err(map_err);
        let record = |outcome| RequantRecord {
            name: name.to_owned(),
            from: w.ty,
            source_bytes: w.data.len() as u64,
            outcome,
        };
        let (handle, record) = match plan(self.requant_mode(), w.ty, w.n_in, device_has) {
            Conversion::Untouched => return Ok((original()?, None)),
            Conversion::Kept(reason) => (original()?, record(RequantOutcome::Kept(reason))),
            Conversion::Convert(target) => {
                let converted = match self.importance_of(name, w.n_in) {
                    Some(weights) => {
                        requantize_weighted(w.ty, w.data, w.n_in, w.n_out, target, &weights)
                    }
                    None => requantize(w.ty, w.data, w.n_in, w.n_out, target),
                };
                match converted {
                    Ok(r) => {
                        let h = gpu
                            .upload(device_format(target), &r.bytes, w.n_in, w.n_out)
                            .map_err(map_err)?;
                        let outcome = RequantOutcome::Converted {
                            to: target,
                            bytes: r.bytes.len() as u64,
                            rel_rms: r.rel_rms,
                        };
                        (h, record(outcome))
                    }
                    Err(_) => (
                        original()?,
                        record(RequantOutcome::Kept(KeptReason::DecodeFailed)),
                    ),
                }
            }
        };
        if verbose() {
            eprintln!("fish: requant {}", record.line());
        }
        Ok((handle, Some(record)))
    }
}
