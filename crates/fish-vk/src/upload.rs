//! Weight upload: rows are copied into device buffers whose rows start on
//! 16-byte boundaries, rewritten into the device layout the kernels read (see
//! `device_row` and docs/GPU.md); a tensor larger than one buffer may be (the
//! device's maxMemoryAllocationSize / maxStorageBufferRange) is split by rows.

use crate::buffer::{Buffer, MemoryKind};
use crate::error::{Result, VkError};
use crate::gpu::Gpu;
use crate::kernels::supports;
use crate::weight_format::WeightFormat;
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
    ty: WeightFormat,
    n_in: usize,
    n_out: usize,
}

impl TensorHandle {
    pub fn ty(&self) -> WeightFormat {
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

fn row_bytes(ty: WeightFormat, n_in: usize) -> Result<u64> {
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
    /// (row-major blocks as a GGUF file, or fish-quant's FQ3 writer, holds
    /// them; `ty` is a `GgmlType` or a `WeightFormat`). Fails cleanly, holding
    /// nothing, when the type has no kernel, the shape is wrong or the budget
    /// refuses it.
    pub fn upload(
        &self,
        ty: impl Into<WeightFormat>,
        bytes: &[u8],
        n_in: usize,
        n_out: usize,
    ) -> Result<TensorHandle> {
        let ty = ty.into();
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
            self.fill_chunk(chunk, ty, bytes, row as usize, row_stride)
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

    /// Copies the chunk's rows through the staging buffer in the device
    /// layout, padding each row to `row_stride`.
    fn fill_chunk(
        &self,
        chunk: &Chunk,
        ty: WeightFormat,
        bytes: &[u8],
        row: usize,
        row_stride: u64,
    ) -> Result<()> {
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
                        device_row(ty, &bytes[src..src + row], &mut padded[dst..dst + row]);
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

/// One field of a block and how it is written to the device row.
#[derive(Clone, Copy)]
enum Field {
    /// `len` bytes at `offset`, copied as they are.
    Bytes(usize, usize),
    /// Q5 fifth bits at `offset`, reordered (see `fifth_bits_for_nibbles`).
    FifthBits(usize),
    /// One u32 word per FQ3 group of 32 values: the eight words at
    /// `offset + 12 g`, gathered into 32 contiguous bytes.
    GroupWords(usize),
}

/// Bytes between the words of consecutive FQ3 groups (A, B, C per group).
const FQ3_GROUP_STRIDE: usize = 12;

impl Field {
    /// Offset of the field in a block.
    fn offset(self) -> usize {
        match self {
            Field::Bytes(offset, _) | Field::FifthBits(offset) | Field::GroupWords(offset) => {
                offset
            }
        }
    }

    /// Bytes the field spans in a block.
    fn source_len(self) -> usize {
        match self {
            Field::Bytes(_, len) => len,
            Field::FifthBits(_) => 4,
            Field::GroupWords(_) => 7 * FQ3_GROUP_STRIDE + 4,
        }
    }

    /// Bytes the field takes in the device row, per block.
    fn device_len(self) -> usize {
        match self {
            Field::Bytes(_, len) => len,
            Field::FifthBits(_) => 4,
            Field::GroupWords(_) => 32,
        }
    }

    /// Writes the field (`from`, `source_len` bytes) to `to` (`device_len` bytes).
    fn write(self, from: &[u8], to: &mut [u8]) {
        let word =
            |at: usize| u32::from_le_bytes([from[at], from[at + 1], from[at + 2], from[at + 3]]);
        match self {
            Field::Bytes(..) => to.copy_from_slice(from),
            Field::FifthBits(_) => {
                to.copy_from_slice(&fifth_bits_for_nibbles(word(0)).to_le_bytes())
            }
            Field::GroupWords(_) => {
                for (g, out) in to.chunks_exact_mut(4).enumerate() {
                    out.copy_from_slice(&word(FQ3_GROUP_STRIDE * g).to_le_bytes());
                }
            }
        }
    }
}

/// Where the fields of one block go in a device row: the quants of every
/// block first, as one array with 16-byte aligned entries, then each small
/// per-block field (fifth bits, scales) as its own array, in this order.
/// Types without an entry keep the GGUF bytes.
fn split_layout(ty: WeightFormat) -> Option<(usize, &'static [Field])> {
    use Field::*;
    let ty = match ty {
        // d, dmin, scales[12] | (A, B, C)[8]: the words A of every group of
        // the row, then the words B, the words C, then the 16-byte heads, so
        // that the matvec loads the A, B and C words of four consecutive
        // groups with one 16-byte load each (shaders/matvec_units.glsl).
        WeightFormat::Fq3 => {
            return Some((
                112,
                &[GroupWords(16), GroupWords(20), GroupWords(24), Bytes(0, 16)],
            ))
        }
        WeightFormat::Ggml(ty) => ty,
    };
    Some(match ty {
        // d | qs[16]
        GgmlType::Q4_0 => (18, &[Bytes(2, 16), Bytes(0, 2)]),
        // d, m | qs[16]
        GgmlType::Q4_1 => (20, &[Bytes(4, 16), Bytes(0, 4)]),
        // d | qh[4] | qs[16]
        GgmlType::Q5_0 => (22, &[Bytes(6, 16), FifthBits(2), Bytes(0, 2)]),
        // d, m | qh[4] | qs[16]
        GgmlType::Q5_1 => (24, &[Bytes(8, 16), FifthBits(4), Bytes(0, 4)]),
        // d | qs[32]
        GgmlType::Q8_0 => (34, &[Bytes(2, 32), Bytes(0, 2)]),
        // ql[128], qh[64], scales[16] | d
        GgmlType::Q6_K => (210, &[Bytes(0, 208), Bytes(208, 2)]),
        _ => return None,
    })
}

/// Rewrites one row (`src`) into the device layout (`dst`, the same
/// length). The kernels read quants with 16-byte loads, which the GGUF blocks
/// of 18, 20, 22, 24, 34 and 210 bytes do not allow; FQ3 groups are 12 bytes.
fn device_row(ty: WeightFormat, src: &[u8], dst: &mut [u8]) {
    let Some((block_bytes, fields)) = split_layout(ty) else {
        dst.copy_from_slice(src);
        return;
    };
    let nb = src.len() / block_bytes;
    let mut base = 0;
    for &field in fields {
        let (offset, len, out_len) = (field.offset(), field.source_len(), field.device_len());
        for b in 0..nb {
            let from = &src[b * block_bytes + offset..b * block_bytes + offset + len];
            field.write(from, &mut dst[base + b * out_len..base + (b + 1) * out_len]);
        }
        base += nb * out_len;
    }
}

/// Q5_0/Q5_1 fifth bits (bit j of `qh` belongs to value j) reordered so that
/// the bits of the values in qs word c (bytes 4c..4c+3: values 4c+i in the low
/// nibbles, 16+4c+i in the high ones) sit at bits 8i+c and 8i+4+c: one shift
/// then puts each at bit 4 of its nibble's byte (shaders/dequant.glsl qh5_lo/qh5_hi).
fn fifth_bits_for_nibbles(qh: u32) -> u32 {
    let mut out = 0u32;
    for j in 0..32 {
        let bit = (qh >> j) & 1;
        let (c, i, high) = ((j % 16) / 4, j % 4, j / 16);
        out |= bit << (8 * i + 4 * high + c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifth_bits_are_a_permutation() {
        let mut seen = 0u32;
        for j in 0..32 {
            let moved = fifth_bits_for_nibbles(1 << j);
            assert_eq!(moved.count_ones(), 1, "bit {j}");
            seen |= moved;
        }
        assert_eq!(seen, u32::MAX);
    }

    #[test]
    fn split_rows_keep_their_length_and_every_byte() {
        for ty in [
            WeightFormat::Ggml(GgmlType::Q4_0),
            WeightFormat::Ggml(GgmlType::Q4_1),
            WeightFormat::Ggml(GgmlType::Q8_0),
            WeightFormat::Ggml(GgmlType::Q6_K),
            WeightFormat::Fq3,
        ] {
            let len = ty.block_bytes() * 3;
            let src: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
            let mut dst = vec![0u8; len];
            device_row(ty, &src, &mut dst);
            let mut a = src.clone();
            let mut b = dst.clone();
            a.sort_unstable();
            b.sort_unstable();
            assert_eq!(a, b, "{ty:?}");
            assert_ne!(src, dst, "{ty:?}");
        }
    }

    /// FQ3 rows become A[8 nb], B[8 nb], C[8 nb] (u32 words, group G = 8 b + g)
    /// then the 16-byte heads, as shaders/dequant.glsl reads them.
    #[test]
    fn fq3_rows_split_into_word_planes_and_heads() {
        let nb: usize = 3;
        // Word i of the row holds i, so every word names its source position.
        let src: Vec<u8> = (0..(nb * 28) as u32)
            .flat_map(|i| i.to_le_bytes())
            .collect();
        let mut dst = vec![0u8; src.len()];
        device_row(WeightFormat::Fq3, &src, &mut dst);
        let word = |at: usize| u32::from_le_bytes(dst[at..at + 4].try_into().unwrap());
        for b in 0..nb {
            let block_word = 28 * b as u32;
            for g in 0..8 {
                let group = 8 * b + g;
                let first = block_word + 4 + 3 * g as u32;
                assert_eq!(word(4 * group), first, "A of group {group}");
                assert_eq!(word(32 * nb + 4 * group), first + 1, "B of group {group}");
                assert_eq!(word(64 * nb + 4 * group), first + 2, "C of group {group}");
            }
            for i in 0..4 {
                assert_eq!(word(96 * nb + 16 * b + 4 * i), block_word + i as u32);
            }
        }
    }
}
