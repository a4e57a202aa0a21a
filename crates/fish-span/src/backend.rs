//! Stage 1: each matmul group is one submit on the device through fish-vk.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use fish_core::backend::{BackendError, ComputeBackend, SpanBackend, TensorId};
use fish_gguf::GgmlType;
use fish_quant::Weights;
use fish_vk::{Gpu, TensorHandle, VkError};

use crate::requant::RequantMode;
use crate::requant_mix::{describe_mix, RequantRecord};
use fish_core::model::calibration::InputImportance;

/// The device a backend runs on: the process-wide one (never torn down) or
/// one it owns (released when the backend is dropped).
enum Device {
    Global(&'static Gpu),
    Owned(Box<Gpu>),
}

pub struct VulkanBackend {
    device: Device,
    handles: Mutex<HashMap<u64, TensorHandle>>,
    next_id: AtomicU64,
    note: Mutex<String>,
    /// What uploads re-quantise to (FISH_GPU_REQUANT unless set).
    requant: Mutex<RequantMode>,
    /// What re-quantisation did to each resident tensor it applied to.
    requant_records: Mutex<HashMap<u64, RequantRecord>>,
    /// Calibration input energy; tensors it covers get the weighted fit.
    pub(crate) requant_importance: Mutex<Option<Arc<InputImportance>>>,
    /// The stage-2 span, between span_begin and span_end.
    pub(crate) span: Mutex<Option<fish_vk::Span>>,
    /// Device memory held for a span while its layers are placed.
    pub(crate) span_hold: Mutex<Option<fish_vk::Reservation>>,
}

/// The process-wide backend, unless FISH_GPU disables it or no device can be
/// opened (then the reason, which `FISH_GPU_VERBOSE=1` also prints).
pub fn open_global() -> Result<Arc<VulkanBackend>, String> {
    if !fish_vk::enabled() {
        return Err(fish_vk::status());
    }
    match fish_vk::global() {
        Some(gpu) => Ok(Arc::new(VulkanBackend::new(Device::Global(gpu)))),
        None => Err(fish_vk::status()),
    }
}

pub(crate) fn map_err(e: VkError) -> BackendError {
    match e {
        VkError::Budget { .. } => BackendError::OutOfMemory(e.to_string()),
        VkError::Unsupported(_) | VkError::Shape(_) => BackendError::Unsupported(e.to_string()),
        other => BackendError::Device(other.to_string()),
    }
}

impl VulkanBackend {
    fn new(device: Device) -> VulkanBackend {
        VulkanBackend {
            device,
            handles: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            note: Mutex::new(String::new()),
            requant: Mutex::new(RequantMode::from_env()),
            requant_records: Mutex::new(HashMap::new()),
            requant_importance: Mutex::new(None),
            span: Mutex::new(None),
            span_hold: Mutex::new(None),
        }
    }

    /// A backend on a device of its own, opened from the environment (tests).
    pub fn open_owned() -> Result<VulkanBackend, String> {
        Self::open_owned_with(&fish_vk::Config::from_env())
    }

    /// A backend on a device of its own, opened as `config` says (tests
    /// that compare settings in one process without racing on the
    /// environment).
    pub fn open_owned_with(config: &fish_vk::Config) -> Result<VulkanBackend, String> {
        let gpu = Gpu::open(config).map_err(|e| e.to_string())?;
        Ok(Self::new(Device::Owned(Box::new(gpu))))
    }

    pub fn gpu(&self) -> &Gpu {
        match &self.device {
            Device::Global(g) => g,
            Device::Owned(g) => g,
        }
    }

    fn handles(&self) -> MutexGuard<'_, HashMap<u64, TensorHandle>> {
        self.handles.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The re-quantisation mode for later uploads (tensors already resident keep theirs).
    pub fn set_requant(&self, mode: RequantMode) {
        *self.requant.lock().unwrap_or_else(|e| e.into_inner()) = mode;
    }

