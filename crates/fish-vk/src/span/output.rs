//! The model's output inside a span forward: the final norm of the last rows
//! of x and the output projection, with the logits read back by the same
//! submit. Saves the second submit, the staging of x and the per-call
//! descriptor sets of a separate output matmul (~0.4 ms of a decode step on
//! the H200, measured with FISH_GPU_PROFILE=2).

use super::SPAN_CHUNK_TOKENS;
use crate::buffer::{Buffer, MemoryKind};
use crate::error::{Result, VkError};
use crate::gpu::Gpu;
use crate::upload::TensorHandle;

/// The output projection and the buffers its logits go through.
pub(crate) struct SpanOutput {
    pub weight: TensorHandle,
    /// Device logits: `rows` x n_vocab f32.
    pub logits: Buffer,
    /// Host-visible copy of `logits`.
    pub readback: Buffer,
    /// Rows of logits the buffers hold.
    pub rows: usize,
}

fn logits_bytes(weight: &TensorHandle, rows: usize) -> u64 {
    (rows as u64 * weight.n_out() as u64 * 4).next_multiple_of(16)
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

    fn buffers(gpu: &Gpu, weight: &TensorHandle, rows: usize) -> Result<(Buffer, Buffer)> {
        let bytes = logits_bytes(weight, rows);
        let logits = gpu.alloc(bytes, MemoryKind::Device)?;
        match gpu.alloc(bytes, MemoryKind::Readback) {
            Ok(readback) => Ok((logits, readback)),
            Err(e) => {
                gpu.release(logits);
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
        gpu.release(std::mem::replace(&mut self.logits, logits));
        gpu.release(std::mem::replace(&mut self.readback, readback));
        self.rows = rows;
        Ok(true)
    }

    pub fn n_vocab(&self) -> usize {
        self.weight.n_out()
    }

    /// Device bytes (the host-visible copy is not counted).
    pub fn bytes(&self) -> u64 {
        self.logits.size
    }

    pub fn release(self, gpu: &Gpu) {
        gpu.release(self.logits);
        gpu.release(self.readback);
    }
}
