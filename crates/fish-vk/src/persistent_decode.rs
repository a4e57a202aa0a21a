//! Whole llama decode layers of one token in one dispatch
//! (shaders/persistent_decode_layer.comp, the `persistent_decode` bench):
//! the form a persistent span kernel would take, with a span layer's
//! semantics (norms, q/k/v, RoPE, the f16 KV store, attention, wo and the
//! residual, gate/up, SiLU, down and the residual) and a grid-wide barrier
//! between dependent phases, each workgroup's next weights loaded before it
//! sums the current ones. Q4_K weights only. Its time per layer compares
//! with a span's decode profile; its outputs are checked against a CPU
//! reference (tests/persistent_decode.rs). Nothing in the engine runs it
//! yet. The same step can also run as one dispatch per phase (the
//! `per_phase` field of `DecodeRun`), so the two forms compare on identical
//! code.

use crate::error::{Result, VkError};
use crate::gpu::Gpu;
use crate::kernels::{Dispatch, DispatchSync};
use crate::persistent_layer::q4_k_bytes;
use crate::pipeline::Params;
use crate::upload::TensorHandle;
use crate::weight_format::WeightFormat;
use fish_gguf::GgmlType;
use std::time::Duration;

/// Words before the KV region (the arrival counter, the failure word).
const HEADER_WORDS: usize = 64;
/// The longest staged input (MAX_IN in the shader).
const MAX_IN: usize = 14336;
/// Positions attended at most: the scores share the staged input's shared
/// memory (MAX_IN / 2 words).
const MAX_POSITIONS: usize = MAX_IN / 2;
/// The widest n_embd: a gate/up block then holds whole gate-up pairs.
const MAX_EMBD: usize = 8192;
/// The widest head (MAX_D).
const MAX_HEAD_DIM: usize = 128;
/// Slots start and end on 256-byte boundaries (words).
const SLOT_ALIGN: usize = 64;
/// Layers per dispatch at most.
pub const DECODE_PROBE_MAX_LAYERS: usize = 64;

/// A llama layer's shape for the kernel.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DecodeShape {
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_head: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// NeoX RoPE halves (i, i + head_dim / 2), else adjacent pairs.
    pub neox: bool,
    pub rope_base: f32,
    pub eps: f32,
}

impl DecodeShape {
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// Rows and input length of the q/k/v, wo, gate/up and down matrices of
    /// a layer copy, in their order in it (gate/up: gate and up rows
    /// alternating, row 2i gate i and row 2i + 1 up i).
    pub fn matrices(&self) -> [(usize, usize); 4] {
        let e = self.n_embd;
        [
            (e + 2 * self.kv_dim(), e),
            (e, self.n_head * self.head_dim),
            (2 * self.n_ff, e),
            (e, self.n_ff),
        ]
    }

    /// Bytes of one layer copy: the four Q4_K matrices, then the attention
    /// and feed-forward norms' n_embd f32 weights.
    pub fn copy_bytes(&self) -> usize {
        let matrices: usize = self
            .matrices()
            .iter()
            .map(|&(rows, n_in)| q4_k_bytes(rows, n_in))
            .sum();
        matrices + 8 * self.n_embd
    }

    /// Floats between vector slots: the longest phase output, in whole 256
    /// bytes (no cache line holds two slots).
    fn slot_stride(&self) -> usize {
        let longest = self.matrices().iter().map(|&(rows, _)| rows).max();
        longest.unwrap_or(0).next_multiple_of(SLOT_ALIGN)
    }

    /// The shapes the kernel takes: widths of whole 1024-value groups up to
    /// MAX_IN (as the layer probe), n_embd up to MAX_EMBD, attention as wide
    /// as the n_embd, heads
    /// of a multiple of 8 values up to MAX_HEAD_DIM, whole query groups.
    fn check(&self) -> Result<()> {
        let width = |n: usize| n >= 1024 && n.is_multiple_of(1024) && n <= MAX_IN;
        let ok = width(self.n_embd)
            && self.n_embd <= MAX_EMBD
            && width(self.n_ff)
            && self.n_kv_heads > 0
            && self.n_head.is_multiple_of(self.n_kv_heads)
            && self.n_head < 1 << 16
            && self.head_dim.is_multiple_of(8)
            && (2..=MAX_HEAD_DIM).contains(&self.head_dim)
            && self.n_head * self.head_dim == self.n_embd;
        if ok {
            Ok(())
        } else {
            Err(VkError::Input(format!(
                "the decode-layer kernel does not take {self:?}"
            )))
        }
    }
}

/// One run of the kernel: the shape, the layer copies the weights hold, the
/// layers to run, the workgroups, the token's position and the positions
/// each layer's KV region holds, whether the step is one dispatch or one
/// per phase, and whether its inputs (which it never reads before they are
/// written) come through L1-cached loads (`persistent_decode_layer_l1`) or
/// coherent ones.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DecodeRun {
    /// One dispatch per phase with pipeline barriers between them (the
    /// same code without grid-wide barriers, as spans record stages)
    /// instead of one dispatch for the step.
    pub per_phase: bool,
    pub l1_inputs: bool,
    pub shape: DecodeShape,
    pub copies: usize,
    pub layers: usize,
    pub groups: u32,
    pub pos: usize,
    pub kv_capacity: usize,
}

impl DecodeRun {
    /// Words of the kernel's buffer: the header, the KV regions, the slots.
    pub fn buffer_words(&self) -> usize {
        self.slot_word(self.layers, 1)
    }

    /// Where layer `l`'s f16 keys (pairs packed per word, position-major,
    /// kv_dim values per position) start; its values follow them.
    pub fn key_word(&self, l: usize, pos: usize) -> usize {
        HEADER_WORDS + l * self.kv_capacity * self.shape.kv_dim() + pos * self.shape.kv_dim() / 2
    }

