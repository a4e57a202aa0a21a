//! Buffers allocated through vk-mem. A Buffer does not free itself (it would
//! need the allocator); its owner calls `destroy`.

use crate::error::{Result, VkCall};
use ash::vk;
use std::mem::MaybeUninit;
use vk_mem::{
    Alloc, Allocation, AllocationCreateFlags, AllocationCreateInfo, Allocator, MemoryUsage,
};

/// Reads and writes of at least this many bytes copy in parallel chunks
/// of PARALLEL_COPY_CHUNK bytes. Reads: the logits of a batched decode step
/// (8 x 128256 floats, 4 MB) took ~0.54 ms on one thread of the H200's
/// host, a fresh vector's page faults included; on the pool llama-1b B = 8
/// / 16 +4% (2193 / 2204 -> 2280 / 2280, 2920 -> 3027 tok/s), llama-8b
/// B = 16 +3%, B = 8 level (939 -> 925 / 934). Writes: a 512-token prefill
/// uploads its x (8 MB of f32 on llama-8b) into host-visible memory, ~2.0
/// ms on one thread of an H100's host, ~0.7 ms on the pool (pp512 +1.8%).
const PARALLEL_COPY_BYTES: usize = 1 << 20;
const PARALLEL_COPY_CHUNK: usize = 256 << 10;

/// Copies `len` bytes from `src` to `dst`, in PARALLEL_COPY_CHUNK chunks on
/// the pool where they are at least PARALLEL_COPY_BYTES.
///
/// # Safety
/// `src` must be valid for reads and `dst` for writes of `len` bytes, and
/// the two ranges must not overlap.
unsafe fn copy_bytes(src: *const u8, dst: *mut u8, len: usize) {
    if len < PARALLEL_COPY_BYTES {
        // SAFETY: the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
        return;
    }
    // Addresses: raw pointers are not Send.
    let (src, dst) = (src as usize, dst as usize);
    use rayon::prelude::*;
    (0..len.div_ceil(PARALLEL_COPY_CHUNK))
        .into_par_iter()
        .for_each(|i| {
            let at = i * PARALLEL_COPY_CHUNK;
            // SAFETY: chunk i lies within both ranges (the caller's contract).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    (src + at) as *const u8,
                    (dst + at) as *mut u8,
                    PARALLEL_COPY_CHUNK.min(len - at),
                )
            }
        });
}

/// Where a buffer lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MemoryKind {
    /// Device-local, for weights and kernel inputs/outputs; counted against the budget.
    Device,
    /// Host-visible, written by the CPU (staging towards the device).
    Upload,
    /// Host-visible, read by the CPU (results).
    Readback,
}

pub(crate) struct Buffer {
    pub raw: vk::Buffer,
    allocation: Allocation,
    pub size: u64,
    pub kind: MemoryKind,
    mapped: *mut u8,
}

// SAFETY: the mapped pointer is only dereferenced by the owner, which
// serialises access (every use happens under the device's execution lock).
unsafe impl Send for Buffer {}
unsafe impl Sync for Buffer {}

impl Buffer {
    pub fn create(allocator: &Allocator, size: u64, kind: MemoryKind) -> Result<Buffer> {
        let usage = vk::BufferUsageFlags::STORAGE_BUFFER
            | vk::BufferUsageFlags::TRANSFER_SRC
            | vk::BufferUsageFlags::TRANSFER_DST;
        let info = vk::BufferCreateInfo::default()
            .size(size.max(16))
            .usage(usage)
            .sharing_mode(vk::SharingMode::EXCLUSIVE);
        // Every buffer gets its own device memory: weights are large anyway, and
        // freeing then returns the memory to the driver at once (pooled blocks
        // would keep an empty block alive after a model is unloaded).
        let flags = AllocationCreateFlags::DEDICATED_MEMORY
            | match kind {
                MemoryKind::Device => AllocationCreateFlags::empty(),
                MemoryKind::Upload => {
                    AllocationCreateFlags::HOST_ACCESS_SEQUENTIAL_WRITE
                        | AllocationCreateFlags::MAPPED
                }
                MemoryKind::Readback => {
                    AllocationCreateFlags::HOST_ACCESS_RANDOM | AllocationCreateFlags::MAPPED
                }
            };
        let usage = match kind {
            MemoryKind::Device => MemoryUsage::AutoPreferDevice,
            _ => MemoryUsage::Auto,
        };
        let create = AllocationCreateInfo {
            flags,
            usage,
            ..Default::default()
        };
        // SAFETY: valid create infos; the allocator outlives the buffer (owner's contract).
        let (raw, allocation) =
            unsafe { allocator.create_buffer(&info, &create) }.call("vmaCreateBuffer")?;
        let mapped = allocator.get_allocation_info(&allocation).mapped_data as *mut u8;
        Ok(Buffer {
            raw,
            allocation,
            size: size.max(16),
            kind,
            mapped,
        })
    }

