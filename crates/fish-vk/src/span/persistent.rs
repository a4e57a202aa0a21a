//! Persistent decode layers (shaders/span_persistent_layer.comp): each
//! layer of a single-token forward as ONE dispatch of resident workgroups,
//! its six phases (q/k/v, attention, wo, gate/up, the activation's int8
//! copy, down), three of them after grid-wide waits and two polling the
//! tagged values they read, instead of dispatch boundaries and barriers,
//! on int8 activations; or the span's layers in one dispatch
//! (`FISH_GPU_PERSISTENT_SPAN=1`), each layer after a grid-wide wait for
//! the one before. Opt-in
//! (`FISH_GPU_PERSISTENT=N`, N workgroups, or
//! `Gpu::span_set_persistent`): every workgroup must be resident at once,
//! which only the caller knows of its device. A wait that gives up raises
//! the failure word; the span then goes back to staged layers and runs
//! that forward again.
//!
//! The kernel takes llama layers whose matrices are Q4_K or Q6_K in one
//! buffer each (the Q4_K_M mix), without biases, q/k norms, post-norms or
//! sliding windows, SwiGLU, RoPE over whole heads; `unfit` says why a span
//! does not qualify.

use super::desc::{LayerTensors, SpanActivation, SpanRope, SpanShape};
use super::params::Params;
use super::pipelines::push_layout;
use super::profile::SpanStage;
use crate::buffer::{Buffer, MemoryKind};
use crate::error::{Result, VkError};
use crate::gpu::Gpu;
use crate::int8_dot::{int8_token_bytes, Int8Dot};
use crate::pipeline::{module_compute_pipeline, storage_array_set_layout};
use crate::pipeline_stats::PipelineStats;
use crate::upload::TensorHandle;
use crate::weight_format::WeightFormat;
use ash::vk;
use fish_gguf::GgmlType;

/// The most layers of one dispatch (`MAX_LAYERS` in the shader: a byte of
/// the push constants' types each).
const MAX_DISPATCH_LAYERS: usize = 32;
/// The kernel's set: x; the keys and the values of each of its layers (two
/// arrays, a slot per layer); the parameters, the scratch, the step
/// buffer; then the seven matrices of each of its layers as one array
/// (MATRIX_ARRAY_BINDING). Its layer slots (`SET_SLOTS` in the shader)
/// follow from the storage buffers the device binds per stage.
pub(crate) const KEYS_BINDING: u32 = 1;
pub(crate) const VALUES_BINDING: u32 = 2;
pub(crate) const MATRIX_ARRAY_BINDING: u32 = 6;
/// The set's single buffers: x, the parameters, the scratch, the step
/// buffer.
pub(crate) const SINGLE_BINDINGS: [u32; 4] = [0, 3, 4, 5];
/// Matrices of a layer.
pub(crate) const LAYER_MATRICES: u32 = 7;
/// Single buffers of the set, and descriptors per layer slot.
const SET_SINGLES: u32 = SINGLE_BINDINGS.len() as u32;
const SLOT_DESCRIPTORS: u32 = 2 + LAYER_MATRICES;

/// Layer slots of the set on a device that binds `max_buffers` storage
/// buffers per stage (0: not even one layer's).
fn set_slots(max_buffers: u32) -> usize {
    (max_buffers.saturating_sub(SET_SINGLES) / SLOT_DESCRIPTORS).min(MAX_DISPATCH_LAYERS as u32)
        as usize
}

/// Descriptors of each binding of a set of `slots` layers.
fn binding_counts(slots: usize) -> [u32; 7] {
    let n = slots as u32;
    let mut counts = [1; 7];
    counts[KEYS_BINDING as usize] = n;
    counts[VALUES_BINDING as usize] = n;
    counts[MATRIX_ARRAY_BINDING as usize] = LAYER_MATRICES * n;
    counts
}