    pub fn requant_mode(&self) -> RequantMode {
        *self.requant.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn requant_records(&self) -> MutexGuard<'_, HashMap<u64, RequantRecord>> {
        self.requant_records
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// What re-quantisation did to each resident tensor it applied to
    /// (relative RMS error per tensor), in upload order.
    pub fn requant_report(&self) -> Vec<RequantRecord> {
        let records = self.requant_records();
        let mut ids: Vec<_> = records.keys().copied().collect();
        ids.sort_unstable();
        ids.iter().map(|id| records[id].clone()).collect()
    }

    /// The device handle of a tensor this backend uploaded (tests compare
    /// kernels on it).
    pub fn device_handle(&self, id: TensorId) -> Option<TensorHandle> {
        self.handles().get(&id.0).copied()
    }

    pub(crate) fn handle(&self, id: TensorId) -> Result<TensorHandle, BackendError> {
        self.handles()
            .get(&id.0)
            .copied()
            .ok_or_else(|| BackendError::Device(format!("tensor {} is not resident", id.0)))
    }
}

impl ComputeBackend for VulkanBackend {
    fn status(&self) -> String {
        format!("ready: {}", self.gpu().info().name)
    }

    fn describe(&self) -> String {
        let note = self.note.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut line = self.gpu().describe();
        if let Some(mix) = describe_mix(self.requant_records().values()) {
            line = format!("{line}, {mix}");
        }
        if !note.is_empty() {
            line = format!("{line}; {note}");
        }
        match self.span_note() {
            Some(span) => format!("{line}; {span}"),
            None => line,
        }
    }

    fn supports(&self, ty: GgmlType) -> bool {
        fish_vk::supports(ty)
    }

    fn memory_free(&self) -> u64 {
        self.gpu().memory_free()
    }

    fn upload(&self, name: &str, w: Weights<'_>) -> Result<TensorId, BackendError> {
        let (h, record) = self.upload_requantized(name, &w)?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.handles().insert(id, h);
        if let Some(record) = record {
            self.requant_records().insert(id, record);
        }
        Ok(TensorId(id))
    }

    fn bytes_resident(&self) -> u64 {
        self.gpu().bytes_resident()
    }

    fn free(&self, id: TensorId) {
        let mut handles = self.handles();
        if let Some(h) = handles.remove(&id.0) {
            self.requant_records().remove(&id.0);
            // A handle we hold is resident; a failure here means a lost device,
            // which later calls report.
            let _ = self.gpu().free(h);
            if handles.is_empty() {
                // Nothing of ours is resident: give the scratch back too.
                self.gpu().release_scratch();
            }
        }
    }

    fn matmul(&self, id: TensorId, x: &[f32], n_tok: usize) -> Result<Vec<f32>, BackendError> {
        self.gpu()
            .matmul(self.handle(id)?, x, n_tok)
            .map_err(map_err)
    }

    fn matmul_group(
        &self,
        ids: &[TensorId],
        x: &[f32],
        n_tok: usize,
    ) -> Result<Vec<Vec<f32>>, BackendError> {
        let hs = ids
            .iter()
            .map(|&id| self.handle(id))
            .collect::<Result<Vec<_>, _>>()?;
        self.gpu().matmul_group(&hs, x, n_tok).map_err(map_err)
    }

    fn set_placement_note(&self, note: String) {
        *self.note.lock().unwrap_or_else(|e| e.into_inner()) = note;
    }

    /// Up to MATVEC_MAX_TOKENS tokens run the matvec kernel in its one-token
    /// shape (bit-identical per token); larger batches take the tiled kernels.
    fn exact_batch_tokens(&self) -> usize {
        fish_vk::MATVEC_MAX_TOKENS
    }

    fn as_span(&self) -> Option<&dyn SpanBackend> {
        Some(self)
    }
}

impl Drop for VulkanBackend {
    fn drop(&mut self) {
        self.span_release_hold();
        self.span_end();
    }
}
