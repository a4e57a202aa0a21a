//! Stage 1 offload: which matrices live on the device, placed at load, and
//! freed when the model is dropped.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use fish_gguf::Gguf;

use super::config::ModelConfig;
use super::span_run::SpanRun;
use super::weights::{Matrix, ModelWeights};
use crate::backend::{
    BackendError, ComputeBackend, SpanBackend, SpanLayer, SpanOutput, SpanSpec, TensorId,
};

/// The device copies of one layer's projections, grouped by shared input.
pub struct LayerIds {
    pub qkv: [TensorId; 3],
    pub wo: TensorId,
    pub gate_up: [TensorId; 2],
    pub down: TensorId,
}

impl LayerIds {
    fn all(&self) -> [TensorId; 7] {
        let [q, k, v] = self.qkv;
        let [g, u] = self.gate_up;
        [q, k, v, self.wo, g, u, self.down]
    }
}

/// How many layers the placement may put on the device.
#[derive(Clone, Copy, Debug, Default)]
pub struct PlacementLimits {
    /// At most this many layers (None: as many as fit).
    pub max_layers: Option<usize>,
}

/// Layers uploaded so far out of those requested (for a progress bar).
#[derive(Clone, Copy, Debug)]
pub struct PlacementProgress {
    pub done: usize,
    pub total: usize,
}

pub struct GpuPlacement {
    pub backend: Arc<dyn ComputeBackend>,
    /// Per layer; the placed ones form a suffix `first_layer..n_layer`.
    layers: Vec<Option<LayerIds>>,
    pub output: Option<TensorId>,
    /// Stage 2 over the placed layers, when the backend runs spans.
    span: Option<SpanRun>,
    /// Set after a device failure: everything runs on the CPU from then on.
    failed: AtomicBool,
}

impl GpuPlacement {
    /// The output projection first, then the last layers backwards while
    /// uploads succeed. Trusts the backend's answers rather than file sizes.
    pub fn place(
        backend: Arc<dyn ComputeBackend>,
        g: &Gguf,
        cfg: &ModelConfig,
        w: &ModelWeights,
        limits: PlacementLimits,
        progress: &mut dyn FnMut(PlacementProgress),
    ) -> GpuPlacement {
        let n_layer = w.layers.len();
        let mut placement = GpuPlacement {
            backend,
            layers: (0..n_layer).map(|_| None).collect(),
            output: None,
            span: None,
            failed: AtomicBool::new(false),
        };
        let want_layers = limits.max_layers.unwrap_or(n_layer).min(n_layer);
        // With zero layers requested, nothing goes to the device (as llama.cpp's -ngl 0).
        if want_layers == 0 {
            placement.note(n_layer);
            return placement;
        }
        placement.output = placement.upload_one(g, &w.output).ok();
        // With spans on, the span's memory (parameters, arena, first KV,
        // logits) is held before any layer, so the layers take what is left
        // instead of leaving the span without room.
        let backend = placement.backend.clone();
        let span_backend = backend.as_span().filter(|_| spans_enabled());
        if let Some(span) = span_backend {
            let held = span.span_hold(
                cfg,
                want_layers,
                cfg.n_ctx_train,
                placement.output.is_some(),
            );
            if let (Err(e), true) = (held, verbose()) {
                eprintln!("fish: could not hold the span's memory before the layers ({e})");
            }
        }
        progress(PlacementProgress {
            done: 0,
            total: want_layers,
        });
        let mut placed = 0;
        for il in (0..n_layer).rev() {
            if placed == want_layers {
                break;
            }
            match placement.upload_layer(g, w, il) {
                Ok(ids) => {
                    placement.layers[il] = Some(ids);
                    placed += 1;
                    progress(PlacementProgress {
                        done: placed,
                        total: want_layers,
                    });
                }
                Err(_) => break,
            }
        }
        if let Some(span) = span_backend {
            span.span_release_hold();
        }
        if placed > 0 && spans_enabled() {
            placement.begin_span(cfg, w);
        }
        placement.note(n_layer);
        placement
    }

    /// Starts a device span over the placed layers; when the device declines
    /// for lack of memory, retries with one layer fewer (freeing it).
    fn begin_span(&mut self, cfg: &ModelConfig, w: &ModelWeights) {
        let Some(span) = self.backend.as_span() else {
            return;
        };
        loop {
            let Some(first) = self.layers.iter().position(|l| l.is_some()) else {
                return;
            };
            // The device KV grows on demand; the training context only caps it.
            let spec = self.span_spec(cfg, w, first, cfg.n_ctx_train);
            match span.span_begin(&spec) {
                Ok(_) => {
                    self.span = Some(SpanRun::new(first));
                    return;
                }
                Err(BackendError::OutOfMemory(_)) if first + 1 < self.layers.len() => {
                    if let Some(ids) = self.layers[first].take() {
                        ids.all().into_iter().for_each(|id| self.backend.free(id));
                    }
                }
                Err(e) => {
                    if verbose() {
                        eprintln!("fish: no GPU span ({e}); layers run per matmul");
                    }
                    return;
                }
            }
        }
    }