    pub fn destroy(mut self, allocator: &Allocator) {
        // SAFETY: the GPU no longer uses the buffer (owners wait for their fences).
        unsafe { allocator.destroy_buffer(self.raw, &mut self.allocation) };
    }

    /// Copies `bytes` into a host-visible buffer at `offset`.
    pub fn write(&mut self, allocator: &Allocator, offset: u64, bytes: &[u8]) -> Result<()> {
        assert!(
            !self.mapped.is_null(),
            "write to a buffer that is not host-visible"
        );
        assert!(
            offset + bytes.len() as u64 <= self.size,
            "write past the end of a buffer"
        );
        // SAFETY: bounds checked above; `bytes` is borrowed apart from the
        // mapping, which lives as long as the allocation.
        unsafe {
            copy_bytes(
                bytes.as_ptr(),
                self.mapped.add(offset as usize),
                bytes.len(),
            )
        };
        allocator
            .flush_allocation(&self.allocation, offset, bytes.len() as u64)
            .call("vmaFlushAllocation")
    }

    /// Copies `out.len()` bytes from a host-visible buffer at `offset` into
    /// memory that need not be initialised (every byte of `out` is
    /// written); large reads on the pool.
    fn read_uninit(
        &self,
        allocator: &Allocator,
        offset: u64,
        out: &mut [MaybeUninit<u8>],
    ) -> Result<()> {
        assert!(
            !self.mapped.is_null(),
            "read from a buffer that is not host-visible"
        );
        assert!(
            offset + out.len() as u64 <= self.size,
            "read past the end of a buffer"
        );
        allocator
            .invalidate_allocation(&self.allocation, offset, out.len() as u64)
            .call("vmaInvalidateAllocation")?;
        // SAFETY: bounds checked above; `out` is borrowed apart from the
        // mapping, and valid for writes of its length.
        unsafe {
            copy_bytes(
                self.mapped.add(offset as usize),
                out.as_mut_ptr().cast::<u8>(),
                out.len(),
            )
        };
        Ok(())
    }

    /// `n` f32 values from byte `offset` in a new vector, read straight
    /// into its allocation: no zeroing pass first (for a batched step's
    /// 4 MB of logits that pass cost more than the copy on the H200 host).
    pub fn read_f32_vec(&self, allocator: &Allocator, offset: u64, n: usize) -> Result<Vec<f32>> {
        let mut values = Vec::<f32>::with_capacity(n);
        let spare = &mut values.spare_capacity_mut()[..n];
        // SAFETY: the spare capacity is valid for writes of n * 4 bytes.
        let bytes = unsafe {
            std::slice::from_raw_parts_mut(spare.as_mut_ptr().cast::<MaybeUninit<u8>>(), n * 4)
        };
        self.read_uninit(allocator, offset, bytes)?;
        // SAFETY: read_uninit wrote all n * 4 bytes, and every bit pattern
        // is an f32.
        unsafe { values.set_len(n) };
        Ok(values)
    }

    /// Writes f32 values at byte `offset` (the device reads them as the
    /// host lays them out: little-endian on every host Vulkan runs on).
    pub fn write_f32(&mut self, allocator: &Allocator, offset: u64, values: &[f32]) -> Result<()> {
        self.write(allocator, offset, bytemuck::cast_slice(values))
    }
}