/// Push-constant words (`Layers` in the shader): 21, then a byte of types
/// per layer.
const PUSH_WORDS: usize = TYPES_WORD + MAX_DISPATCH_LAYERS / 4;
/// The push constants' first word of types.
const TYPES_WORD: usize = 21;
/// The scores of the positions attended share the staging's shared memory
/// (MAX_EMBD / 4 words): tokens at positions from this on take the staged
/// recording.
pub const PERSISTENT_MAX_POSITIONS: usize = 2048;
/// The longest feed-forward row.
const MAX_IN: usize = 14336;
/// The widest n_embd (the staging holds its int8 copy).
const MAX_EMBD: usize = 8192;
/// Phases of a layer; the attention is phase 1.
const PHASES: u32 = 6;
/// The widest head (MAX_D).
const MAX_HEAD_DIM: usize = 128;
/// Runs of a head's attention, at most (MAX_RUNS), and the scratch words
/// from one head's counter to the next's.
const MAX_ATTENTION_RUNS: usize = 16;
const ATTENTION_COUNTER_WORDS: usize = 16;
/// Scratch words per arrival counter and slot alignment (256 bytes: no
/// cache line holds two of them).
const LINE_WORDS: usize = 64;

/// What one dispatch of the kernel runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PersistentDispatch {
    /// A layer.
    Layer,
    /// A stage of a layer, with barriers between them (the same code
    /// without grid-wide waits), to measure what the waits save.
    Phase,
    /// Consecutive layers, as many as a set holds (up to 32, fewer where
    /// the device binds fewer storage buffers; a layer's first matvec round
    /// then loads while the layer before ends, and no dispatch boundary
    /// comes between them).
    Span,
}

/// How a span runs its persistent layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PersistentMode {
    /// Workgroups per dispatch: all must be resident on the device at once.
    pub groups: u32,
    pub dispatch: PersistentDispatch,
}

impl PersistentMode {
    /// `FISH_GPU_PERSISTENT=N` (1..=65535 workgroups), with
    /// `FISH_GPU_PERSISTENT_PER_PHASE=1` or `FISH_GPU_PERSISTENT_SPAN=1`;
    /// None when unset.
    pub fn from_env() -> Option<PersistentMode> {
        let groups = std::env::var("FISH_GPU_PERSISTENT")
            .ok()?
            .trim()
            .parse::<u32>()
            .ok()
            .filter(|g| (1..=65535).contains(g))?;
        let on = |name: &str| std::env::var(name).as_deref() == Ok("1");
        let dispatch = if on("FISH_GPU_PERSISTENT_PER_PHASE") {
            PersistentDispatch::Phase
        } else if on("FISH_GPU_PERSISTENT_SPAN") {
            PersistentDispatch::Span
        } else {
            PersistentDispatch::Layer
        };
        Some(PersistentMode { groups, dispatch })
    }
}

/// The kernel's pipeline, on a layout of its own.
pub(crate) struct PersistentPipeline {
    /// Layer slots of its set (`SET_SLOTS`).
    pub slots: usize,
    pub set_layout: vk::DescriptorSetLayout,
    pub layout: vk::PipelineLayout,
    module: vk::ShaderModule,
    pub pipeline: vk::Pipeline,
}

impl PersistentPipeline {
    fn new(
        device: &ash::Device,
        slots: usize,
        stats: Option<&PipelineStats>,
    ) -> Result<PersistentPipeline> {
        const NAME: &str = "span_persistent_layer";
        let mut out = PersistentPipeline {
            slots,
            set_layout: storage_array_set_layout(device, &binding_counts(slots))?,
            layout: vk::PipelineLayout::null(),
            module: vk::ShaderModule::null(),
            pipeline: vk::Pipeline::null(),
        };
        let built = push_layout(device, out.set_layout, PUSH_WORDS).and_then(|layout| {
            out.layout = layout;
            let flags = vk::PipelineShaderStageCreateFlags::empty();
            let spec = [slots as u32];
            (out.module, out.pipeline) =
                module_compute_pipeline(device, layout, NAME, &spec, flags, stats)?;
            Ok(())
        });
        match built {
            Ok(()) => Ok(out),
            Err(e) => {
                out.destroy(device);
                Err(e)
            }
        }
    }

