//! One span forward: checks, then one command buffer (x in, every layer,
//! x or the output's logits out), one submit, one fence.

use super::bindings::{Bindings, SpanBuffers};
use super::record::{max_timestamps, plan_chunks, OutputRecording, Recording};
use super::{Span, SPAN_CHUNK_TOKENS};
use crate::error::{Result, VkError};
use crate::gpu::Gpu;
use crate::kernels::Kernel;
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
        let out = self.span_run(span, x, n_tok, pos0, None)?;
        x.copy_from_slice(&out);
        Ok(())
    }

    /// Like `span_forward`, then the model's output in the same submit:
    /// returns the logits (`rows` x n_vocab) of the last `rows` tokens, for
    /// spans that run the output (`Span::max_logit_rows`). x is not read back.
    pub fn span_forward_logits(
        &self,
        span: &mut Span,
        x: &[f32],
        n_tok: usize,
        pos0: usize,
        rows: usize,
    ) -> Result<Vec<f32>> {
        if rows == 0 || rows > n_tok || rows > span.max_logit_rows() {
            return Err(VkError::Input(format!(
                "{rows} rows of logits from a forward of {n_tok} tokens (the span returns at most {})",
                span.max_logit_rows()
            )));
        }
        self.span_run(span, x, n_tok, pos0, Some(rows))
    }

    /// One forward; returns x after the span, or with `logit_rows` the
    /// logits of that many last tokens.
    fn span_run(
        &self,
        span: &mut Span,
        x: &[f32],
        n_tok: usize,
        pos0: usize,
        logit_rows: Option<usize>,
    ) -> Result<Vec<f32>> {
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
        let mut stale = span.arena.fit_tokens(self, &span.shape, n_tok)?;
        if let (Some(rows), Some(o)) = (logit_rows, span.output.as_mut()) {
            stale |= o.fit_rows(self, rows)?;
        }
        if stale {
            if let Some(b) = span.bindings.take() {
                b.destroy(&self.device);
            }
        }
        if span.bindings.is_none() {
            let bufs = SpanBuffers {
                arena: &span.arena,
                kv: &span.kv,
                params: &span.params,
                output: span.output.as_ref(),
            };
            span.bindings = Some(Bindings::build(self, &span.pipelines, &span.layers, &bufs)?);
        }
        let bindings = span.bindings.as_ref().expect("built above");
        let output = match logit_rows {
            Some(rows) => {
                let missing = || VkError::Input("this span does not run the output".into());
                let o = span.output.as_ref().ok_or_else(missing)?;
                let sets = &bindings.output.as_ref().ok_or_else(missing)?.sets;
                let plan = self.plan_handles(&[o.weight], rows, Kernel::Auto)?;
                if plan.len() != sets.len() {
                    return Err(VkError::Input(
                        "output plan does not match its descriptor sets".into(),
                    ));
                }
                Some(OutputRecording {
                    plan,
                    sets,
                    norm: span.params.output_norm.ok_or_else(missing)?,
                    rows,
                    n_tok,
                })
            }
            None => None,
        };
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
            output,
        };
        let size = x_bytes.len() as u64;
        let upload = span.arena.upload.raw;
        let x_dev = span.arena.x.raw;
        // What the submit copies back: x, or the logits.
        let (result_dev, readback, result_bytes) = match (logit_rows, span.output.as_ref()) {
            (Some(rows), Some(o)) => (
                o.logits.raw,
                o.readback.raw,
                (rows * o.n_vocab() * 4) as u64,
            ),
            _ => (x_dev, span.arena.readback.raw, size),
        };
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
            let back = [vk::BufferCopy {
                src_offset: 0,
                dst_offset: 0,
                size: result_bytes,
            }];
            d.cmd_copy_buffer(cmd, result_dev, readback, &back);
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
        let mut out = vec![0u8; result_bytes as usize];
        match (logit_rows, span.output.as_ref()) {
            (Some(_), Some(o)) => o.readback.read(&self.allocator, 0, &mut out)?,
            _ => span.arena.readback.read(&self.allocator, 0, &mut out)?,
        }
        let result: Vec<f32> = out
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
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
        Ok(result)
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
