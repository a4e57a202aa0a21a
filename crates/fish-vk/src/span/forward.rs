//! One span forward: checks, then one command buffer (x in, every layer,
//! x or the output's logits out), one submit, one fence.

use super::bindings::{Bindings, SpanBuffers};
use super::forward_timer::{ForwardMarks, ForwardTimer};
use super::output::SpanOutput;
use super::persistent::{Persistent, PersistentRecording};
use super::profile::Profiler;
use super::record::{
    max_timestamps, narrow_gate_up_wanted, output_kernel, output_takes_int8, plan_chunks,
    OutputInput, OutputRecording, Recording, TokenLayout,
};
use super::step::{Placement, SlotRun, SpanRow, STEP_BYTES, STEP_DEVICE_WORDS, STEP_UPLOAD_WORDS};
use super::{span_chunk_tokens, Span};
use crate::error::{Result, VkError};
use crate::gpu::Gpu;
use crate::kernels::{Kernel, MATVEC_MAX_TOKENS};
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
        let out = self.span_run(span, x, n_tok, Placement::Consecutive { pos0 }, None)?;
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
        check_logit_rows(span, rows, n_tok)?;
        self.span_run(span, x, n_tok, Placement::Consecutive { pos0 }, Some(rows))
    }

    /// A batched forward: row `b` of `x` is a token of the sequence in KV
    /// slot `rows[b].slot` at position `rows[b].pos`; `x` receives the
    /// residual stream after the span. Every matmul serves all rows at once;
    /// RoPE, the KV store and attention use each row's own slot and position.
    /// A slot's rows must be consecutive positions, the first leaving no gap
    /// after the slot's valid positions; at most `Span::max_batch_rows` rows
    /// unless they are all one slot's (any number).
    /// On any error `x` is untouched.
    pub fn span_forward_rows(
        &self,
        span: &mut Span,
        x: &mut [f32],
        rows: &[SpanRow],
    ) -> Result<()> {
        let out = self.span_run(span, x, rows.len(), Placement::Rows(rows), None)?;
        x.copy_from_slice(&out);
        Ok(())
    }

    /// `span_forward_rows`, then the output in the same submit: the logits
    /// (`logit_rows` x n_vocab) of the last `logit_rows` rows.
    pub fn span_forward_rows_logits(
        &self,
        span: &mut Span,
        x: &[f32],
        rows: &[SpanRow],
        logit_rows: usize,
    ) -> Result<Vec<f32>> {
        check_logit_rows(span, logit_rows, rows.len())?;
        self.span_run(span, x, rows.len(), Placement::Rows(rows), Some(logit_rows))
    }

    /// One forward; returns x after the span, or with `logit_rows` the
    /// logits of that many last tokens.
    fn span_run(
        &self,
        span: &mut Span,
        x: &[f32],
        n_tok: usize,
        placement: Placement<'_>,
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
        let runs = placement.slot_runs(&span.kv, n_tok)?;
        for r in &runs {
            self.span_reserve_slot(span, r.slot, r.end)?;
        }
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
            // Recordings bind the old sets and buffers.
            span.recorded.clear(self);
            let bufs = SpanBuffers {
                arena: &span.arena,
                kv: &span.kv,
                params: &span.params,
                output: span.output.as_ref(),
                persistent: span.persistent.as_ref(),
            };
            span.bindings = Some(Bindings::build(self, &span.pipelines, &span.layers, &bufs)?);
        }
        let layout = token_layout(&placement, &runs);
        let consecutive = layout == TokenLayout::Consecutive;
        let persistent = span
            .persistent
            .as_ref()
            .filter(|_| Persistent::takes(n_tok, consecutive, runs[0].first));
        let persistent_on = persistent.is_some();
        // One-token staged forwards may run their attention beside q/k/v.
        // Not while the stages are timed (FISH_GPU_PROFILE=2/3): the q/k/v
        // stage would then end with no timestamp of its own.
        let overlap_on =
            span.overlaps_qkv() && n_tok == 1 && !persistent_on && span.profiler.is_none();
        let x_bytes = std::mem::size_of_val(x) as u64;
        span.arena.upload.write_f32(&self.allocator, 0, x)?;
        // An overlapped forward uploads zeros for the attention's arrival
        // words (its step copy takes them in) and its failure flag.
        let mut words = placement.words(&span.kv);
        if overlap_on {
            words.resize(STEP_UPLOAD_WORDS, 0);
        }
        let step: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        span.arena.step_upload.write(&self.allocator, 0, &step)?;
        let copies = Copies {
            upload: span.arena.upload.raw,
            x_dev: span.arena.x.raw,
            x_bytes,
            step_upload: span.arena.step_upload.raw,
            step: span.arena.step.raw,
            split: (span.arena.split.raw, span.arena.split_counter_bytes),
            attn_split: (
                span.arena.attn_split.raw,
                span.arena.attn_split_counter_bytes,
            ),
            // Only the opt-in narrow gate/up kernel reads its counters.
            gate_up_arrivals: narrow_gate_up_wanted().then_some((
                span.arena.gate_up_arrivals.raw,
                span.arena.gate_up_arrival_counter_bytes,
            )),
            persistent: persistent.map(|p| (p.scratch.raw, p.header_bytes(), p.failure.raw)),
            step_bytes: match overlap_on {
                true => (STEP_DEVICE_WORDS * 4) as u64,
                false => STEP_BYTES,
            },
            // (None: the projection wrote the host-visible logits itself.)
            result: match (logit_rows, span.output.as_ref()) {
                (Some(rows), Some(o)) => (
                    o.logits.as_ref().map(|l| (l.raw, o.readback.raw)),
                    (rows * o.n_vocab() * 4) as u64,
                ),
                _ => (Some((span.arena.x.raw, span.arena.readback.raw)), x_bytes),
            },
        };
        let result_bytes = copies.result.1;
        let key = (n_tok, logit_rows, layout, persistent_on, overlap_on);
        let submit_start;
        // Whether this forward recorded its command buffer (FISH_GPU_PROFILE=1
        // leaves such forwards out of its means).
        let mut recorded_now = false;
        let submitted = match span.recorded.get(key) {
            // The common case of decode: the same shape as an earlier forward,
            // so its command buffer is submitted again as it was recorded.
            Some(cmd) if span.profiler.is_none() => {
                submit_start = std::time::Instant::now();
                let exec = self.lock_exec();
                self.submit_recorded(&exec, cmd)
            }
            _ => {
                recorded_now = true;
                let bindings = span.bindings.as_ref().expect("built above");
                let output = match logit_rows {
                    Some(rows) => Some(output_recording(
                        self,
                        span.output.as_ref(),
                        bindings,
                        span.params.output_norm,
                        rows,
                        n_tok,
                        layout,
                    )?),
                    None => None,
                };
                // Persistent layers record no stages.
                let chunks = match persistent {
                    Some(_) => Vec::new(),
                    None => plan_chunks(
                        self,
                        &span.shape,
                        bindings,
                        n_tok,
                        span_chunk_tokens(),
                        layout,
                    )?,
                };
                // (Persistent layers: no chunks, at most 5 stages a layer.)
                if let Some(p) = span.profiler.as_mut() {
                    p.ensure(
                        &self.device,
                        max_timestamps(span.layers.len(), chunks.len().max(1)),
                    )?;
                }
                let recording = Recording {
                    gpu: self,
                    shape: &span.shape,
                    layers: &span.layers,
                    params: &span.params,
                    pipelines: &span.pipelines,
                    bindings,
                    chunks: &chunks,
                    output,
                    persistent: persistent.map(|p| PersistentRecording {
                        persistent: p,
                        sets: &bindings.persistent,
                    }),
                    qkv_overlap: overlap_on,
                };
                submit_start = std::time::Instant::now();
                let exec = self.lock_exec();
                match span.profiler.as_mut() {
                    // Timestamps are collected per forward: record it afresh.
                    Some(profiler) => self.submit_and_wait(&exec, |cmd| {
                        // SAFETY: every buffer and set recorded is live until
                        // the fence signals, which submit_and_wait waits for.
                        unsafe {
                            record_forward(
                                &self.device,
                                cmd,
                                &recording,
                                Some(profiler),
                                None,
                                &copies,
                            )
                        }
                    }),
                    None => self
                        .record_once(&exec, |cmd| {
                            let timer = span.forward_timer.as_ref();
                            // SAFETY: the recording is dropped (span.recorded
                            // cleared) before any buffer or set it binds, and
                            // the timer's pool lives as long as the span.
                            unsafe {
                                record_forward(&self.device, cmd, &recording, None, timer, &copies)
                            }
                        })
                        .and_then(|cmd| {
                            span.recorded.insert(self, &exec, key, cmd);
                            self.submit_recorded(&exec, cmd)
                        }),
                }
            }
        };
        let read_start = std::time::Instant::now();
        // A wait of the persistent kernel that gave up leaves wrong results:
        // the span goes back to staged layers and runs the forward again
        // (x is uploaded afresh; the KV rows it wrote are rewritten).
        if let (Ok(()), Some(p)) = (&submitted, span.persistent.as_ref()) {
            if persistent_on && !p.held(self)? {
                eprintln!(
                    "fish-vk: a grid-wide wait of the persistent decode layers gave up ({} \
                     workgroups are not resident at once on this device): staged layers from now on",
                    p.mode.groups
                );
                for r in &runs {
                    span.kv.truncate(r.slot, r.first);
                }
                self.span_set_persistent(span, None)?;
                return self.span_run(span, x, n_tok, placement, logit_rows);
            }
        }
        // So does a decode wait that gave up (an attention's q/k/v or wo's
        // heads never arrived: the GPU did not run the workgroups they wait
        // for beside the waiting ones): barriers from now on.
        if let (Ok(()), true) = (&submitted, overlap_on) {
            let flag = span.arena.step_upload.read_f32_vec(
                &self.allocator,
                (STEP_DEVICE_WORDS * 4) as u64,
                1,
            )?;
            if flag[0].to_bits() != 0 {
                eprintln!(
                    "fish-vk: a decode wait (the attention's for its q/k/v rows, or wo's for \
                     the attention) gave up: barriers after q/k/v and the attention from now on"
                );
                for r in &runs {
                    span.kv.truncate(r.slot, r.first);
                }
                span.qkv_overlap_gave_up = true;
                span.recorded.clear(self);
                return self.span_run(span, x, n_tok, placement, logit_rows);
            }
        }
        if let Err(e) = submitted {
            // Each slot's positions from its first row on may hold partial writes.
            for r in &runs {
                span.kv.truncate(r.slot, r.first);
            }
            return Err(e);
        }
        let n_result = result_bytes as usize / 4;
        let result = match (logit_rows, span.output.as_ref()) {
            (Some(_), Some(o)) => o.readback.read_f32_vec(&self.allocator, 0, n_result)?,
            _ => span
                .arena
                .readback
                .read_f32_vec(&self.allocator, 0, n_result)?,
        };
        for r in &runs {
            span.kv.set_len(r.slot, r.end);
        }
        if let Some(t) = span.forward_timer.as_mut() {
            let marks = ForwardMarks {
                start,
                submit: submit_start,
                read: read_start,
                end: std::time::Instant::now(),
                recorded: recorded_now,
            };
            t.collect(&self.device, marks)?;
        }
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