    fn destroy(&self, device: &ash::Device) {
        // SAFETY: no command buffer using them is pending (callers wait);
        // null handles are ignored.
        unsafe {
            device.destroy_pipeline(self.pipeline, None);
            device.destroy_shader_module(self.module, None);
            device.destroy_pipeline_layout(self.layout, None);
            device.destroy_descriptor_set_layout(self.set_layout, None);
        }
    }

    /// Descriptors of one set.
    pub fn set_descriptors(&self) -> u32 {
        binding_counts(self.slots).iter().sum()
    }
}

/// A span's persistent layers: the pipeline, the scratch (failure word,
/// one arrival counter per layer, the tagged values of the activation and
/// of q | k | v, the int8 slots), the failure word's host copy, and the
/// push constants of each dispatch.
pub(crate) struct Persistent {
    pub mode: PersistentMode,
    pub pipeline: PersistentPipeline,
    pub scratch: Buffer,
    pub failure: Buffer,
    dispatches: Vec<Dispatch>,
    /// Scratch words zeroed before every forward (`Header`).
    header_words: usize,
}

/// One dispatch of a forward: its set (the set of its layers), push
/// constants, whether it begins a layer (for the profile) and the stage it
/// is timed as.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dispatch {
    pub set: usize,
    pub push: [u32; PUSH_WORDS],
    pub starts_layer: bool,
    pub stage: SpanStage,
}

impl Persistent {
    /// Bytes zeroed before every forward: the failure word, the counters
    /// and the tagged values.
    pub fn header_bytes(&self) -> u64 {
        (self.header_words * 4) as u64
    }

    /// Whether a forward of `n_tok` tokens from position `pos0`, plain
    /// (one sequence at consecutive positions of slot 0), takes the kernel.
    pub fn takes(n_tok: usize, consecutive: bool, pos0: usize) -> bool {
        n_tok == 1 && consecutive && pos0 < PERSISTENT_MAX_POSITIONS
    }

    /// Whether the last forward's waits all held (its failure word, copied
    /// to host memory at its end, is zero).
    pub fn held(&self, gpu: &Gpu) -> Result<bool> {
        let word = self.failure.read_f32_vec(&gpu.allocator, 0, 1)?;
        Ok(word[0].to_bits() == 0)
    }

    pub fn release(self, gpu: &Gpu) {
        self.pipeline.destroy(&gpu.device);
        gpu.release(self.scratch);
        gpu.release(self.failure);
    }
}

/// Where the scratch words zeroed before every forward lie: the failure
/// word's line, one line per layer's arrival counter, the activation's
/// values with their layers' tags, two words each (`act_tags`), q | k | v
/// likewise (`qkv_tags`), the attention's counters, one per query head
/// (`attn_counts`), all before `attn_parts` (`zeroed_words`). Then the
/// attention runs' partial results (`attn_parts`: per head MAX_ATTENTION_RUNS runs of
/// head_dim + 2 words), and the slots (`slots0`): per layer wo's int8
/// input and down's, each line-aligned, `slot_stride` words a layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Header {
    act_tags: usize,
    qkv_tags: usize,
    attn_counts: usize,
    attn_parts: usize,
    slots0: usize,
    slot_stride: usize,
}

/// The attention's part of the scratch: query heads and their width.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Heads {
    n_head: usize,
    head_dim: usize,
}

impl Header {
    fn new(n_layers: usize, n_ff: usize, heads: Heads, kv_dim: usize) -> Header {
        let line = |n: usize| n.next_multiple_of(LINE_WORDS);
        let int8_words = |n: usize| int8_token_bytes(n) / 4;
        let q_dim = heads.n_head * heads.head_dim;
        let act_tags = LINE_WORDS * (1 + n_layers);
        let qkv_tags = act_tags + line(2 * n_ff);
        let attn_counts = qkv_tags + line(2 * (q_dim + 2 * kv_dim));
        let attn_parts = attn_counts + line(ATTENTION_COUNTER_WORDS * heads.n_head);
        let parts = heads.n_head * MAX_ATTENTION_RUNS * (heads.head_dim + 2);
        Header {
            act_tags,
            qkv_tags,
            attn_counts,
            attn_parts,
            slots0: attn_parts + line(parts),
            slot_stride: line(int8_words(q_dim)) + line(int8_words(n_ff)),
        }
    }