    pub fn value_word(&self, l: usize, pos: usize) -> usize {
        self.key_word(l, pos) + self.kv_capacity * self.shape.kv_dim() / 2
    }

    /// Slot `k` of layer `l`: 0 its input x, 1 q | k | v, 2 the attention
    /// output, 3 x after wo, 4 gate | up; slot 0 of layer `layers` is the
    /// output.
    pub fn slot_word(&self, l: usize, k: usize) -> usize {
        self.slots0() + (5 * l + k) * self.shape.slot_stride()
    }

    /// The first slot's word, after the KV regions.
    fn slots0(&self) -> usize {
        (HEADER_WORDS + self.layers * self.kv_capacity * self.shape.kv_dim())
            .next_multiple_of(SLOT_ALIGN)
    }

    fn check(&self) -> Result<()> {
        self.shape.check()?;
        // The capacity first: buffer_words multiplies by it.
        if self.layers == 0
            || self.layers > DECODE_PROBE_MAX_LAYERS
            || self.groups == 0
            || self.copies == 0
            || self.kv_capacity > MAX_POSITIONS
            || self.pos >= self.kv_capacity
            || self.buffer_words() > u32::MAX as usize / 4
        {
            return Err(VkError::Input(format!(
                "the decode-layer kernel runs 1..={DECODE_PROBE_MAX_LAYERS} layers at a \
                 position below a KV capacity of at most {MAX_POSITIONS} ({self:?})"
            )));
        }
        Ok(())
    }
}

impl Gpu {
    /// The step's dispatches: one, or one per phase (`run.per_phase`), and
    /// how they are separated.
    fn decode_dispatches(
        &self,
        handle: TensorHandle,
        run: DecodeRun,
    ) -> Result<(Vec<Dispatch>, DispatchSync)> {
        run.check()?;
        let s = run.shape;
        let total = run.copies.saturating_mul(s.copy_bytes());
        if handle.ty() != WeightFormat::Ggml(GgmlType::Q4_K)
            || handle.n_in() != 256
            || q4_k_bytes(handle.n_out(), 256) < total
            || total > u32::MAX as usize
        {
            return Err(VkError::Input(format!(
                "the decode-layer kernel takes {} copies of {s:?} as Q4_K rows of 256 values \
                 ({:?} {}x{}), under 4 GiB",
                run.copies,
                handle.ty(),
                handle.n_in(),
                handle.n_out()
            )));
        }
        let weights = self.probe_weights(handle, "the decode-layer kernel")?;
        let module = if run.l1_inputs {
            "persistent_decode_layer_l1"
        } else {
            "persistent_decode_layer"
        };
        let pipeline = self.pipelines.get(&self.device, module, &[])?;
        // The shader's push constants (`Layer`), in the order of Params' fields.
        let params = Params {
            n_in: s.n_embd as u32,
            n_rows: s.n_ff as u32,
            n_tok: run.layers as u32,
            row_stride: run.copies as u32,
            y_stride: s.slot_stride() as u32,
            y_offset: run.pos as u32,
            groups_x: run.groups,
            accumulate: (s.n_head | s.n_kv_heads << 16) as u32,
            norm_off: s.head_dim as u32,
            norm_eps: s.eps,
            part_off: run.kv_capacity as u32,
            parts: s.rope_base.to_bits(),
            split: s.neox as u32,
            split_count_off: run.slots0() as u32,
            ..Params::default()
        };
        let dispatch = |phase_range: u32| Dispatch {
            pipeline,
            params: Params {
                split_part_off: phase_range,
                ..params
            },
            groups: (run.groups, 1),
            weights,
            up_weights: None,
        };
        if !run.per_phase {
            return Ok((vec![dispatch(0)], DispatchSync::None));
        }
        let phases = (0..5 * run.layers as u32)
            .map(|g| dispatch(g | (g + 1) << 16))
            .collect();
        Ok((phases, DispatchSync::EveryDispatch))
    }

    /// GPU time of one step through `run.layers` layers (zeroed buffer:
    /// the values are meaningless, the work is the same). Every workgroup
    /// must be resident at once; on a device that runs fewer together each
    /// wait lasts until it gives up, so only the time says so.
    pub fn time_persistent_decode(&self, handle: TensorHandle, run: DecodeRun) -> Result<Duration> {
        let (dispatches, sync) = self.decode_dispatches(handle, run)?;
        self.time_on_zeroed_x(&dispatches, sync, (run.buffer_words() * 4) as u64)
    }

    /// Runs one step on `buffer` (`run.buffer_words()` words: the input x in
    /// slot 0 of layer 0, the keys and values of positions before `run.pos`
    /// in the KV regions, the header zero) and returns the buffer after it.
    /// Fails when a wait gave up (the failure word).
    pub fn run_persistent_decode(
        &self,
        handle: TensorHandle,
        run: DecodeRun,
        buffer: &[u32],
    ) -> Result<Vec<u32>> {
        let (dispatches, sync) = self.decode_dispatches(handle, run)?;
        if buffer.len() != run.buffer_words() {
            return Err(VkError::Input(format!(
                "the decode-layer buffer has {} words, not {}",
                buffer.len(),
                run.buffer_words()
            )));
        }
        let values: Vec<f32> = buffer.iter().map(|&w| f32::from_bits(w)).collect();
        let out: Vec<u32> = self
            .run_in_place(&dispatches, sync, &values)?
            .iter()
            .map(|v| v.to_bits())
            .collect();
        if out[1] != 0 {
            return Err(VkError::Input(
                "a grid-wide wait of the decode-layer kernel gave up (workgroups not resident)"
                    .into(),
            ));
        }
        Ok(out)
    }
}
