//! The span's work arena: the residual stream x for every token of a
//! forward, the per-chunk buffers between kernels, and the host-visible
//! buffers that carry x in and out.

use super::attention_split::split_scratch_bytes;
use super::desc::{LayerTensors, SpanShape};
use super::record::INT8_CHUNK_MAX_TOKENS;
use super::span_chunk_tokens;
use super::step::{STEP_DEVICE_WORDS, STEP_UPLOAD_WORDS};
use crate::buffer::{Buffer, MemoryKind};
use crate::error::Result;
use crate::gpu::Gpu;
use crate::int8_dot::int8_token_bytes;
use crate::kernels::MATVEC_MAX_TOKENS;
use crate::split_k::ScratchNeed;

/// Tokens the residual stream is first sized for (it grows on demand).
const INITIAL_TOKENS: usize = 256;

pub(crate) struct Arena {
    /// Residual stream: `x_tokens` x n_embd f32.
    pub x: Buffer,
    pub x_tokens: usize,
    /// Normed input of the q/k/v and gate/up matmuls: chunk x n_embd, then
    /// room for the deferred norms' sums of squares (`norm_parts_offset`).
    pub xn: Buffer,
    /// q | k | v of a chunk, each block token-major.
    pub qkv: Buffer,
    /// Attention output of a chunk: chunk x n_head * head_dim_v.
    pub attn: Buffer,
    /// wo and down outputs of a chunk: chunk x n_embd.
    pub o: Buffer,
    /// gate | up of a chunk; the activation writes into the gate half.
    pub gate_up: Buffer,
    /// A matvec input quantised for the int8 matvec (shaders/int8_acts.glsl)
    /// for chunks of up to INT8_CHUNK_MAX_TOKENS tokens: xn, written by the
    /// norm for q/k/v and gate/up, the attention output, written by the
    /// attention for wo once q/k/v has read xn, and act(gate) * up, written
    /// by the activation for down once gate/up has. Sized for the widest.
    pub xn_int8: Buffer,
    /// act(gate) * up of a chunk in f16 (chunk x n_ff halves), written by
    /// the activation for a down projection on the cooperative prefill
    /// kernel (`MatmulInput::F16`; the activation's f32 result stays in
    /// place in `gate_up`, which it is still reading); in int8 chunks the
    /// same product quantised (int8_acts.glsl), written by a gate/up matvec
    /// with the activation in its epilogue (`Kernel::MatvecInt8GateUp`,
    /// which is still reading xn_int8). Sized for both.
    pub h16: Buffer,
    /// Host-visible copies of x (in and out), sized like `x`.
    pub upload: Buffer,
    pub readback: Buffer,
    /// Where the forward's tokens sit (span/step.rs; read by RoPE and
    /// attention), copied from `step_upload` at the start of every submit,
    /// then the overlapped decode attention's arrival words
    /// (`QKV_ARRIVALS_AT`).
    pub step: Buffer,
    pub step_upload: Buffer,
    /// The batch tile's split scratch (split_k.rs; binding 3 of the plain
    /// matmul sets), its arrival counters zeroed at the start of every submit.
    pub split: Buffer,
    pub split_counter_bytes: u64,
    /// The key-split attention's scratch (attention_split.rs: arrival
    /// counters, zeroed at the start of every submit, then partials).
    pub attn_split: Buffer,
    pub attn_split_counter_bytes: u64,
    /// The narrow int8 gate/up's scratch (`Kernel::MatvecInt8GateUpNarrow`,
    /// binding 4 of the gate/up epilogue sets): one arrival counter per
    /// 32-row block, zeroed at the start of every submit, then act(gate) *
    /// up of up to INT8_CHUNK_MAX_TOKENS tokens.
    pub gate_up_arrivals: Buffer,
    pub gate_up_arrival_counter_bytes: u64,
}

/// Words of the narrow gate/up's arrival counters for rows of `n_ff`
/// values: one per 32-row block, whole vec4s (shaders/matvec_i8.comp
/// `act_at`, which finds the scratch past them).
fn gate_up_counter_words(n_ff: usize) -> usize {
    (n_ff / 32).next_multiple_of(4)
}

/// Float offset in xn of the sums of squares a `Kernel::MatvecResNorm`
/// leaves for the deferred norm after it, past a chunk of normed rows:
/// MATVEC_MAX_TOKENS tokens of up to n_embd sums (one per workgroup of at
/// least one row), each token's padded to whole vec4s (shaders/matvec.comp).
pub(crate) fn norm_parts_offset(shape: &SpanShape) -> u32 {
    (span_chunk_tokens() * shape.n_embd).next_multiple_of(4) as u32
}

fn f32_bytes(n: usize) -> u64 {
    (n as u64 * 4).next_multiple_of(16)
}