    /// The span description of placed layers `first..`, with the device KV
    /// capped at `n_ctx` positions.
    pub fn span_spec<'a>(
        &'a self,
        cfg: &'a ModelConfig,
        w: &'a ModelWeights,
        first: usize,
        n_ctx: usize,
    ) -> SpanSpec<'a> {
        let layers = (first..w.layers.len())
            .filter_map(|il| {
                let lw = &w.layers[il];
                Some(SpanLayer {
                    ids: self.layers[il].as_ref()?,
                    attn_norm: &lw.attn_norm,
                    bq: lw.bq.as_deref(),
                    bk: lw.bk.as_deref(),
                    bv: lw.bv.as_deref(),
                    q_norm: lw.q_norm.as_deref(),
                    k_norm: lw.k_norm.as_deref(),
                    post_attn_norm: lw.post_attn_norm.as_deref(),
                    ffn_norm: &lw.ffn_norm,
                    post_ffn_norm: lw.post_ffn_norm.as_deref(),
                })
            })
            .collect();
        SpanSpec {
            cfg,
            first_layer: first,
            layers,
            n_ctx,
            output: self.output.map(|id| SpanOutput {
                norm: &w.output_norm,
                id,
            }),
        }
    }

    fn note(&self, n_layer: usize) {
        let placed = self.n_layers_placed();
        let out = if self.output.is_some() {
            " + output"
        } else {
            ""
        };
        // The backend's own description names the span (layers, KV).
        self.backend
            .set_placement_note(format!("{placed}/{n_layer} layers{out}"));
    }

    /// The running span and its backend, unless there is none or the device failed.
    pub fn span(&self) -> Option<(&SpanRun, &dyn SpanBackend)> {
        if self.failed.load(Ordering::Relaxed) {
            return None;
        }
        Some((self.span.as_ref()?, self.backend.as_span()?))
    }

    fn upload_one(&self, g: &Gguf, m: &Matrix) -> Result<TensorId, BackendError> {
        if !self.backend.supports(m.info.ty) {
            return Err(BackendError::Unsupported(format!(
                "{} is {}",
                m.info.name, m.info.ty
            )));
        }
        let id = self.backend.upload(&m.info.name, m.weights(g))?;
        // The device copy serves this matrix; its file pages need not stay resident.
        g.release_pages(&m.info);
        Ok(id)
    }

    fn upload_layer(
        &self,
        g: &Gguf,
        w: &ModelWeights,
        il: usize,
    ) -> Result<LayerIds, BackendError> {
        let l = &w.layers[il];
        let mats = [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down];
        let mut ids = Vec::with_capacity(mats.len());
        for m in mats {
            match self.upload_one(g, m) {
                Ok(id) => ids.push(id),
                Err(e) => {
                    // Leave nothing of a half-placed layer behind.
                    ids.into_iter().for_each(|id| self.backend.free(id));
                    return Err(e);
                }
            }
        }
        Ok(LayerIds {
            qkv: [ids[0], ids[1], ids[2]],
            wo: ids[3],
            gate_up: [ids[4], ids[5]],
            down: ids[6],
        })
    }

    /// The layer's device tensors, unless it is on the CPU or the device failed.
    pub fn layer(&self, il: usize) -> Option<&LayerIds> {
        if self.failed.load(Ordering::Relaxed) {
            return None;
        }
        self.layers.get(il).and_then(|l| l.as_ref())
    }

    pub fn output(&self) -> Option<TensorId> {
        if self.failed.load(Ordering::Relaxed) {
            return None;
        }
        self.output
    }

    pub fn n_layers_placed(&self) -> usize {
        self.layers.iter().filter(|l| l.is_some()).count()
    }

    pub fn has_failed(&self) -> bool {
        self.failed.load(Ordering::Relaxed)
    }

    /// Records a device failure: the rest of the run uses the CPU.
    pub fn mark_failed(&self, err: &BackendError) {
        if !self.failed.swap(true, Ordering::Relaxed) {
            eprintln!("fish: GPU failed ({err}); continuing on the CPU");
        }
    }
}

/// Spans are on unless FISH_GPU_SPAN=0 (then stage 1 only).
fn spans_enabled() -> bool {
    !std::env::var("FISH_GPU_SPAN").is_ok_and(|v| matches!(v.trim(), "0" | "off" | "false" | "no"))
}

impl Drop for GpuPlacement {
    fn drop(&mut self) {
        if self.span.is_some() {
            if let Some(span) = self.backend.as_span() {
                span.span_end();
            }
        }
        for ids in self.layers.iter().flatten() {
            ids.all().into_iter().for_each(|id| self.backend.free(id));
        }
        if let Some(id) = self.output {
            self.backend.free(id);
        }
    }
}

/// FISH_GPU_VERBOSE=1: placement explains what it could not do.
fn verbose() -> bool {
    std::env::var("FISH_GPU_VERBOSE").is_ok_and(|v| v == "1")
}
