//! Weight upload: rows are copied into device buffers whose rows start on
//! 16-byte boundaries; a tensor larger than one buffer may be (the device's
//! maxMemoryAllocationSize / maxStorageBufferRange) is split by rows.

use crate::buffer::{Buffer, MemoryKind};
use crate::error::{Result, VkError};
use crate::gpu::Gpu;
use crate::kernels::supports;
use ash::vk;
use fish_gguf::GgmlType;
use std::sync::atomic::{AtomicU64, Ordering};

/// Every kernel reads weights in groups of 8 values and the tiled kernel in
/// steps of 32, so rows must hold a multiple of 32 values.
pub const ROW_MULTIPLE: usize = 32;
/// Extra bytes after the last row: the funnel-shifted reads may touch one word past it.
const TAIL_PAD: u64 = 16;
/// Staging buffer size for uploads.
const STAGING_BYTES: u64 = 32 << 20;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A weight matrix resident on one device (y = W x with W of n_out rows of n_in values).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorHandle {
    id: u64,
    ty: GgmlType,
    n_in: usize,
    n_out: usize,
}

impl TensorHandle {
    pub fn ty(&self) -> GgmlType {
        self.ty
    }
    pub fn n_in(&self) -> usize {
        self.n_in
    }
    pub fn n_out(&self) -> usize {
        self.n_out
    }
    pub(crate) fn id(&self) -> u64 {
        self.id
    }
}

pub(crate) struct Chunk {
    pub buffer: Buffer,
    pub row0: usize,
    pub n_rows: usize,
}

pub(crate) struct ResidentTensor {
    pub handle: TensorHandle,
    pub row_stride: u64,
    pub chunks: Vec<Chunk>,
    /// Device bytes held by the chunks.
    pub bytes: u64,
}

fn row_bytes(ty: GgmlType, n_in: usize) -> Result<u64> {
    if n_in == 0 || !n_in.is_multiple_of(ROW_MULTIPLE) || !n_in.is_multiple_of(ty.block_size()) {
        return Err(VkError::Shape(format!(
            "rows of {n_in} values ({}) are not a multiple of {ROW_MULTIPLE} and of the block size",
            ty.name()
        )));
    }
    Ok((n_in / ty.block_size() * ty.block_bytes()) as u64)
}

impl Gpu {
    /// Rows per device buffer for a row stride: bounded by the allocation and
    /// storage-range limits, 32-bit byte addressing in the kernels and FISH_VK_CHUNK_MB.
    fn rows_per_chunk(&self, row_stride: u64) -> usize {
        let mut cap = self
            .info
            .max_allocation
            .min(self.info.max_storage_range)
            .min(u64::from(u32::MAX));
        if let Some(mb) = self.config.chunk_mb {
            cap = cap.min(mb << 20);
        }
        (cap.saturating_sub(TAIL_PAD) / row_stride).max(1) as usize
    }

