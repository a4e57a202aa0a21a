//! The model's output inside a span forward: the final norm of the last rows
//! of x and the output projection, with the logits read back by the same
//! submit. Saves the second submit, the staging of x and the per-call
//! descriptor sets of a separate output matmul (~0.4 ms of a decode step on
//! the H200, measured with FISH_GPU_PROFILE=2).
//!
//! The projection writes its logits straight into host-visible memory, so
//! that no copy ends the forward: on the H100 a decode step's GPU time went
//! from 0.814-0.817 to 0.807-0.808 ms (llama-1b shape, 513 KB of logits)
//! and from 2.857-2.860 to 2.844 ms (llama-8b). `FISH_GPU_LOGITS_DIRECT=0`
//! keeps them in device memory and copies them at the end instead.

use super::SPAN_CHUNK_TOKENS;
use crate::buffer::{Buffer, MemoryKind};
use crate::error::{Result, VkError};
use crate::gpu::Gpu;
use crate::upload::TensorHandle;

/// The output projection and the buffers its logits go through.
pub(crate) struct SpanOutput {
    pub weight: TensorHandle,
    /// Device logits, `rows` x n_vocab f32, copied into `readback` at the
    /// end of a forward; None where the projection writes `readback` itself.
    pub logits: Option<Buffer>,
    /// The host-visible logits.
    pub readback: Buffer,
    /// Rows of logits the buffers hold.
    pub rows: usize,
}

fn logits_bytes(weight: &TensorHandle, rows: usize) -> u64 {
    (rows as u64 * weight.n_out() as u64 * 4).next_multiple_of(16)
}

/// Whether the projection writes the host-visible logits itself: unless
/// `FISH_GPU_LOGITS_DIRECT=0`.
fn logits_direct() -> bool {
    std::env::var("FISH_GPU_LOGITS_DIRECT").as_deref() != Ok("0")
}

impl SpanOutput {
    /// Buffers for one row of logits (decode); `fit_rows` grows them.
    pub fn new(gpu: &Gpu, weight: TensorHandle) -> Result<SpanOutput> {
        let (logits, readback) = Self::buffers(gpu, &weight, 1)?;
        Ok(SpanOutput {
            weight,
            logits,
            readback,
            rows: 1,
        })
    }

    fn buffers(gpu: &Gpu, weight: &TensorHandle, rows: usize) -> Result<(Option<Buffer>, Buffer)> {
        let bytes = logits_bytes(weight, rows);
        let readback = gpu.alloc(bytes, MemoryKind::Readback)?;
        if logits_direct() {
            return Ok((None, readback));
        }
        match gpu.alloc(bytes, MemoryKind::Device) {
            Ok(logits) => Ok((Some(logits), readback)),
            Err(e) => {
                gpu.release(readback);
                Err(e)
            }
        }
    }

    /// Makes the buffers hold `rows` rows (at most one chunk: the final norm
    /// writes into the chunk-sized normed-input buffer); true when they were
    /// replaced (descriptor sets binding them are then stale).
    pub fn fit_rows(&mut self, gpu: &Gpu, rows: usize) -> Result<bool> {
        if rows == 0 || rows > SPAN_CHUNK_TOKENS {
            return Err(VkError::Input(format!(
                "{rows} rows of logits from a span (1..={SPAN_CHUNK_TOKENS})"
            )));
        }
        if rows <= self.rows {
            return Ok(false);
        }
        let (logits, readback) = Self::buffers(gpu, &self.weight, rows)?;
        if let Some(old) = std::mem::replace(&mut self.logits, logits) {
            gpu.release(old);
        }
        gpu.release(std::mem::replace(&mut self.readback, readback));
        self.rows = rows;
        Ok(true)
    }

    pub fn n_vocab(&self) -> usize {
        self.weight.n_out()
    }

    /// The buffer the output projection writes.
    pub fn target(&self) -> &Buffer {
        self.logits.as_ref().unwrap_or(&self.readback)
    }

    /// Device bytes (the host-visible logits are not counted).
    pub fn bytes(&self) -> u64 {
        self.logits.as_ref().map_or(0, |b| b.size)
    }

    pub fn release(self, gpu: &Gpu) {
        if let Some(logits) = self.logits {
            gpu.release(logits);
        }
        gpu.release(self.readback);
    }
}