    /// Scratch words zeroed before every forward: all before the runs'
    /// parts, which each run writes before its merge reads them.
    fn zeroed_words(&self) -> usize {
        self.attn_parts
    }

    /// Scratch words in all, for `n_layers` layers.
    fn words(&self, n_layers: usize) -> usize {
        self.slots0 + n_layers * self.slot_stride
    }
}

/// Why the kernel does not take a span of `shape` and `layers` on `gpu`,
/// or None where it does.
pub(crate) fn unfit(
    gpu: &Gpu,
    shape: &SpanShape,
    layers: &[LayerTensors],
    params: &Params,
) -> Option<String> {
    let s = shape;
    let info = gpu.info();
    // A row's invocations are whole subgroups: rows of a multiple of 1024
    // values give 32 units per 1024 (matvec_units.glsl).
    let width = |n: usize| n >= 1024 && n.is_multiple_of(1024) && n <= MAX_IN;
    if !info.subgroup_arithmetic || !(8..=32).contains(&info.subgroup_size) {
        return Some("needs subgroup arithmetic and subgroups of 8 to 32".into());
    }
    if info.int8_dot == Int8Dot::Absent {
        return Some("needs packed int8 dot products".into());
    }
    if !info.storage_array_indexing {
        return Some("needs storage buffer arrays indexed dynamically".into());
    }
    if set_slots(info.max_stage_storage_buffers) == 0 {
        return Some(format!(
            "needs {} storage buffers per stage (the device binds {})",
            SET_SINGLES + SLOT_DESCRIPTORS,
            info.max_stage_storage_buffers
        ));
    }
    if info.max_shared_memory < 32 << 10 {
        return Some("needs 32 KB of shared memory per workgroup".into());
    }
    if !width(s.n_embd) || s.n_embd > MAX_EMBD || s.q_dim() != s.n_embd {
        return Some(format!(
            "n_embd {} (a multiple of 1024 up to {MAX_EMBD}, as wide as the heads)",
            s.n_embd
        ));
    }
    if !s.head_dim.is_multiple_of(32)
        || s.head_dim > MAX_HEAD_DIM
        || s.head_dim_v != s.head_dim
        || s.n_rot != s.head_dim
        || s.n_head >= 1 << 16
    {
        return Some(format!(
            "heads of {} / {} values with {} rotated (a multiple of 32 up to {MAX_HEAD_DIM}, all rotated)",
            s.head_dim, s.head_dim_v, s.n_rot
        ));
    }
    if s.activation != SpanActivation::SwiGlu {
        return Some("a GeGLU feed-forward".into());
    }
    for (il, (l, lp)) in layers.iter().zip(&params.layers).enumerate() {
        let extras = [
            lp.bq,
            lp.bk,
            lp.bv,
            lp.q_norm,
            lp.k_norm,
            lp.post_attn_norm,
            lp.post_ffn_norm,
        ];
        if extras.iter().any(Option::is_some) || l.window != 0 {
            return Some(format!(
                "layer {il} has biases, q/k norms, post-norms or a sliding window"
            ));
        }
        if !width(l.n_ff) {
            return Some(format!("layer {il}: n_ff {}", l.n_ff));
        }
        let tensors = layer_tensors(l);
        if let Some(h) = tensors.iter().find(|h| !takes_type(h.ty())) {
            return Some(format!("layer {il}: a {} matrix", h.ty().name()));
        }
        if l.gate_up[0].ty() != l.gate_up[1].ty() {
            return Some(format!("layer {il}: gate and up of different types"));
        }
        if let Err(e) = tensors
            .iter()
            .try_for_each(|&h| single_buffer(gpu, h).map(|_| ()))
        {
            return Some(format!("layer {il}: {e}"));
        }
    }
    None
}

fn takes_type(ty: WeightFormat) -> bool {
    matches!(ty, WeightFormat::Ggml(GgmlType::Q4_K | GgmlType::Q6_K))
}

/// A layer's tensors in the order of the matrix array.
pub(crate) fn layer_tensors(l: &LayerTensors) -> [TensorHandle; LAYER_MATRICES as usize] {
    let [q, k, v] = l.qkv;
    let [gate, up] = l.gate_up;
    [q, k, v, l.wo, gate, up, l.down]
}

