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

    /// The most tokens of one matmul whose per-token results equal those of
    /// one-token matmuls bit for bit (beyond it a different kernel takes
    /// over); speculative verification stays within it so that greedy
    /// output is exactly plain greedy.
    fn exact_batch_tokens(&self) -> usize {
        usize::MAX
    }

    /// The stage-2 interface, for backends that run whole layer spans.
    fn as_span(&self) -> Option<&dyn SpanBackend> {
        None
    }
}

/// The norm vectors and biases of one layer, for a device span (the
/// matrices are already resident as `LayerIds`).
pub struct SpanLayer<'a> {
    pub ids: &'a crate::model::gpu::LayerIds,
    pub attn_norm: &'a [f32],
    pub bq: Option<&'a [f32]>,
    pub bk: Option<&'a [f32]>,
    pub bv: Option<&'a [f32]>,
    pub q_norm: Option<&'a [f32]>,
    pub k_norm: Option<&'a [f32]>,
    pub post_attn_norm: Option<&'a [f32]>,
    pub ffn_norm: &'a [f32],
    pub post_ffn_norm: Option<&'a [f32]>,
}

/// Everything a backend needs to run layers `first_layer..` of a model in
/// one command buffer per forward (stage 2).
pub struct SpanSpec<'a> {
    pub cfg: &'a crate::model::ModelConfig,
    pub first_layer: usize,
    /// Layers `first_layer..cfg.n_layer`, in order.
    pub layers: Vec<SpanLayer<'a>>,
    /// The context size: the device KV never grows past it.
    pub n_ctx: usize,
    /// The model's output (final norm, resident projection), for backends
    /// that run it in the span's submit (`span_forward_logits`).
    pub output: Option<SpanOutput<'a>>,
}

/// The final norm and the resident output projection.
pub struct SpanOutput<'a> {
    pub norm: &'a [f32],
    pub id: TensorId,
}

/// One row of a batched span forward: a token of the sequence held in device
/// KV slot `slot`, at position `pos` of that sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpanRow {
    pub slot: usize,
    pub pos: usize,
}

/// Stage 2: a contiguous range of layers resident on the device with an f16
/// KV cache. Backends without spans keep the defaults (unsupported), and the
/// engine uses stage 1.
pub trait SpanBackend: ComputeBackend {
    /// Prepares the span: norms/biases/RoPE table uploaded once, work arena
    /// and an initial KV allocated. Returns the device bytes it reserved.
    fn span_begin(&self, spec: &SpanSpec<'_>) -> Result<u64, BackendError>;

    /// Makes room for `n_pos` positions in the device KV (grows on demand).
    fn span_kv_reserve(&self, n_pos: usize) -> Result<(), BackendError>;

    /// Positions held by the device KV.
    fn span_kv_len(&self) -> usize;

    /// Keeps positions `< n`.
    fn span_kv_truncate(&self, n: usize);

    /// Holds the device memory a span over the last `n_layers` layers of
    /// `cfg` will need (parameters, work arena, first KV, logits with
    /// `with_output`) while the layers are being placed, so that the span
    /// is never what no longer fits; `span_release_hold` hands it back just
    /// before `span_begin`. The default holds nothing.
    fn span_hold(
        &self,
        cfg: &crate::model::ModelConfig,
        n_layers: usize,
        n_ctx: usize,
        with_output: bool,
    ) -> Result<u64, BackendError> {
        let _ = (cfg, n_layers, n_ctx, with_output);
        Ok(0)
    }

    /// Releases what `span_hold` holds (nothing when it holds nothing).
    fn span_release_hold(&self) {}

    /// Runs the span on `n_tok` tokens at positions `pos0..` in one submit:
    /// `x` (n_tok x n_embd residual stream) in, the span's output out. Refused
    /// when `pos0` would leave a gap in the device KV. On error `x` is untouched.
    fn span_forward(&self, x: &mut [f32], n_tok: usize, pos0: usize) -> Result<(), BackendError>;

    /// The most rows of logits `span_forward_logits` returns; 0 when the
    /// span does not run the model's output.
    fn span_max_logit_rows(&self) -> usize {
        0
    }

    /// `span_forward`, then the output in the same submit: the logits
    /// (`rows` x n_vocab) of the last `rows` of the `n_tok` tokens.
    fn span_forward_logits(
        &self,
        x: &[f32],
        n_tok: usize,
        pos0: usize,
        rows: usize,
    ) -> Result<Vec<f32>, BackendError> {
        let _ = (x, n_tok, pos0, rows);
        Err(BackendError::Unsupported(
            "this backend's spans do not run the output".into(),
        ))
    }

    /// The most rows of several slots one `span_forward_batch` takes (one
    /// slot's consecutive rows, a prompt, may be any number); 0 when the
    /// backend's device KV holds only one sequence (slot 0).
    fn span_max_batch_rows(&self) -> usize {
        0
    }

    /// Positions held by device KV slot `slot`. Slot 0 is the sequence of
    /// `span_forward`; a slot not allocated yet holds none.
    fn span_kv_slot_len(&self, slot: usize) -> usize {
        if slot == 0 {
            self.span_kv_len()
        } else {
            0
        }
    }

    /// Makes room for `n_pos` positions in KV slot `slot` (allocating the
    /// slots up to it). Refused with `OutOfMemory` when the budget cannot
    /// take it; the KV is then unchanged.
    fn span_kv_slot_reserve(&self, slot: usize, n_pos: usize) -> Result<(), BackendError> {
        if slot == 0 {
            self.span_kv_reserve(n_pos)
        } else {
            Err(BackendError::Unsupported(
                "this backend's span holds one sequence".into(),
            ))
        }
    }

    /// Keeps positions `< n` of KV slot `slot`; the other slots are untouched.
    fn span_kv_slot_truncate(&self, slot: usize, n: usize) {
        if slot == 0 {
            self.span_kv_truncate(n);
        }
    }

    /// A batched forward in one submit: row `b` of `x` (rows.len() x n_embd)
    /// is a token of slot `rows[b].slot` at position `rows[b].pos`; `x`
    /// receives the span's output. One matmul per weight serves all rows;
    /// RoPE, the KV store and attention use each row's slot and position.
    /// A slot's rows are consecutive positions, the first leaving no gap in
    /// the slot. On error `x` is untouched and every slot keeps at most the
    /// positions before its first row.
    fn span_forward_batch(&self, x: &mut [f32], rows: &[SpanRow]) -> Result<(), BackendError> {
        let _ = (x, rows);
        Err(BackendError::Unsupported(
            "this backend's span holds one sequence".into(),
        ))
    }

    /// `span_forward_batch`, then the output in the same submit: the logits
    /// (`logit_rows` x n_vocab) of the last `logit_rows` rows (at most
    /// `span_max_logit_rows`).
    fn span_forward_batch_logits(
        &self,
        x: &[f32],
        rows: &[SpanRow],
        logit_rows: usize,
    ) -> Result<Vec<f32>, BackendError> {
        let _ = (x, rows, logit_rows);
        Err(BackendError::Unsupported(
            "this backend's span holds one sequence".into(),
        ))
    }

    /// Releases the span's KV, arena and parameters.
    fn span_end(&self);

    /// The per-stage share of span time from the last forward, when profiling
    /// (FISH_GPU_PROFILE=2) is on.
    fn span_profile(&self) -> Option<String>;
}