/// The copies around the layers: x (and the step buffer) in, the
/// result (x or logits: device buffer, host buffer; bytes) out.
struct Copies {
    upload: vk::Buffer,
    x_dev: vk::Buffer,
    x_bytes: u64,
    step_upload: vk::Buffer,
    step: vk::Buffer,
    /// The split scratch and the bytes of its arrival counters, zeroed first.
    split: (vk::Buffer, u64),
    /// The key-split attention's scratch and the bytes of its counters.
    attn_split: (vk::Buffer, u64),
    /// The narrow gate/up's scratch and the bytes of its counters, where
    /// that kernel may run.
    gate_up_arrivals: Option<(vk::Buffer, u64)>,
    /// The persistent layers' scratch, the bytes of its failure word and
    /// counters (zeroed first), and the failure word's host copy.
    persistent: Option<(vk::Buffer, u64, vk::Buffer)>,
    /// Bytes of the step buffer copied in: the step words, and where q/k/v
    /// and the attention overlap the (zero) arrival words after them
    /// (step.rs `QKV_ARRIVALS_AT`).
    step_bytes: u64,
    result: (Option<(vk::Buffer, vk::Buffer)>, u64),
}

/// Refuses `rows` of logits the forward or the span cannot return.
fn check_logit_rows(span: &Span, rows: usize, n_tok: usize) -> Result<()> {
    if rows == 0 || rows > n_tok || rows > span.max_logit_rows() {
        return Err(VkError::Input(format!(
            "{rows} rows of logits from a forward of {n_tok} tokens (the span returns at most {})",
            span.max_logit_rows()
        )));
    }
    Ok(())
}