/// The one device buffer holding `h` (the kernel reads each matrix from a
/// single binding), checked to have the row stride the kernel assumes.
pub(crate) fn single_buffer(gpu: &Gpu, h: TensorHandle) -> Result<vk::Buffer> {
    let tensors = gpu.lock_tensors();
    let t = tensors.get(&h.id()).ok_or(VkError::UnknownHandle(h.id()))?;
    let row = (h.n_in() / h.ty().block_size() * h.ty().block_bytes()) as u64;
    match t.chunks.as_slice() {
        [one] if t.row_stride == row.next_multiple_of(16) => Ok(one.buffer.raw),
        _ => Err(VkError::Input(format!(
            "the {}x{} matrix is held in {} buffers",
            h.n_in(),
            h.n_out(),
            t.chunks.len()
        ))),
    }
}

impl Gpu {
    /// The kernel's state for a span: pipeline, scratch, host copy of the
    /// failure word, per-layer push constants. Refused (nothing held) where
    /// `unfit` says so.
    pub(crate) fn persistent_new(
        &self,
        mode: PersistentMode,
        shape: &SpanShape,
        layers: &[LayerTensors],
        params: &Params,
    ) -> Result<Persistent> {
        if let Some(why) = unfit(self, shape, layers, params) {
            return Err(VkError::KernelUnavailable(format!(
                "persistent decode layers: {why}"
            )));
        }
        if mode.groups == 0 {
            return Err(VkError::Input("persistent layers on 0 workgroups".into()));
        }
        let s = shape;
        let n_ff = layers.iter().map(|l| l.n_ff).max().unwrap_or(0);
        let heads = Heads {
            n_head: s.n_head,
            head_dim: s.head_dim,
        };
        let header = Header::new(layers.len(), n_ff, heads, s.k_dim());
        let words = header.words(layers.len());
        let words_of = layers
            .iter()
            .zip(&params.layers)
            .map(|(l, lp)| LayerWords {
                n_ff: l.n_ff as u32,
                types: layer_tensors(l)
                    .iter()
                    .enumerate()
                    .filter(|(_, h)| h.ty() == WeightFormat::Ggml(GgmlType::Q6_K))
                    .fold(0u32, |bits, (t, _)| bits | 1 << t),
                attn_norm: lp.attn_norm,
                ffn_norm: lp.ffn_norm,
                rope_table: params.rope_tables[l.rope_table],
            })
            .collect::<Vec<_>>();
        let shape_words = [
            s.n_embd as u32,
            (s.n_head | s.n_head_kv << 16) as u32,
            s.head_dim as u32,
            s.rms_eps.to_bits(),
            s.attn_scale.to_bits(),
            mode.groups,
            u32::from(s.rope == SpanRope::Neox),
        ];
        let slots = set_slots(self.info().max_stage_storage_buffers);
        let dispatches = plan_dispatches(mode.dispatch, &words_of, slots)
            .into_iter()
            .map(|(run, phases, stage)| Dispatch {
                set: run.first / slots,
                starts_layer: phases.start == 0,
                push: push_words(&shape_words, &header, &words_of, run, phases, slots),
                stage,
            })
            .collect();
        let pipeline = PersistentPipeline::new(&self.device, slots, self.pipelines.stats.as_ref())?;
        let scratch = match self.alloc((words * 4) as u64, MemoryKind::Device) {
            Ok(b) => b,
            Err(e) => {
                pipeline.destroy(&self.device);
                return Err(e);
            }
        };
        let failure = match self.alloc(16, MemoryKind::Readback) {
            Ok(b) => b,
            Err(e) => {
                pipeline.destroy(&self.device);
                self.release(scratch);
                return Err(e);
            }
        };
        Ok(Persistent {
            mode,
            pipeline,
            scratch,
            failure,
            dispatches,
            header_words: header.zeroed_words(),
        })
    }
}

/// What a recording of persistent layers needs.
pub(crate) struct PersistentRecording<'a> {
    pub persistent: &'a Persistent,
    /// One set per layer.
    pub sets: &'a [vk::DescriptorSet],
}

