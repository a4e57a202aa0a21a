//! One span forward: checks, then one command buffer (x in, every layer,
//! x out), one submit, one fence.

use super::bindings::{Bindings, SpanBuffers};
use super::record::{max_timestamps, plan_chunks, Recording};
use super::{Span, SPAN_CHUNK_TOKENS};
use crate::error::{Result, VkError};
use crate::gpu::Gpu;
use ash::vk;

impl Gpu {
    /// Runs the span on `n_tok` tokens at positions `pos0..`: `x` holds the
    /// residual stream (n_tok x n_embd) after the layer before the span and
    /// receives it after the span's last layer. Refused when `pos0` would
    /// leave a gap in the device KV; on any error `x` is untouched.
    pub fn span_forward(
        &self,
        span: &mut Span,
        x: &mut [f32],
        n_tok: usize,
        pos0: usize,
    ) -> Result<()> {
        let start = std::time::Instant::now();
        let n_embd = span.shape.n_embd;
        if n_tok == 0 || x.len() != n_tok * n_embd {
            return Err(VkError::Input(format!(
                "x has {} values for {n_tok} tokens of {n_embd}",
                x.len()
            )));
        }
        if pos0 > span.kv.len {
            return Err(VkError::Input(format!(
                "position {pos0} would leave a gap after the {} positions in the device KV",
                span.kv.len
            )));
        }
        self.span_reserve(span, pos0 + n_tok)?;
        if span.arena.fit_tokens(self, &span.shape, n_tok)? {
            if let Some(b) = span.bindings.take() {
                b.destroy(&self.device);
            }
        }
        if span.bindings.is_none() {
            let bufs = SpanBuffers {
                arena: &span.arena,
                kv: &span.kv,
                params: &span.params,
            };
            span.bindings = Some(Bindings::build(self, &span.pipelines, &span.layers, &bufs)?);
        }
        let bindings = span.bindings.as_ref().expect("built above");
        let chunks = plan_chunks(self, &span.layers, bindings, n_tok, SPAN_CHUNK_TOKENS)?;
        if let Some(p) = span.profiler.as_mut() {
            p.ensure(
                &self.device,
                max_timestamps(span.layers.len(), chunks.len()),
            )?;
        }
        let x_bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
        span.arena.upload.write(&self.allocator, 0, &x_bytes)?;

        let recording = Recording {
            gpu: self,
            shape: &span.shape,
            layers: &span.layers,
            params: &span.params,
            pipelines: &span.pipelines,
            bindings,
            chunks: &chunks,
            pos0,
        };
        let size = x_bytes.len() as u64;
        let (upload, x_dev, readback) = (
            span.arena.upload.raw,
            span.arena.x.raw,
            span.arena.readback.raw,
        );
        let profiler = span.profiler.as_mut();
        let submit_start = std::time::Instant::now();
        let exec = self.lock_exec();
        // SAFETY: every buffer and set recorded is live until the fence
        // signals, which submit_and_wait waits for.
        let submitted = self.submit_and_wait(&exec, |cmd| unsafe {
            let d = &self.device;
            let region = [vk::BufferCopy {
                src_offset: 0,
                dst_offset: 0,
                size,
            }];
            d.cmd_copy_buffer(cmd, upload, x_dev, &region);
            barrier(
                d,
                cmd,
                (
                    vk::PipelineStageFlags::TRANSFER,
                    vk::AccessFlags::TRANSFER_WRITE,
                ),
                (
                    vk::PipelineStageFlags::COMPUTE_SHADER,
                    vk::AccessFlags::SHADER_READ | vk::AccessFlags::SHADER_WRITE,
                ),
            );
            recording.record(cmd, profiler);
            barrier(
                d,
                cmd,
                (
                    vk::PipelineStageFlags::COMPUTE_SHADER,
                    vk::AccessFlags::SHADER_WRITE,
                ),
                (
                    vk::PipelineStageFlags::TRANSFER,
                    vk::AccessFlags::TRANSFER_READ,
                ),
            );
            d.cmd_copy_buffer(cmd, x_dev, readback, &region);
            barrier(
                d,
                cmd,
                (
                    vk::PipelineStageFlags::TRANSFER,
                    vk::AccessFlags::TRANSFER_WRITE,
                ),
                (vk::PipelineStageFlags::HOST, vk::AccessFlags::HOST_READ),
            );
        });
        drop(exec);
        let read_start = std::time::Instant::now();
        if let Err(e) = submitted {
            // Positions from pos0 on may hold partial writes.
            span.kv.len = span.kv.len.min(pos0);
            return Err(e);
        }
        let mut out = vec![0u8; x_bytes.len()];
        span.arena.readback.read(&self.allocator, 0, &mut out)?;
        for (v, b) in x.iter_mut().zip(out.chunks_exact(4)) {
            *v = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
        span.kv.len = pos0 + n_tok;
        if let Some(p) = span.profiler.as_mut() {
            let ns = |a: std::time::Instant, b: std::time::Instant| {
                b.duration_since(a).as_nanos().min(u128::from(u64::MAX)) as u64
            };
            let end = std::time::Instant::now();
            p.host_ns = [
                ns(start, submit_start),
                ns(submit_start, read_start),
                ns(read_start, end),
            ];
            p.collect(&self.device)?;
        }
        Ok(())
    }
}

/// A global memory barrier between two (stage, access) pairs.
unsafe fn barrier(
    d: &ash::Device,
    cmd: vk::CommandBuffer,
    src: (vk::PipelineStageFlags, vk::AccessFlags),
    dst: (vk::PipelineStageFlags, vk::AccessFlags),
) {
    let mb = [vk::MemoryBarrier::default()
        .src_access_mask(src.1)
        .dst_access_mask(dst.1)];
    d.cmd_pipeline_barrier(
        cmd,
        src.0,
        dst.0,
        vk::DependencyFlags::empty(),
        &mb,
        &[],
        &[],
    );
}
