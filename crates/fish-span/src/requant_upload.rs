//! The upload path with re-quantisation: decides per weight what the device
//! gets, converts on the rayon pool, and records what it cost.

use fish_core::backend::BackendError;
use fish_gguf::GgmlType;
use fish_quant::requant::{requantize, RequantTarget};
use fish_quant::Weights;
use fish_vk::{Gpu, TensorHandle, VkError};

use crate::backend::{map_err, VulkanBackend};
use crate::requant::{plan, Conversion, KeptReason};
use crate::requant_mix::{RequantOutcome, RequantRecord};

/// Whether the device runs the kernels of a re-quantisation target. FQ3 has
/// no GGUF type id; until fish-vk runs FQ3 matmuls, weights bound for FQ3
/// keep their source type (and the mix counts them as kept).
pub fn device_has(target: RequantTarget) -> bool {
    match target {
        RequantTarget::Q4K => fish_vk::supports(GgmlType::Q4_K),
        RequantTarget::Fq3 => false,
    }
}

/// Uploads re-quantised rows in the target's device format.
fn upload_as(
    gpu: &Gpu,
    target: RequantTarget,
    bytes: &[u8],
    n_in: usize,
    n_out: usize,
) -> Result<TensorHandle, VkError> {
    match target {
        RequantTarget::Q4K => gpu.upload(GgmlType::Q4_K, bytes, n_in, n_out),
        // `device_has` keeps FQ3 conversions from getting here.
        RequantTarget::Fq3 => Err(VkError::Shape("the device has no FQ3 kernels".into())),
    }
}

fn verbose() -> bool {
    std::env::var("FISH_GPU_VERBOSE").is_ok_and(|v| v == "1")
}

impl VulkanBackend {
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
                match requantize(w.ty, w.data, w.n_in, w.n_out, target) {
                    Ok(r) => {
                        let h =
                            upload_as(gpu, target, &r.bytes, w.n_in, w.n_out).map_err(map_err)?;
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