impl PersistentRecording<'_> {
    /// The forward's dispatches, in order, each to be followed by a barrier.
    pub fn dispatches(&self) -> &[Dispatch] {
        &self.persistent.dispatches
    }
}

/// What the push constants say of one layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct LayerWords {
    n_ff: u32,
    /// Bit t: tensor t (`layer_tensors`' order) is Q6_K.
    types: u32,
    /// Float offsets of its norms and RoPE table in the parameters.
    attn_norm: u32,
    ffn_norm: u32,
    rope_table: u32,
}

/// Consecutive layers of one dispatch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct LayerRun {
    first: usize,
    count: usize,
}

/// The floats from a layer's norms to the next layer's where both of
/// `first`'s norms are that far from layer `first + 1`'s (0 for the last
/// layer), else None.
fn norm_stride(layers: &[LayerWords], first: usize) -> Option<u32> {
    let Some(next) = layers.get(first + 1) else {
        return Some(0);
    };
    let a = layers[first];
    let stride = next.attn_norm.checked_sub(a.attn_norm)?;
    (next.ffn_norm.checked_sub(a.ffn_norm)? == stride).then_some(stride)
}

/// Whether layer `next` can join `run` (its layers `run.first` up to
/// `next`): in the same set of `slots` layers, with the same n_ff and RoPE table, its norms
/// one stride further on than the layer before's (the shader steps the
/// norms' offsets by one stride).
fn extends(layers: &[LayerWords], run: LayerRun, next: usize, slots: usize) -> bool {
    let (a, b) = (layers[run.first], layers[next]);
    let Some(stride) = norm_stride(layers, run.first) else {
        return false;
    };
    let at = |first: u32| u64::from(first) + u64::from(stride) * (next - run.first) as u64;
    next / slots == run.first / slots
        && b.n_ff == a.n_ff
        && b.rope_table == a.rope_table
        && u64::from(b.attn_norm) == at(a.attn_norm)
        && u64::from(b.ffn_norm) == at(a.ffn_norm)
}

/// Phases of a layer; a dispatch runs `phases` of each of its layers.
type Phases = std::ops::Range<u32>;

/// The dispatches of a forward as `dispatch` asks: per layer, per phase of
/// each layer, or runs of consecutive layers (`extends`, in sets of `slots`
/// layers); each with the stage it is timed as.
fn plan_dispatches(
    dispatch: PersistentDispatch,
    layers: &[LayerWords],
    slots: usize,
) -> Vec<(LayerRun, Phases, SpanStage)> {
    let one = |il: usize| LayerRun {
        first: il,
        count: 1,
    };
    match dispatch {
        PersistentDispatch::Layer => (0..layers.len())
            .map(|il| (one(il), 0..PHASES, SpanStage::PersistentLayer))
            .collect(),
        PersistentDispatch::Phase => (0..layers.len())
            .flat_map(|il| {
                (0..PHASES).map(move |g| {
                    // Phase 1 is the attention.
                    let stage = if g == 1 {
                        SpanStage::Attention
                    } else {
                        SpanStage::Matvec
                    };
                    (one(il), g..g + 1, stage)
                })
            })
            .collect(),
        PersistentDispatch::Span => {
            let mut runs: Vec<LayerRun> = Vec::new();
            for il in 0..layers.len() {
                match runs.last_mut() {
                    Some(run) if extends(layers, *run, il, slots) => run.count += 1,
                    _ => runs.push(one(il)),
                }
            }
            runs.into_iter()
                .map(|run| (run, 0..PHASES, SpanStage::PersistentLayer))
                .collect()
        }
    }
}

