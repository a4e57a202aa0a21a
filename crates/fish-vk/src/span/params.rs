//! The span's parameters in one device buffer of f32: per layer its norm
//! vectors and biases, then the RoPE tables. Uploaded once at creation; the
//! kernels find each vector by its float offset.

use super::desc::SpanDesc;
use crate::buffer::{Buffer, MemoryKind};
use crate::error::{Result, VkError};
use crate::gpu::Gpu;
use ash::vk;

/// Float offsets of one layer's vectors in the parameter buffer.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct LayerParams {
    pub attn_norm: u32,
    pub ffn_norm: u32,
    pub bq: Option<u32>,
    pub bk: Option<u32>,
    pub bv: Option<u32>,
    pub q_norm: Option<u32>,
    pub k_norm: Option<u32>,
    pub post_attn_norm: Option<u32>,
    pub post_ffn_norm: Option<u32>,
}

pub(crate) struct Params {
    pub buffer: Buffer,
    pub layers: Vec<LayerParams>,
    /// Float offset of each RoPE table.
    pub rope_tables: Vec<u32>,
    /// Float offset of the output norm, when the span runs the output.
    pub output_norm: Option<u32>,
}

/// Appends vectors to a flat f32 list and remembers where each starts.
struct Packer(Vec<f32>);

impl Packer {
    /// Every vector starts on a 16-byte boundary, so kernels may read
    /// them as vec4 (the fused-norm matvec does).
    fn put(&mut self, v: &[f32]) -> u32 {
        self.0.resize(self.0.len().next_multiple_of(4), 0.0);
        let at = self.0.len() as u32;
        self.0.extend_from_slice(v);
        at
    }
    fn put_opt(&mut self, v: Option<&[f32]>) -> Option<u32> {
        v.map(|v| self.put(v))
    }
}

impl Params {
    pub fn upload(gpu: &Gpu, desc: &SpanDesc<'_>) -> Result<Params> {
        let mut p = Packer(Vec::new());
        let layers = desc
            .layers
            .iter()
            .map(|l| LayerParams {
                attn_norm: p.put(l.attn_norm),
                ffn_norm: p.put(l.ffn_norm),
                bq: p.put_opt(l.bq),
                bk: p.put_opt(l.bk),
                bv: p.put_opt(l.bv),
                q_norm: p.put_opt(l.q_norm),
                k_norm: p.put_opt(l.k_norm),
                post_attn_norm: p.put_opt(l.post_attn_norm),
                post_ffn_norm: p.put_opt(l.post_ffn_norm),
            })
            .collect();
        let rope_tables = desc.rope_tables.iter().map(|t| p.put(t)).collect();
        let output_norm = desc.output.as_ref().map(|o| p.put(o.norm));
        if p.0.len() > u32::MAX as usize {
            return Err(VkError::Input(
                "span parameters exceed 32-bit offsets".into(),
            ));
        }
        let bytes: Vec<u8> = p.0.iter().flat_map(|v| v.to_le_bytes()).collect();
        let buffer = upload_bytes(gpu, &bytes)?;
        Ok(Params {
            buffer,
            layers,
            rope_tables,
            output_norm,
        })
    }

    pub fn bytes(&self) -> u64 {
        self.buffer.size
    }

    pub fn release(self, gpu: &Gpu) {
        gpu.release(self.buffer);
    }
}

/// A device buffer holding `bytes`, filled through a temporary staging buffer.
fn upload_bytes(gpu: &Gpu, bytes: &[u8]) -> Result<Buffer> {
    let size = (bytes.len() as u64).next_multiple_of(16);
    let device = gpu.alloc(size, MemoryKind::Device)?;
    let filled = gpu.alloc(size, MemoryKind::Upload).and_then(|mut staging| {
        let copied = staging.write(&gpu.allocator, 0, bytes).and_then(|()| {
            let exec = gpu.lock_exec();
            let region = [vk::BufferCopy {
                src_offset: 0,
                dst_offset: 0,
                size: bytes.len().max(4) as u64,
            }];
            let (src, dst) = (staging.raw, device.raw);
            // SAFETY: both buffers are live and large enough for the region.
            gpu.submit_and_wait(&exec, |cmd| unsafe {
                gpu.device.cmd_copy_buffer(cmd, src, dst, &region)
            })
        });
        gpu.release(staging);
        copied
    });
    match filled {
        Ok(()) => Ok(device),
        Err(e) => {
            gpu.release(device);
            Err(e)
        }
    }
}
