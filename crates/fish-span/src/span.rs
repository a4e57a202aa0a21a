//! Stage 2 for the engine: fish-core's `SpanSpec` turned into a fish-vk
//! span (handles, RoPE tables computed as the CPU computes them), and the
//! `SpanBackend` calls mapped onto it.

use std::sync::MutexGuard;

use fish_core::backend::{BackendError, SpanBackend, SpanRow, SpanSpec};
use fish_core::model::ops::RopeAngles;
use fish_core::model::{Activation, ModelConfig, RopeStyle};
use fish_vk::{
    Span, SpanActivation, SpanDesc, SpanLayerDesc, SpanOutputDesc, SpanProfiling, SpanRope,
    SpanShape,
};

use crate::backend::{map_err, VulkanBackend};

/// For each position `0..n_ctx`, the (cos, sin) pairs of `RopeAngles`.
fn rope_table(n_ctx: usize, n_rot: usize, base: f32, freq_scale: f32) -> Vec<f32> {
    let mut table = Vec::with_capacity(n_ctx * n_rot);
    for pos in 0..n_ctx {
        let a = RopeAngles::new(pos, n_rot, base, freq_scale);
        for (c, s) in a.cos.iter().zip(&a.sin) {
            table.push(*c);
            table.push(*s);
        }
    }
    table
}

/// The span's dimensions for a model and context.
fn span_shape(cfg: &ModelConfig, n_ctx: usize) -> SpanShape {
    SpanShape {
        n_embd: cfg.n_embd,
        n_head: cfg.n_head,
        n_head_kv: cfg.n_head_kv,
        head_dim: cfg.head_dim,
        head_dim_v: cfg.head_dim_v,
        n_rot: cfg.n_rot,
        rope: match cfg.rope_style {
            RopeStyle::Adjacent => SpanRope::Adjacent,
            RopeStyle::Neox => SpanRope::Neox,
        },
        activation: match cfg.activation {
            Activation::SwiGlu => SpanActivation::SwiGlu,
            Activation::GeGlu => SpanActivation::GeGlu,
        },
        rms_eps: cfg.rms_eps,
        attn_scale: cfg.attn_scale,
        n_ctx,
    }
}

/// The engine's rows as the device's.
fn device_rows(rows: &[SpanRow]) -> Vec<fish_vk::span::SpanRow> {
    rows.iter()
        .map(|r| fish_vk::span::SpanRow {
            slot: r.slot,
            pos: r.pos,
        })
        .collect()
}

impl VulkanBackend {
    fn span_slot(&self) -> MutexGuard<'_, Option<Span>> {
        self.span.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `span N layers, KV M MB f16` while a span is open (and, once an
    /// attention wait for its q/k/v gave up, that it keeps the barrier).
    pub(crate) fn span_note(&self) -> Option<String> {
        self.span_slot().as_ref().map(|s| {
            let waits = match s.qkv_overlap_gave_up() {
                true => ", decode waits gave up: barriers after q/k/v and attention",
                false => "",
            };
            format!(
                "span {} layers, KV {} MB f16{waits}",
                s.n_layers(),
                s.kv_bytes() >> 20
            )
        })
    }

    /// Runs a forward at `pos0` on the span, refusing one that would leave
    /// a gap in the device KV.
    fn forward_at<T>(
        &self,
        pos0: usize,
        forward: impl FnOnce(&fish_vk::Gpu, &mut Span) -> Result<T, fish_vk::VkError>,
    ) -> Result<T, BackendError> {
        let mut slot = self.span_slot();
        let span = slot
            .as_mut()
            .ok_or_else(|| BackendError::Unsupported("no span".into()))?;
        if pos0 > span.kv_len() {
            return Err(BackendError::Unsupported(format!(
                "position {pos0} would leave a gap after the {} positions in the device KV",
                span.kv_len()
            )));
        }
        forward(self.gpu(), span).map_err(map_err)
    }

    /// Runs `f` on the open span (Unsupported when none is open).
    fn with_span<T>(
        &self,
        f: impl FnOnce(&fish_vk::Gpu, &mut Span) -> Result<T, fish_vk::VkError>,
    ) -> Result<T, BackendError> {
        let mut slot = self.span_slot();
        let span = slot
            .as_mut()
            .ok_or_else(|| BackendError::Unsupported("no span".into()))?;
        f(self.gpu(), span).map_err(map_err)
    }

    fn create_span(&self, spec: &SpanSpec<'_>) -> Result<Span, BackendError> {
        let cfg = spec.cfg;
        if spec.layers.is_empty() || spec.first_layer + spec.layers.len() != cfg.n_layer {
            return Err(BackendError::Unsupported(format!(
                "span of {} layers from layer {} of {}",
                spec.layers.len(),
                spec.first_layer,
                cfg.n_layer
            )));
        }
        let n_ctx = spec.n_ctx;
        let swa: Vec<bool> = (0..spec.layers.len())
            .map(|i| cfg.is_swa_layer(spec.first_layer + i))
            .collect();
        let mut tables = vec![rope_table(
            n_ctx,
            cfg.n_rot,
            cfg.rope_base,
            cfg.rope_freq_scale,
        )];
        if swa.iter().any(|&s| s) {
            tables.push(rope_table(
                n_ctx,
                cfg.n_rot,
                cfg.rope_base_swa,
                cfg.rope_freq_scale,
            ));
        }
        let mut layers = Vec::with_capacity(spec.layers.len());
        for (l, &is_swa) in spec.layers.iter().zip(&swa) {
            let ids = l.ids;
            let [q, k, v] = ids.qkv;
            let [g, u] = ids.gate_up;
            layers.push(SpanLayerDesc {
                qkv: [self.handle(q)?, self.handle(k)?, self.handle(v)?],
                wo: self.handle(ids.wo)?,
                gate_up: [self.handle(g)?, self.handle(u)?],
                down: self.handle(ids.down)?,
                attn_norm: l.attn_norm,
                bq: l.bq,
                bk: l.bk,
                bv: l.bv,
                q_norm: l.q_norm,
                k_norm: l.k_norm,
                post_attn_norm: l.post_attn_norm,
                ffn_norm: l.ffn_norm,
                post_ffn_norm: l.post_ffn_norm,
                rope_table: usize::from(is_swa),
                window: if is_swa { cfg.sliding_window } else { 0 },
            });
        }
        let desc = SpanDesc {
            shape: span_shape(cfg, n_ctx),
            layers,
            rope_tables: tables.iter().map(|t| &t[..]).collect(),
            output: match &spec.output {
                Some(o) => Some(SpanOutputDesc {
                    norm: o.norm,
                    weight: self.handle(o.id)?,
                }),
                None => None,
            },
        };
        self.gpu()
            .span_create(&desc, SpanProfiling::from_env())
            .map_err(map_err)
    }
}

impl SpanBackend for VulkanBackend {
    fn span_begin(&self, spec: &SpanSpec<'_>) -> Result<u64, BackendError> {
        self.span_end();
        let span = self.create_span(spec)?;
        let bytes = span.device_bytes();
        *self.span_slot() = Some(span);
        Ok(bytes)
    }

