//! The span's KV cache: per layer one f16 K and one f16 V buffer, holding
//! one or more sequence slots. Slot `s` owns the `capacity` rows starting at
//! row `s * capacity`, position-major, so slot 0 (the single sequence of a
//! plain forward) starts at row 0. The cache starts with one small slot and
//! grows on demand (new buffers, each slot's valid positions copied over,
//! the old ones freed), never past n_ctx positions per slot.

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
    /// Positions each slot has room for.
    pub capacity: usize,
    /// Per slot: positions `< lens[s]` are valid. Never empty (slot 0).
    lens: Vec<usize>,
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

/// Per layer a K and a V buffer for `rows` positions; on failure nothing
/// stays allocated. Refused when one buffer would exceed what a storage
/// binding can address.
fn alloc_kv(
    gpu: &Gpu,
    shape: &SpanShape,
    n_layers: usize,
    rows: usize,
) -> Result<(Vec<Buffer>, Vec<Buffer>)> {
    let widest = f16_bytes(rows, shape.k_dim().max(shape.v_dim()));
    let limit = gpu.info().max_storage_range;
    if widest > limit {
        return Err(VkError::Budget {
            requested: widest,
            reason: format!(
                "a KV buffer of {rows} positions exceeds the {limit} bytes one binding can address"
            ),
        });
    }
    let k = alloc_layers(gpu, n_layers, f16_bytes(rows, shape.k_dim()))?;
    match alloc_layers(gpu, n_layers, f16_bytes(rows, shape.v_dim())) {
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

    /// One slot of the initial capacity.
    pub fn new(gpu: &Gpu, shape: &SpanShape, n_layers: usize) -> Result<KvCache> {
        let capacity = initial_capacity(shape);
        let (k, v) = alloc_kv(gpu, shape, n_layers, capacity)?;
        Ok(KvCache {
            k,
            v,
            capacity,
            lens: vec![0],
        })
    }

    /// Slots the buffers hold.
    pub fn n_slots(&self) -> usize {
        self.lens.len()
    }

    /// Valid positions of `slot` (0 for a slot not allocated yet).
    pub fn len(&self, slot: usize) -> usize {
        self.lens.get(slot).copied().unwrap_or(0)
    }

    /// Keeps positions `< n` of `slot`.
    pub fn truncate(&mut self, slot: usize, n: usize) {
        if let Some(len) = self.lens.get_mut(slot) {
            *len = (*len).min(n);
        }
    }

    /// Marks positions `< n` of an allocated `slot` valid (after a forward
    /// wrote them).
    pub fn set_len(&mut self, slot: usize, n: usize) {
        if let Some(len) = self.lens.get_mut(slot) {
            *len = n.min(self.capacity);
        }
    }

    /// The first KV row of `slot`.
    pub fn first_row(&self, slot: usize) -> usize {
        slot * self.capacity
    }

    /// Grows to hold `n_pos` positions in every slot `<= slot`; true when the
    /// buffers were replaced. On failure the cache is unchanged.
    pub fn reserve(
        &mut self,
        gpu: &Gpu,
        shape: &SpanShape,
        slot: usize,
        n_pos: usize,
    ) -> Result<bool> {
        if n_pos <= self.capacity && slot < self.n_slots() {
            return Ok(false);
        }
        if n_pos > shape.n_ctx {
            return Err(VkError::Input(format!(
                "{n_pos} positions exceed the span's context of {}",
                shape.n_ctx
            )));
        }
        let capacity = if n_pos <= self.capacity {
            self.capacity
        } else {
            // Doubling keeps the number of copies logarithmic in the context.
            n_pos
                .max(self.capacity * 2)
                .next_multiple_of(KV_STEP)
                .min(shape.n_ctx)
        };
        let n_slots = self.n_slots().max(slot + 1);
        let (k, v) = alloc_kv(gpu, shape, self.k.len(), n_slots * capacity)?;
        let copied = self.copy_valid(gpu, shape, &k, &v, capacity);
        if let Err(e) = copied {
            k.into_iter().chain(v).for_each(|b| gpu.release(b));
            return Err(e);
        }
        let old_k = std::mem::replace(&mut self.k, k);
        let old_v = std::mem::replace(&mut self.v, v);
        old_k.into_iter().chain(old_v).for_each(|b| gpu.release(b));
        self.capacity = capacity;
        self.lens.resize(n_slots, 0);
        Ok(true)
    }

    /// Copies every slot's valid positions into new buffers of `capacity`
    /// positions per slot.
    fn copy_valid(
        &self,
        gpu: &Gpu,
        shape: &SpanShape,
        k: &[Buffer],
        v: &[Buffer],
        capacity: usize,
    ) -> Result<()> {
        let row_bytes = |dim: usize| dim as u64 * 2;
        let regions = |dim: usize| -> Vec<vk::BufferCopy> {
            self.lens
                .iter()
                .enumerate()
                .filter(|(_, &len)| len > 0)
                .map(|(s, &len)| vk::BufferCopy {
                    src_offset: (s * self.capacity) as u64 * row_bytes(dim),
                    dst_offset: (s * capacity) as u64 * row_bytes(dim),
                    size: len as u64 * row_bytes(dim),
                })
                .collect()
        };
        let (k_regions, v_regions) = (regions(shape.k_dim()), regions(shape.v_dim()));
        if k_regions.is_empty() {
            return Ok(());
        }
        let pairs: Vec<(vk::Buffer, vk::Buffer, &[vk::BufferCopy])> = self
            .k
            .iter()
            .zip(k)
            .map(|(a, b)| (a.raw, b.raw, &k_regions[..]))
            .chain(
                self.v
                    .iter()
                    .zip(v)
                    .map(|(a, b)| (a.raw, b.raw, &v_regions[..])),
            )
            .collect();
        let exec = gpu.lock_exec();
        // SAFETY: every region lies inside both buffers (a slot's valid
        // positions fit both the old and the new capacity).
        gpu.submit_and_wait(&exec, |cmd| unsafe {
            for &(src, dst, regions) in &pairs {
                gpu.device.cmd_copy_buffer(cmd, src, dst, regions);
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
