//! What a span is made of, as the caller describes it: the model's
//! dimensions, and per layer the resident matrices and the small vectors.

use crate::error::{Result, VkError};
use crate::upload::TensorHandle;

/// How RoPE pairs the elements of a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpanRope {
    /// Pairs (2i, 2i+1).
    Adjacent,
    /// Pairs (i, i + n_rot/2).
    Neox,
}

/// The gate activation of the feed-forward block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpanActivation {
    /// silu(gate) * up.
    SwiGlu,
    /// gelu_tanh(gate) * up.
    GeGlu,
}

/// The dimensions shared by every layer of the span.
#[derive(Clone, Debug)]
pub struct SpanShape {
    pub n_embd: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub head_dim_v: usize,
    /// Rotated dimensions per head (even, at most head_dim).
    pub n_rot: usize,
    pub rope: SpanRope,
    pub activation: SpanActivation,
    pub rms_eps: f32,
    pub attn_scale: f32,
    /// The context: the KV never grows past it and the RoPE tables cover it.
    pub n_ctx: usize,
}

impl SpanShape {
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }
    pub fn k_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }
    pub fn v_dim(&self) -> usize {
        self.n_head_kv * self.head_dim_v
    }
    /// Width of the attention output (the input of wo).
    pub fn attn_dim(&self) -> usize {
        self.n_head * self.head_dim_v
    }
}

/// One layer: its resident matrices and its vectors (f32, host memory).
pub struct SpanLayerDesc<'a> {
    pub qkv: [TensorHandle; 3],
    pub wo: TensorHandle,
    pub gate_up: [TensorHandle; 2],
    pub down: TensorHandle,
    pub attn_norm: &'a [f32],
    pub bq: Option<&'a [f32]>,
    pub bk: Option<&'a [f32]>,
    pub bv: Option<&'a [f32]>,
    pub q_norm: Option<&'a [f32]>,
    pub k_norm: Option<&'a [f32]>,
    pub post_attn_norm: Option<&'a [f32]>,
    pub ffn_norm: &'a [f32],
    pub post_ffn_norm: Option<&'a [f32]>,
    /// Index into `SpanDesc::rope_tables`.
    pub rope_table: usize,
    /// Sliding window in positions (0: none).
    pub window: usize,
}

/// The model's output (final norm and projection), run in the span's command
/// buffer after its last layer so that a forward returns logits in one
/// submit instead of reading x back for a second one.
pub struct SpanOutputDesc<'a> {
    pub norm: &'a [f32],
    /// The resident output projection (n_embd -> n_vocab).
    pub weight: TensorHandle,
}

/// A whole span.
pub struct SpanDesc<'a> {
    pub shape: SpanShape,
    pub layers: Vec<SpanLayerDesc<'a>>,
    /// Present when the span ends at the model's last layer and the output
    /// projection is resident.
    pub output: Option<SpanOutputDesc<'a>>,
    /// Per table, for each position `0..n_ctx`, `n_rot / 2` (cos, sin) pairs:
    /// the caller computes them exactly as its CPU RoPE does.
    pub rope_tables: Vec<&'a [f32]>,
}

/// The matrices of one layer as the span records them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LayerTensors {
    pub qkv: [TensorHandle; 3],
    pub wo: TensorHandle,
    pub gate_up: [TensorHandle; 2],
    pub down: TensorHandle,
    pub rope_table: usize,
    pub window: usize,
    pub n_ff: usize,
}

/// The largest k/v row the RoPE kernel stages (shaders/span_rope.comp).
const MAX_KV_DIM: usize = 4096;
/// The largest head the attention kernel takes (shaders/span_attention.comp).
const MAX_HEAD_DIM: usize = 256;