/// What the output stage of a logits forward records.
fn output_recording<'a>(
    gpu: &Gpu,
    output: Option<&SpanOutput>,
    bindings: &'a Bindings,
    norm: Option<u32>,
    rows: usize,
    n_tok: usize,
    layout: TokenLayout,
) -> Result<OutputRecording<'a>> {
    let missing = || VkError::Input("this span does not run the output".into());
    let o = output.ok_or_else(missing)?;
    // The fused norm reads x from its first token: every row must be a logits row.
    let fused_sets = bindings
        .output_norm
        .as_ref()
        .filter(|_| rows == n_tok && rows <= MATVEC_MAX_TOKENS);
    // Rows the layers would multiply on int8 activations take them here
    // too, so that every logits row of a verification round is one-token
    // decode's, bit for bit.
    let int8_sets = bindings
        .output_int8
        .as_ref()
        .filter(|_| output_takes_int8(gpu, bindings, rows, layout));
    let (sets, plan, input) = match (fused_sets, int8_sets) {
        (Some(f), _) => (
            &f.sets,
            gpu.plan_handles(&[o.weight], rows, Kernel::MatvecNorm)?,
            OutputInput::Fused,
        ),
        (None, Some(q)) => (
            &q.sets,
            gpu.plan_handles(
                &[o.weight],
                rows,
                gpu.int8_span_kernel(&[o.weight], super::record::step_rows(layout, rows)),
            )?,
            OutputInput::Int8,
        ),
        (None, None) => (
            &bindings.output.as_ref().ok_or_else(missing)?.sets,
            gpu.plan_handles(
                &[o.weight],
                rows,
                output_kernel(gpu, bindings, rows, layout),
            )?,
            OutputInput::Float,
        ),
    };
    if plan.len() != sets.len() {
        return Err(VkError::Input(
            "output plan does not match its descriptor sets".into(),
        ));
    }
    Ok(OutputRecording {
        plan,
        sets,
        norm: norm.ok_or_else(missing)?,
        rows,
        n_tok,
        input,
    })
}