/// The arena's buffers in allocation order: (f32 values, memory kind).
fn sizes(shape: &SpanShape, n_ff: usize) -> [(usize, MemoryKind); 13] {
    let c = span_chunk_tokens();
    let int8_width = shape.n_embd.max(n_ff).max(shape.attn_dim());
    let int8_values = (INT8_CHUNK_MAX_TOKENS * int8_token_bytes(int8_width)).div_ceil(4);
    [
        (INITIAL_TOKENS * shape.n_embd, MemoryKind::Device),
        (
            norm_parts_offset(shape) as usize
                + MATVEC_MAX_TOKENS * shape.n_embd.next_multiple_of(4),
            MemoryKind::Device,
        ),
        (
            c * (shape.q_dim() + shape.k_dim() + shape.v_dim()),
            MemoryKind::Device,
        ),
        (c * shape.attn_dim(), MemoryKind::Device),
        (c * shape.n_embd, MemoryKind::Device),
        (c * 2 * n_ff, MemoryKind::Device),
        (int8_values, MemoryKind::Device),
        (
            (c * n_ff)
                .div_ceil(2)
                .max((INT8_CHUNK_MAX_TOKENS * int8_token_bytes(n_ff)).div_ceil(4)),
            MemoryKind::Device,
        ),
        (INITIAL_TOKENS * shape.n_embd, MemoryKind::Upload),
        (INITIAL_TOKENS * shape.n_embd, MemoryKind::Readback),
        (STEP_DEVICE_WORDS, MemoryKind::Device),
        (STEP_UPLOAD_WORDS, MemoryKind::Upload),
        (
            gate_up_counter_words(n_ff) + INT8_CHUNK_MAX_TOKENS * n_ff,
            MemoryKind::Device,
        ),
    ]
}

/// The split scratch of the span's forwards on `gpu` (batch tile and wide
/// prefill tile).
fn split_scratch(gpu: &Gpu) -> ScratchNeed {
    gpu.span_split_need()
}

impl Arena {
    /// Device bytes `new` allocates on `gpu` for feed-forward width `n_ff`,
    /// the split scratch included (sized for the batch tile the device's
    /// knobs pick, as `new` sizes it).
    pub fn initial_device_bytes(gpu: &Gpu, shape: &SpanShape, n_ff: usize) -> u64 {
        sizes(shape, n_ff)
            .iter()
            .filter(|(_, kind)| matches!(kind, MemoryKind::Device))
            .map(|&(n, _)| f32_bytes(n))
            .sum::<u64>()
            + split_scratch(gpu).bytes
            + split_scratch_bytes(shape).1
    }

    pub fn new(gpu: &Gpu, shape: &SpanShape, layers: &[LayerTensors]) -> Result<Arena> {
        let n_ff = layers.iter().map(|l| l.n_ff).max().unwrap_or(0);
        let split = split_scratch(gpu);
        let (attn_counter_bytes, attn_split_bytes) = split_scratch_bytes(shape);
        let sizes = sizes(shape, n_ff)
            .into_iter()
            .map(|(n, kind)| (f32_bytes(n), kind))
            .chain([
                (split.bytes, MemoryKind::Device),
                (attn_split_bytes, MemoryKind::Device),
            ]);
        let mut bufs = Vec::new();
        for (bytes, kind) in sizes {
            match gpu.alloc(bytes, kind) {
                Ok(b) => bufs.push(b),
                Err(e) => {
                    bufs.into_iter().for_each(|b| gpu.release(b));
                    return Err(e);
                }
            }
        }
        let mut it = bufs.into_iter();
        let mut next = || it.next().expect("one buffer per size");
        Ok(Arena {
            x: next(),
            x_tokens: INITIAL_TOKENS,
            xn: next(),
            qkv: next(),
            attn: next(),
            o: next(),
            gate_up: next(),
            xn_int8: next(),
            h16: next(),
            upload: next(),
            readback: next(),
            step: next(),
            step_upload: next(),
            gate_up_arrivals: next(),
            gate_up_arrival_counter_bytes: 4 * gate_up_counter_words(n_ff) as u64,
            split: next(),
            split_counter_bytes: split.counter_bytes,
            attn_split: next(),
            attn_split_counter_bytes: attn_counter_bytes,
        })
    }

    /// Makes x and its host copies hold `n_tok` tokens; true when the device
    /// buffer was replaced (descriptor sets binding it are then stale).
    pub fn fit_tokens(&mut self, gpu: &Gpu, shape: &SpanShape, n_tok: usize) -> Result<bool> {
        if n_tok <= self.x_tokens {
            return Ok(false);
        }
        let bytes = f32_bytes(n_tok * shape.n_embd);
        let x = gpu.alloc(bytes, MemoryKind::Device)?;
        let upload = match gpu.alloc(bytes, MemoryKind::Upload) {
            Ok(b) => b,
            Err(e) => {
                gpu.release(x);
                return Err(e);
            }
        };
        let readback = match gpu.alloc(bytes, MemoryKind::Readback) {
            Ok(b) => b,
            Err(e) => {
                gpu.release(x);
                gpu.release(upload);
                return Err(e);
            }
        };
        gpu.release(std::mem::replace(&mut self.x, x));
        gpu.release(std::mem::replace(&mut self.upload, upload));
        gpu.release(std::mem::replace(&mut self.readback, readback));
        self.x_tokens = n_tok;
        Ok(true)
    }

    /// Device bytes (the host-visible copies are not counted).
    pub fn bytes(&self) -> u64 {
        [
            &self.x,
            &self.xn,
            &self.qkv,
            &self.attn,
            &self.o,
            &self.gate_up,
            &self.xn_int8,
            &self.h16,
            &self.step,
            &self.split,
            &self.attn_split,
            &self.gate_up_arrivals,
        ]
        .iter()
        .map(|b| b.size)
        .sum()
    }

    pub fn release(self, gpu: &Gpu) {
        for b in [
            self.x,
            self.xn,
            self.qkv,
            self.attn,
            self.o,
            self.gate_up,
            self.xn_int8,
            self.h16,
            self.upload,
            self.readback,
            self.step,
            self.step_upload,
            self.split,
            self.attn_split,
            self.gate_up_arrivals,
        ] {
            gpu.release(b);
        }
    }
}