impl SpanDesc<'_> {
    /// Checks every size against the kernels' limits and the matrices'
    /// shapes; returns the per-layer tensors.
    pub(crate) fn validate(&self) -> Result<Vec<LayerTensors>> {
        let s = &self.shape;
        let bad = |m: String| Err(VkError::Input(m));
        if self.layers.is_empty() {
            return bad("a span needs at least one layer".into());
        }
        if s.n_head == 0 || s.n_head_kv == 0 || !s.n_head.is_multiple_of(s.n_head_kv) {
            return bad(format!("{} heads over {} kv heads", s.n_head, s.n_head_kv));
        }
        if s.head_dim == 0 || !s.head_dim.is_multiple_of(2) || s.head_dim > MAX_HEAD_DIM {
            return bad(format!(
                "head width {} (even, <= {MAX_HEAD_DIM})",
                s.head_dim
            ));
        }
        if s.head_dim_v == 0 || !s.head_dim_v.is_multiple_of(2) || s.head_dim_v > MAX_HEAD_DIM {
            return bad(format!("value head width {}", s.head_dim_v));
        }
        if !s.n_rot.is_multiple_of(2) || s.n_rot > s.head_dim || s.n_rot == 0 {
            return bad(format!("{} rotated dims of {}", s.n_rot, s.head_dim));
        }
        if s.k_dim() > MAX_KV_DIM || s.v_dim() > MAX_KV_DIM {
            return bad(format!("k/v rows of {}/{}", s.k_dim(), s.v_dim()));
        }
        if s.n_ctx == 0 || s.n_ctx > u32::MAX as usize / (s.k_dim().max(s.v_dim()) * 2) {
            return bad(format!("context of {} positions", s.n_ctx));
        }
        let table_len = s.n_ctx * s.n_rot;
        if let Some(t) = self.rope_tables.iter().find(|t| t.len() != table_len) {
            return bad(format!(
                "RoPE table of {} values, expected {table_len}",
                t.len()
            ));
        }
        if let Some(o) = &self.output {
            if o.norm.len() != s.n_embd || o.weight.n_in() != s.n_embd {
                return Err(VkError::Shape(format!(
                    "span output: norm of {} and rows of {} for a width of {}",
                    o.norm.len(),
                    o.weight.n_in(),
                    s.n_embd
                )));
            }
        }
        self.layers
            .iter()
            .enumerate()
            .map(|(i, l)| self.validate_layer(i, l))
            .collect()
    }

    fn validate_layer(&self, i: usize, l: &SpanLayerDesc<'_>) -> Result<LayerTensors> {
        let s = &self.shape;
        let shape_err = |what: &str| Err(VkError::Shape(format!("span layer {i}: {what}")));
        let fits =
            |h: &TensorHandle, n_in: usize, n_out: usize| h.n_in() == n_in && h.n_out() == n_out;
        let [q, k, v] = &l.qkv;
        if !fits(q, s.n_embd, s.q_dim())
            || !fits(k, s.n_embd, s.k_dim())
            || !fits(v, s.n_embd, s.v_dim())
        {
            return shape_err("q/k/v shapes");
        }
        if !fits(&l.wo, s.attn_dim(), s.n_embd) {
            return shape_err("wo shape");
        }
        let n_ff = l.gate_up[0].n_out();
        if !fits(&l.gate_up[0], s.n_embd, n_ff)
            || !fits(&l.gate_up[1], s.n_embd, n_ff)
            || !fits(&l.down, n_ff, s.n_embd)
        {
            return shape_err("feed-forward shapes");
        }
        let vec_ok = |v: Option<&[f32]>, n: usize| v.is_none_or(|v| v.len() == n);
        if l.attn_norm.len() != s.n_embd
            || l.ffn_norm.len() != s.n_embd
            || !vec_ok(l.post_attn_norm, s.n_embd)
            || !vec_ok(l.post_ffn_norm, s.n_embd)
            || !vec_ok(l.bq, s.q_dim())
            || !vec_ok(l.bk, s.k_dim())
            || !vec_ok(l.bv, s.v_dim())
            || !vec_ok(l.q_norm, s.head_dim)
            || !vec_ok(l.k_norm, s.head_dim)
        {
            return shape_err("norm or bias length");
        }
        if l.rope_table >= self.rope_tables.len() {
            return shape_err("RoPE table index");
        }
        Ok(LayerTensors {
            qkv: l.qkv,
            wo: l.wo,
            gate_up: l.gate_up,
            down: l.down,
            rope_table: l.rope_table,
            window: l.window,
            n_ff,
        })
    }
}