/// Records a whole forward: inputs in, every layer (and the output), the
/// result out to host-visible memory.
unsafe fn record_forward(
    d: &ash::Device,
    cmd: vk::CommandBuffer,
    recording: &Recording<'_>,
    profiler: Option<&mut Profiler>,
    timer: Option<&ForwardTimer>,
    c: &Copies,
) {
    if let Some(t) = timer {
        t.record_start(d, cmd);
    }
    let region = |size| {
        [vk::BufferCopy {
            src_offset: 0,
            dst_offset: 0,
            size,
        }]
    };
    d.cmd_copy_buffer(cmd, c.upload, c.x_dev, &region(c.x_bytes));
    d.cmd_copy_buffer(cmd, c.step_upload, c.step, &region(c.step_bytes));
    d.cmd_fill_buffer(cmd, c.split.0, 0, c.split.1, 0);
    d.cmd_fill_buffer(cmd, c.attn_split.0, 0, c.attn_split.1, 0);
    if let Some((arrivals, bytes)) = c.gate_up_arrivals {
        d.cmd_fill_buffer(cmd, arrivals, 0, bytes, 0);
    }
    if let Some((scratch, header, _)) = c.persistent {
        d.cmd_fill_buffer(cmd, scratch, 0, header, 0);
    }
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
    if c.result.0.is_some() || c.persistent.is_some() {
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
    }
    if let (Some((src, dst)), bytes) = c.result {
        d.cmd_copy_buffer(cmd, src, dst, &region(bytes));
    }
    if let Some((scratch, _, failure)) = c.persistent {
        // The failure word (scratch word 0).
        d.cmd_copy_buffer(cmd, scratch, failure, &region(4));
    }
    // Logits the projection wrote to host memory come from the compute stage.
    barrier(
        d,
        cmd,
        (
            vk::PipelineStageFlags::TRANSFER | vk::PipelineStageFlags::COMPUTE_SHADER,
            vk::AccessFlags::TRANSFER_WRITE | vk::AccessFlags::SHADER_WRITE,
        ),
        (vk::PipelineStageFlags::HOST, vk::AccessFlags::HOST_READ),
    );
    if let Some(t) = timer {
        t.record_end(d, cmd);
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

/// The layout of a forward placed as `placement`, whose rows group into
/// the slot runs `runs` (`Placement::slot_runs`): a batched forward with one
/// run per row has every row in a slot of its own.
fn token_layout(placement: &Placement<'_>, runs: &[SlotRun]) -> TokenLayout {
    match placement {
        Placement::Consecutive { .. } => TokenLayout::Consecutive,
        Placement::Rows(rows) if runs.len() == rows.len() => TokenLayout::PerSlot,
        Placement::Rows(_) if runs.len() == 1 => TokenLayout::OneSlot,
        Placement::Rows(_) => TokenLayout::PerRow,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_per_slot_only_when_no_two_rows_share_a_slot() {
        let row = |slot, pos| SpanRow { slot, pos };
        let run = |slot, first, end| SlotRun { slot, first, end };
        let distinct = [row(0, 5), row(1, 3)];
        let runs = [run(0, 5, 6), run(1, 3, 4)];
        assert_eq!(
            token_layout(&Placement::Rows(&distinct), &runs),
            TokenLayout::PerSlot
        );
        // A prompt's rows: one slot, consecutive positions.
        let prompt = [row(1, 0), row(1, 1)];
        assert_eq!(
            token_layout(&Placement::Rows(&prompt), &[run(1, 0, 2)]),
            TokenLayout::OneSlot
        );
        // Two prompts' rows: slots shared by rows, more than one run.
        let two = [row(1, 0), row(1, 1), row(2, 0)];
        assert_eq!(
            token_layout(&Placement::Rows(&two), &[run(1, 0, 2), run(2, 0, 1)]),
            TokenLayout::PerRow
        );
        assert_eq!(
            token_layout(&Placement::Consecutive { pos0: 3 }, &[run(0, 3, 5)]),
            TokenLayout::Consecutive
        );
    }
}
