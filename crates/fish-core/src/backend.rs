//! The engine's only view of a GPU: a trait object handed in by the binary.
//! fish-core knows no Vulkan; fish-span implements this over fish-vk.

use fish_gguf::GgmlType;
use fish_quant::Weights;
use thiserror::Error;

/// A weight matrix resident on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TensorId(pub u64);

#[derive(Debug, Error)]
pub enum BackendError {
    /// The device or budget cannot take the allocation; placement stops here.
    #[error("device memory: {0}")]
    OutOfMemory(String),
    /// The backend cannot run this (type, shape); the work stays on the CPU.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The device failed; the engine moves the rest of the run to the CPU.
    #[error("device error: {0}")]
    Device(String),
}

pub trait ComputeBackend: Send + Sync {
    /// Why the backend is or is not usable, e.g. `ok: NVIDIA H200` or `no Vulkan loader`.
    fn status(&self) -> String;

    /// One line for stats: device, MB of weights resident, and what runs there.
    fn describe(&self) -> String;

    /// Whether matmuls with weights of this type can run on the device.
    fn supports(&self, ty: GgmlType) -> bool;

    /// Bytes the backend could still allocate under its budget.
    fn memory_free(&self) -> u64;

    /// Copies a weight matrix to the device. Fails cleanly (nothing left
    /// allocated) when the budget or the device refuses.
    fn upload(&self, name: &str, w: Weights<'_>) -> Result<TensorId, BackendError>;

    /// Bytes of weights currently resident.
    fn bytes_resident(&self) -> u64;

    /// Releases a tensor; unknown ids are ignored.
    fn free(&self, id: TensorId);

    /// y[t * n_out + o] for `n_tok` tokens of `x` (one submit).
    fn matmul(&self, id: TensorId, x: &[f32], n_tok: usize) -> Result<Vec<f32>, BackendError>;

    /// Several weights on one input in one submit (q/k/v, gate/up).
    fn matmul_group(
        &self,
        ids: &[TensorId],
        x: &[f32],
        n_tok: usize,
    ) -> Result<Vec<Vec<f32>>, BackendError>;

    /// A short note attached to `describe()` by the engine (layers placed).
    fn set_placement_note(&self, note: String);
}
