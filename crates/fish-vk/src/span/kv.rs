//! The span's KV cache: per layer one f16 K and one f16 V buffer,
//! position-major. It starts small and grows on demand (new buffers, the
//! valid positions copied over, the old ones freed), never past n_ctx.

use super::desc::SpanShape;
use crate::buffer::{Buffer, MemoryKind};
use crate::error::{Result, VkError};
use crate::gpu::Gpu;
use ash::vk;

/// Positions allocated at creation and the granularity of growth.
const KV_STEP: usize = 256;

pub(crate) struct KvCache {
    pub k: Vec<Buffer>,
    pub v: Vec<Buffer>,
    /// Positions the buffers hold room for.
    pub capacity: usize,
    /// Positions `< len` are valid.
    pub len: usize,
}

fn alloc_layers(gpu: &Gpu, n_layers: usize, bytes: u64) -> Result<Vec<Buffer>> {
    let mut out = Vec::with_capacity(n_layers);
    for _ in 0..n_layers {
        match gpu.alloc(bytes, MemoryKind::Device) {
            Ok(b) => out.push(b),
            Err(e) => {
                out.into_iter().for_each(|b| gpu.release(b));
                return Err(e);
            }
        }
    }
    Ok(out)
}

fn f16_bytes(positions: usize, dim: usize) -> u64 {
    (positions as u64 * dim as u64 * 2).next_multiple_of(16)
}

/// Per layer a K and a V buffer for `capacity` positions; on failure
/// nothing stays allocated.
fn alloc_kv(
    gpu: &Gpu,
    shape: &SpanShape,
    n_layers: usize,
    capacity: usize,
) -> Result<(Vec<Buffer>, Vec<Buffer>)> {
    let k = alloc_layers(gpu, n_layers, f16_bytes(capacity, shape.k_dim()))?;
    match alloc_layers(gpu, n_layers, f16_bytes(capacity, shape.v_dim())) {
        Ok(v) => Ok((k, v)),
        Err(e) => {
            k.into_iter().for_each(|b| gpu.release(b));
            Err(e)
        }
    }
}

/// Positions a new cache has room for.
fn initial_capacity(shape: &SpanShape) -> usize {
    KV_STEP.min(shape.n_ctx)
}

impl KvCache {
    /// Device bytes `new` allocates.
    pub fn initial_bytes(shape: &SpanShape, n_layers: usize) -> u64 {
        let capacity = initial_capacity(shape);
        n_layers as u64 * (f16_bytes(capacity, shape.k_dim()) + f16_bytes(capacity, shape.v_dim()))
    }

    pub fn new(gpu: &Gpu, shape: &SpanShape, n_layers: usize) -> Result<KvCache> {
        let capacity = initial_capacity(shape);
        let (k, v) = alloc_kv(gpu, shape, n_layers, capacity)?;
        Ok(KvCache {
            k,
            v,
            capacity,
            len: 0,
        })
    }

    /// Grows to hold `n_pos` positions; true when the buffers were replaced.
    /// On failure the cache is unchanged.
    pub fn reserve(&mut self, gpu: &Gpu, shape: &SpanShape, n_pos: usize) -> Result<bool> {
        if n_pos <= self.capacity {
            return Ok(false);
        }
        if n_pos > shape.n_ctx {
            return Err(VkError::Input(format!(
                "{n_pos} positions exceed the span's context of {}",
                shape.n_ctx
            )));
        }
        // Doubling keeps the number of copies logarithmic in the context.
        let capacity = n_pos
            .max(self.capacity * 2)
            .next_multiple_of(KV_STEP)
            .min(shape.n_ctx);
        let (k, v) = alloc_kv(gpu, shape, self.k.len(), capacity)?;
        let copied = self.copy_valid(gpu, shape, &k, &v);
        if let Err(e) = copied {
            k.into_iter().chain(v).for_each(|b| gpu.release(b));
            return Err(e);
        }
        let old_k = std::mem::replace(&mut self.k, k);
        let old_v = std::mem::replace(&mut self.v, v);
        old_k.into_iter().chain(old_v).for_each(|b| gpu.release(b));
        self.capacity = capacity;
        Ok(true)
    }

    /// Copies the valid positions of every layer into new buffers.
    fn copy_valid(&self, gpu: &Gpu, shape: &SpanShape, k: &[Buffer], v: &[Buffer]) -> Result<()> {
        if self.len == 0 {
            return Ok(());
        }
        let k_bytes = self.len as u64 * shape.k_dim() as u64 * 2;
        let v_bytes = self.len as u64 * shape.v_dim() as u64 * 2;
        let pairs: Vec<(vk::Buffer, vk::Buffer, u64)> = self
            .k
            .iter()
            .zip(k)
            .map(|(a, b)| (a.raw, b.raw, k_bytes))
            .chain(self.v.iter().zip(v).map(|(a, b)| (a.raw, b.raw, v_bytes)))
            .collect();
        let exec = gpu.lock_exec();
        // SAFETY: every region lies inside both buffers (old ones hold len positions).
        gpu.submit_and_wait(&exec, |cmd| unsafe {
            for &(src, dst, size) in &pairs {
                let region = [vk::BufferCopy {
                    src_offset: 0,
                    dst_offset: 0,
                    size,
                }];
                gpu.device.cmd_copy_buffer(cmd, src, dst, &region);
            }
        })
    }

    pub fn bytes(&self) -> u64 {
        self.k.iter().chain(&self.v).map(|b| b.size).sum()
    }

    pub fn release(self, gpu: &Gpu) {
        self.k
            .into_iter()
            .chain(self.v)
            .for_each(|b| gpu.release(b));
    }
}
