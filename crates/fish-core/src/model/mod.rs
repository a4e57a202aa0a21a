//! A loaded model: configuration, tensors located in the map, and the forward pass.

mod attention;
mod attention_tiles;
pub mod calibration;
pub mod config;
mod forward;
pub mod forward_batch;
pub mod gpu;
pub mod kv_cache;
pub mod layer_range;
pub mod ops;
mod residual_buffer;
mod span_run;
mod swiglu;
mod vec_math;
pub mod weights;

use std::path::Path;
use std::sync::Arc;

use fish_gguf::Gguf;

use crate::backend::ComputeBackend;

pub use config::{Activation, Arch, ModelConfig, RopeStyle};
pub use forward::LogitsFor;
pub use gpu::{GpuPlacement, PlacementLimits, PlacementProgress};
pub use kv_cache::KvCache;
pub use weights::{LayerWeights, Matrix, ModelWeights};

use crate::error::Result;

pub struct Model {
    pub gguf: Arc<Gguf>,
    pub cfg: ModelConfig,
    pub weights: ModelWeights,
    /// Stage-1 device placement, when a backend was given.
    pub gpu: Option<GpuPlacement>,
}

impl Model {
    pub fn load(path: impl AsRef<Path>) -> Result<Model> {
        Self::from_gguf(Arc::new(Gguf::open(path)?))
    }

    pub fn from_gguf(gguf: Arc<Gguf>) -> Result<Model> {
        let cfg = ModelConfig::from_gguf(&gguf)?;
        let weights = ModelWeights::load(&gguf, &cfg)?;
        Ok(Model {
            gguf,
            cfg,
            weights,
            gpu: None,
        })
    }

    /// Places the output projection and as many trailing layers as fit on
    /// the backend's device (replacing any earlier placement).
    pub fn place_on(&mut self, backend: Arc<dyn ComputeBackend>, limits: PlacementLimits) {
        self.place_on_with_progress(backend, limits, &mut |_| {});
    }

    /// [`Model::place_on`], reporting each layer uploaded.
    pub fn place_on_with_progress(
        &mut self,
        backend: Arc<dyn ComputeBackend>,
        limits: PlacementLimits,
        progress: &mut dyn FnMut(PlacementProgress),
    ) {
        self.gpu = None;
        self.gpu = Some(GpuPlacement::place(
            backend,
            &self.gguf,
            &self.cfg,
            &self.weights,
            limits,
            progress,
        ));
    }

    /// Frees every device tensor; the model runs on the CPU afterwards.
    pub fn unplace(&mut self) {
        self.gpu = None;
    }

    /// The backend's one-line description, when a backend is attached.
    pub fn gpu_describe(&self) -> Option<String> {
        self.gpu.as_ref().map(|p| p.backend.describe())
    }

    /// The span description of the placed layers `first..` (None without a
    /// placement), for callers that drive a span themselves.
    pub fn span_spec(&self, first: usize, n_ctx: usize) -> Option<crate::backend::SpanSpec<'_>> {
        let p = self.gpu.as_ref()?;
        Some(p.span_spec(&self.cfg, &self.weights, first, n_ctx))
    }

    /// The span's per-stage time shares from its last forward, when the
    /// backend profiles (FISH_GPU_PROFILE=2).
    pub fn gpu_profile(&self) -> Option<String> {
        let (run, span) = self.gpu.as_ref()?.span()?;
        span.span_profile()
            .map(|p| format!("{p}; {}", run.host_summary()))
    }

    /// The most tokens one forward may hold while every token's logits stay
    /// exactly those of evaluating it alone: the CPU's limit, and the GPU
    /// backend's when layers are placed.
    pub fn decode_exact_tokens(&self) -> usize {
        let cpu = forward_batch::MAX_DECODE_EXACT_TOKENS;
        match self.gpu.as_ref() {
            Some(p) if !p.has_failed() => cpu.min(p.backend.exact_batch_tokens()),
            _ => cpu,
        }
    }

    /// Whether a one-token forward leaves the host nothing to run on its
    /// thread pool: a span from the first layer whose submit also returns
    /// the logits, so that the host only embeds the token, waits and reads
    /// the logits back.
    pub fn decode_step_on_device(&self) -> bool {
        match self.gpu.as_ref().and_then(|p| p.span()) {
            Some((run, span)) => run.first_layer == 0 && span.span_max_logit_rows() >= 1,
            None => false,
        }
    }

    /// A KV cache for `n_ctx` positions of every layer.
    pub fn new_cache(&self, n_ctx: usize) -> KvCache {
        KvCache::new(self.cfg.n_layer, n_ctx, self.cfg.k_dim(), self.cfg.v_dim())
    }

    /// Like [`Model::forward`], but every layer keeps its keys and values in
    /// `cache` (a span's layers run per matmul): for caches that later take
    /// part in batched decode, which reads every layer from the host.
    pub fn forward_host_kv(
        &self,
        cache: &mut KvCache,
        tokens: &[u32],
        pos0: usize,
        logits_for: LogitsFor,
    ) -> Result<Vec<f32>> {
        forward::forward(self, cache, tokens, pos0, logits_for)
    }

    /// Evaluates `tokens` at positions `pos0..` and returns the requested logits.
    pub fn forward(
        &self,
        cache: &mut KvCache,
        tokens: &[u32],
        pos0: usize,
        logits_for: LogitsFor,
    ) -> Result<Vec<f32>> {
        if let Some((run, span)) = self.gpu.as_ref().and_then(|p| p.span()) {
            return span_run::forward_with_span(self, run, span, cache, tokens, pos0, logits_for);
        }
        forward::forward(self, cache, tokens, pos0, logits_for)
    }
}