    /// Uploads a weight matrix of `n_out` rows of `n_in` values stored as `ty`
    /// (GGUF row-major bytes). Fails cleanly, holding nothing, when the type
    /// has no kernel, the shape is wrong or the budget refuses it.
    pub fn upload(
        &self,
        ty: GgmlType,
        bytes: &[u8],
        n_in: usize,
        n_out: usize,
    ) -> Result<TensorHandle> {
        if !supports(ty) {
            return Err(VkError::Unsupported(ty));
        }
        let row = row_bytes(ty, n_in)?;
        let expected = row.checked_mul(n_out as u64);
        if n_out == 0 || expected != Some(bytes.len() as u64) {
            return Err(VkError::Shape(format!(
                "{} bytes for {n_out} rows of {n_in} {} values (expected {:?})",
                bytes.len(),
                ty.name(),
                expected
            )));
        }
        let row_stride = row.next_multiple_of(16);
        let per_chunk = self.rows_per_chunk(row_stride);
        let plan: Vec<(usize, usize)> = (0..n_out)
            .step_by(per_chunk)
            .map(|r0| (r0, per_chunk.min(n_out - r0)))
            .collect();
        let total: u64 = plan
            .iter()
            .map(|&(_, n)| n as u64 * row_stride + TAIL_PAD)
            .sum();
        // Check the whole tensor first so that a refusal allocates nothing.
        self.budget
            .check(total, self.bytes_allocated(), self.memory_free())
            .map_err(|reason| VkError::Budget {
                requested: total,
                reason,
            })?;

        let mut chunks = Vec::with_capacity(plan.len());
        let filled = plan.iter().try_for_each(|&(row0, n_rows)| {
            let buffer = self.alloc(n_rows as u64 * row_stride + TAIL_PAD, MemoryKind::Device)?;
            chunks.push(Chunk {
                buffer,
                row0,
                n_rows,
            });
            let chunk = chunks.last().expect("just pushed");
            self.fill_chunk(chunk, bytes, row as usize, row_stride)
        });
        if let Err(e) = filled {
            for c in chunks {
                self.release(c.buffer);
            }
            return Err(e);
        }
        let handle = TensorHandle {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            ty,
            n_in,
            n_out,
        };
        let bytes = chunks.iter().map(|c| c.buffer.size).sum();
        self.lock_tensors().insert(
            handle.id,
            ResidentTensor {
                handle,
                row_stride,
                chunks,
                bytes,
            },
        );
        Ok(handle)
    }

    /// Copies the chunk's rows through the staging buffer, padding each row to `row_stride`.
    fn fill_chunk(&self, chunk: &Chunk, bytes: &[u8], row: usize, row_stride: u64) -> Result<()> {
        let mut exec = self.lock_exec();
        let mut staging = exec.staging.take();
        let want = STAGING_BYTES
            .min(chunk.n_rows as u64 * row_stride)
            .max(row_stride);
        let result = self
            .ensure(&mut staging, want, MemoryKind::Upload)
            .and_then(|()| {
                let stage = staging.as_mut().expect("ensured");
                let rows_per_pass = (stage.size / row_stride) as usize;
                let mut done = 0;
                let mut padded = vec![0u8; rows_per_pass * row_stride as usize];
                while done < chunk.n_rows {
                    let n = rows_per_pass.min(chunk.n_rows - done);
                    for i in 0..n {
                        let src = (chunk.row0 + done + i) * row;
                        let dst = i * row_stride as usize;
                        padded[dst..dst + row].copy_from_slice(&bytes[src..src + row]);
                    }
                    let len = n as u64 * row_stride;
                    stage.write(&self.allocator, 0, &padded[..len as usize])?;
                    let region = [vk::BufferCopy {
                        src_offset: 0,
                        dst_offset: done as u64 * row_stride,
                        size: len,
                    }];
                    let (src, dst) = (stage.raw, chunk.buffer.raw);
                    self.submit_and_wait(&exec, |cmd| unsafe {
                        self.device.cmd_copy_buffer(cmd, src, dst, &region)
                    })?;
                    done += n;
                }
                Ok(())
            });
        exec.staging = staging;
        result
    }

    /// Releases a resident tensor; unknown handles are an error.
    pub fn free(&self, handle: TensorHandle) -> Result<()> {
        let tensor = self
            .lock_tensors()
            .remove(&handle.id)
            .ok_or(VkError::UnknownHandle(handle.id))?;
        // Uploads and matmuls wait for their fences, so nothing is in flight
        // once the exec lock is free.
        let _idle = self.lock_exec();
        for c in tensor.chunks {
            self.release(c.buffer);
        }
        Ok(())
    }

    /// Bytes of device memory held by resident weights.
    pub fn bytes_resident(&self) -> u64 {
        self.lock_tensors().values().map(|t| t.bytes).sum()
    }

    /// Number of device buffers holding `handle` (more than one when split).
    pub fn chunk_count(&self, handle: TensorHandle) -> Option<usize> {
        self.lock_tensors().get(&handle.id).map(|t| t.chunks.len())
    }
}