    fn span_kv_reserve(&self, n_pos: usize) -> Result<(), BackendError> {
        let mut slot = self.span_slot();
        let span = slot
            .as_mut()
            .ok_or_else(|| BackendError::Unsupported("no span".into()))?;
        self.gpu().span_reserve(span, n_pos).map_err(map_err)
    }

    fn span_kv_len(&self) -> usize {
        self.span_slot().as_ref().map_or(0, |s| s.kv_len())
    }

    fn span_kv_truncate(&self, n: usize) {
        if let Some(s) = self.span_slot().as_mut() {
            s.kv_truncate(n);
        }
    }

    fn span_hold(
        &self,
        cfg: &ModelConfig,
        n_layers: usize,
        n_ctx: usize,
        with_output: bool,
    ) -> Result<u64, BackendError> {
        self.span_release_hold();
        let n_layers = n_layers.min(cfg.n_layer);
        let swa = (cfg.n_layer - n_layers..cfg.n_layer).any(|il| cfg.is_swa_layer(il));
        let footprint = fish_vk::SpanFootprint {
            shape: span_shape(cfg, n_ctx),
            n_layers,
            n_ff: cfg.n_ff,
            rope_tables: 1 + usize::from(swa),
            n_vocab: with_output.then_some(cfg.n_vocab),
        };
        let bytes = footprint.device_bytes(self.gpu());
        let held = self.gpu().reserve(bytes).map_err(map_err)?;
        *self.span_hold.lock().unwrap_or_else(|e| e.into_inner()) = Some(held);
        Ok(bytes)
    }

    fn span_release_hold(&self) {
        let held = self
            .span_hold
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(r) = held {
            self.gpu().release_reservation(r);
        }
    }

    fn span_forward(&self, x: &mut [f32], n_tok: usize, pos0: usize) -> Result<(), BackendError> {
        self.forward_at(pos0, |gpu, span| gpu.span_forward(span, x, n_tok, pos0))
    }

    fn span_max_logit_rows(&self) -> usize {
        self.span_slot().as_ref().map_or(0, |s| s.max_logit_rows())
    }

    fn span_forward_logits(
        &self,
        x: &[f32],
        n_tok: usize,
        pos0: usize,
        rows: usize,
    ) -> Result<Vec<f32>, BackendError> {
        self.forward_at(pos0, |gpu, span| {
            gpu.span_forward_logits(span, x, n_tok, pos0, rows)
        })
    }

    fn span_max_batch_rows(&self) -> usize {
        self.span_slot().as_ref().map_or(0, |s| s.max_batch_rows())
    }

    fn span_kv_slot_len(&self, slot: usize) -> usize {
        self.span_slot().as_ref().map_or(0, |s| s.kv_slot_len(slot))
    }

    fn span_kv_slot_reserve(&self, slot: usize, n_pos: usize) -> Result<(), BackendError> {
        self.with_span(|gpu, span| gpu.span_reserve_slot(span, slot, n_pos))
    }

    fn span_kv_slot_truncate(&self, slot: usize, n: usize) {
        if let Some(s) = self.span_slot().as_mut() {
            s.kv_slot_truncate(slot, n);
        }
    }

    fn span_forward_batch(&self, x: &mut [f32], rows: &[SpanRow]) -> Result<(), BackendError> {
        let rows = device_rows(rows);
        self.with_span(|gpu, span| gpu.span_forward_rows(span, x, &rows))
    }

    fn span_forward_batch_logits(
        &self,
        x: &[f32],
        rows: &[SpanRow],
        logit_rows: usize,
    ) -> Result<Vec<f32>, BackendError> {
        let rows = device_rows(rows);
        self.with_span(|gpu, span| gpu.span_forward_rows_logits(span, x, &rows, logit_rows))
    }

    fn span_end(&self) {
        if let Some(span) = self.span_slot().take() {
            self.gpu().span_destroy(span);
        }
    }

    fn span_profile(&self) -> Option<String> {
        self.span_slot().as_ref().and_then(|s| s.profile())
    }
}