/// The push constants of a dispatch of `run`'s layers (`Layers` in the
/// shader); `shape` holds n_embd, heads, head_dim, eps, attn_scale, the
/// workgroups and the RoPE flags.
fn push_words(
    shape: &[u32; 7],
    header: &Header,
    layers: &[LayerWords],
    run: LayerRun,
    phases: Phases,
    slots: usize,
) -> [u32; PUSH_WORDS] {
    let first = layers[run.first];
    let [n_embd, heads, head_dim, eps, attn_scale, groups, flags] = *shape;
    let stride = if run.count > 1 {
        norm_stride(layers, run.first).unwrap_or(0)
    } else {
        0
    };
    // Each phase alone: first | end << 16; all six: 0.
    let phase_range = if phases == (0..PHASES) {
        0
    } else {
        phases.start | phases.end << 16
    };
    let mut push = [0u32; PUSH_WORDS];
    push[..TYPES_WORD].copy_from_slice(&[
        n_embd,
        first.n_ff,
        heads,
        head_dim,
        eps,
        attn_scale,
        groups,
        flags,
        first.attn_norm,
        first.ffn_norm,
        stride,
        first.rope_table,
        header.slots0 as u32,
        header.slot_stride as u32,
        header.act_tags as u32,
        header.qkv_tags as u32,
        header.attn_counts as u32,
        header.attn_parts as u32,
        phase_range,
        (run.first | run.count << 16) as u32,
        (run.first / slots * slots) as u32,
    ]);
    for (i, l) in layers[run.first..run.first + run.count].iter().enumerate() {
        push[TYPES_WORD + i / 4] |= l.types << (8 * (i % 4));
    }
    push
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_single_plain_tokens_below_the_score_room_take_the_kernel() {
        assert!(Persistent::takes(1, true, 0));
        assert!(Persistent::takes(1, true, PERSISTENT_MAX_POSITIONS - 1));
        assert!(!Persistent::takes(1, true, PERSISTENT_MAX_POSITIONS));
        assert!(!Persistent::takes(2, true, 0));
        assert!(!Persistent::takes(1, false, 0));
    }

    /// Layers of one shape whose norms lie `stride` floats apart.
    fn uniform_layers(n: usize, stride: u32) -> Vec<LayerWords> {
        (0..n as u32)
            .map(|il| LayerWords {
                n_ff: 8192,
                types: il % 2 * 0b100_0100,
                attn_norm: il * stride,
                ffn_norm: il * stride + 2048,
                rope_table: 7 * stride,
            })
            .collect()
    }

    fn runs(plan: &[(LayerRun, Phases, SpanStage)]) -> Vec<(usize, usize)> {
        plan.iter().map(|(r, _, _)| (r.first, r.count)).collect()
    }

    #[test]
    fn a_span_dispatch_takes_consecutive_layers_of_one_set() {
        let layers = uniform_layers(5, 4096);
        let plan = plan_dispatches(PersistentDispatch::Span, &layers, 2);
        assert_eq!(runs(&plan), [(0, 2), (2, 2), (4, 1)]);
        assert!(plan
            .iter()
            .all(|(_, p, s)| *p == (0..PHASES) && *s == SpanStage::PersistentLayer));
        let plan = plan_dispatches(PersistentDispatch::Span, &layers, 32);
        assert_eq!(runs(&plan), [(0, 5)]);
        // Per layer and per phase: one layer each.
        let plan = plan_dispatches(PersistentDispatch::Layer, &layers, 32);
        assert_eq!(runs(&plan), (0..5).map(|il| (il, 1)).collect::<Vec<_>>());
        let plan = plan_dispatches(PersistentDispatch::Phase, &layers, 32);
        assert_eq!(plan.len(), 5 * PHASES as usize);
        assert_eq!(plan[7].1, 1..2);
        assert_eq!(plan[7].2, SpanStage::Attention);
    }

    #[test]
    fn a_layer_unlike_the_one_before_starts_a_dispatch() {
        // Its norms off the stride (layer 2, which then cannot take layer
        // 3 either), its n_ff or its RoPE table another.
        let mut layers = uniform_layers(8, 4096);
        layers[2].ffn_norm += 4;
        layers[5].n_ff = 14336;
        layers[7].rope_table = 0;
        let plan = plan_dispatches(PersistentDispatch::Span, &layers, 32);
        assert_eq!(
            runs(&plan),
            [(0, 2), (2, 1), (3, 2), (5, 1), (6, 1), (7, 1)]
        );
        // The first layer's two norms at different strides from the second's.
        let mut layers = uniform_layers(3, 4096);
        layers[0].ffn_norm += 4;
        let plan = plan_dispatches(PersistentDispatch::Span, &layers, 32);
        assert_eq!(runs(&plan), [(0, 1), (1, 2)]);
    }

    #[test]
    fn push_words_name_the_run_its_set_and_each_layers_types() {
        let layers = uniform_layers(40, 4096);
        let heads = Heads {
            n_head: 32,
            head_dim: 64,
        };
        let header = Header::new(40, 8192, heads, 512);
        let shape = [2048, 32 | 8 << 16, 64, 0, 0, 660, 1];
        let run = LayerRun {
            first: 33,
            count: 6,
        };
        let push = push_words(&shape, &header, &layers, run, 0..PHASES, 32);
        assert_eq!(push[1], 8192);
        // Layer 33's norms, the stride, the RoPE table.
        assert_eq!(push[8..12], [33 * 4096, 33 * 4096 + 2048, 4096, 7 * 4096]);
        assert_eq!(
            push[12..14],
            [header.slots0 as u32, header.slot_stride as u32]
        );
        assert_eq!(
            push[16..18],
            [header.attn_counts as u32, header.attn_parts as u32]
        );
        assert_eq!(push[18], 0, "all six phases");
        assert_eq!(push[19], 33 | 6 << 16);
        assert_eq!(push[20], 32, "the set of layers 32..64");
        // Odd layers have Q6_K v and down: dispatch layers 0, 2, 4 (33, 35, 37).
        assert_eq!(push[21], 0b100_0100 | 0b100_0100 << 16);
        assert_eq!(push[22], 0b100_0100);
        assert!(push[23..].iter().all(|&w| w == 0));
        let one = LayerRun { first: 3, count: 1 };
        let push = push_words(&shape, &header, &layers, one, 4..5, 32);
        assert_eq!(push[10], 0, "no stride for one layer");
        assert_eq!(push[18], 4 | 5 << 16);
    }

    #[test]
    fn a_set_holds_the_layers_the_devices_buffers_allow() {
        assert_eq!(set_slots(12), 0);
        assert_eq!(set_slots(13), 1);
        assert_eq!(set_slots(32), 3);
        assert_eq!(set_slots(1 << 20), MAX_DISPATCH_LAYERS);
        assert_eq!(binding_counts(3).iter().sum::<u32>(), 4 + 3 * 9);
    }

    #[test]
    fn counters_tags_and_the_failure_word_sit_on_lines_of_their_own() {
        // 3 llama-8b layers: 28,672 tag words of the activation, 12,288 of
        // q | k | v.
        let llama_8b = Heads {
            n_head: 32,
            head_dim: 128,
        };
        let h = Header::new(3, 14336, llama_8b, 1024);
        assert_eq!(h.act_tags, 4 * LINE_WORDS);
        assert_eq!(h.qkv_tags, h.act_tags + 2 * 14336);
        assert_eq!(h.attn_counts, h.qkv_tags + 2 * 6144);
        // A counter per head, 16 words apart; the runs' parts not zeroed.
        assert_eq!(h.zeroed_words(), h.attn_counts + 32 * 16);
        assert_eq!(h.attn_parts, h.zeroed_words());
        assert_eq!(h.slots0, h.attn_parts + 32 * 16 * 130);
        assert!([
            h.act_tags,
            h.qkv_tags,
            h.attn_counts,
            h.attn_parts,
            h.slots0,
            h.slot_stride
        ]
        .iter()
        .all(|w| w % LINE_WORDS == 0));
        // Each layer's two int8 inputs apart from every other layer's.
        let int8_words = |n: usize| int8_token_bytes(n) / 4;
        assert!(h.slot_stride >= int8_words(4096) + int8_words(14336));
        assert_eq!(h.words(3), h.slots0 + 3 * h.slot_stride);
        // Values that do not fill a line still take a whole one.
        let one_head = Heads {
            n_head: 1,
            head_dim: 32,
        };
        let h = Header::new(0, 1024, one_head, 34);
        assert_eq!(h.attn_counts - h.qkv_tags, 4 * LINE_WORDS);
        assert_eq!(h.zeroed_words() - h.attn_counts, LINE_WORDS);
    }
}
