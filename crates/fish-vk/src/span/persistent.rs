//! Persistent decode layers (shaders/span_persistent_layer.comp): each
//! layer of a single-token forward as ONE dispatch of resident workgroups,
//! its six phases (q/k/v, attention, wo, gate/up, the activation's int8
//! copy, down), three of them after grid-wide waits and two polling the
//! tagged values they read, instead of dispatch boundaries and barriers,
//! on int8 activations. Opt-in
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
use super::pipelines::{module_pipeline, push_layout};
use crate::buffer::{Buffer, MemoryKind};
use crate::error::{Result, VkError};
use crate::gpu::Gpu;
use crate::int8_dot::{int8_token_bytes, Int8Dot};
use crate::pipeline::storage_array_set_layout;
use crate::pipeline_stats::PipelineStats;
use crate::upload::TensorHandle;
use crate::weight_format::WeightFormat;
use ash::vk;
use fish_gguf::GgmlType;

/// Single-buffer bindings of the kernel's set: x, the layer's keys and
/// values, the parameters, the scratch, the step buffer; then binding
/// MATRIX_ARRAY_BINDING, the seven matrices as one array.
pub(crate) const PERSISTENT_BINDINGS: u32 = 6;
pub(crate) const MATRIX_ARRAY_BINDING: u32 = PERSISTENT_BINDINGS;
/// Matrices of a layer (the array binding's descriptors).
pub(crate) const LAYER_MATRICES: u32 = 7;
/// Descriptors of one set.
pub(crate) const PERSISTENT_DESCRIPTORS: u32 = PERSISTENT_BINDINGS + LAYER_MATRICES;
/// Push-constant words (`Layer` in the shader).
const PUSH_WORDS: usize = 17;
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
/// Scratch words per arrival counter and slot alignment (256 bytes: no
/// cache line holds two of them).
const LINE_WORDS: usize = 64;

/// How a span runs its persistent layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PersistentMode {
    /// Workgroups per dispatch: all must be resident on the device at once.
    pub groups: u32,
    /// One dispatch per stage with barriers between them (the same code
    /// without grid-wide waits), to measure what the waits save.
    pub per_phase: bool,
}

impl PersistentMode {
    /// `FISH_GPU_PERSISTENT=N` (1..=65535 workgroups) and
    /// `FISH_GPU_PERSISTENT_PER_PHASE=1`; None when unset.
    pub fn from_env() -> Option<PersistentMode> {
        let groups = std::env::var("FISH_GPU_PERSISTENT")
            .ok()?
            .trim()
            .parse::<u32>()
            .ok()
            .filter(|g| (1..=65535).contains(g))?;
        Some(PersistentMode {
            groups,
            per_phase: std::env::var("FISH_GPU_PERSISTENT_PER_PHASE").as_deref() == Ok("1"),
        })
    }
}

/// The kernel's pipeline, on a layout of its own.
pub(crate) struct PersistentPipeline {
    pub set_layout: vk::DescriptorSetLayout,
    pub layout: vk::PipelineLayout,
    module: vk::ShaderModule,
    pub pipeline: vk::Pipeline,
}

impl PersistentPipeline {
    fn new(device: &ash::Device, stats: Option<&PipelineStats>) -> Result<PersistentPipeline> {
        const NAME: &str = "span_persistent_layer";
        let mut out = PersistentPipeline {
            set_layout: persistent_set_layout(device)?,
            layout: vk::PipelineLayout::null(),
            module: vk::ShaderModule::null(),
            pipeline: vk::Pipeline::null(),
        };
        let built = push_layout(device, out.set_layout, PUSH_WORDS).and_then(|layout| {
            out.layout = layout;
            (out.module, out.pipeline) = module_pipeline(device, layout, NAME, stats)?;
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
}

/// The kernel's set layout: PERSISTENT_BINDINGS single buffers, then the
/// array of the layer's matrices.
fn persistent_set_layout(device: &ash::Device) -> Result<vk::DescriptorSetLayout> {
    let mut counts = vec![1; PERSISTENT_BINDINGS as usize];
    counts.push(LAYER_MATRICES);
    storage_array_set_layout(device, &counts)
}

/// A span's persistent layers: the pipeline, the scratch (failure word,
/// one arrival counter per layer, the tagged values of the activation and
/// of q | k | v, the int8 slots), the failure word's host copy, and each
/// layer's push constants.
pub(crate) struct Persistent {
    pub mode: PersistentMode,
    pub pipeline: PersistentPipeline,
    pub scratch: Buffer,
    pub failure: Buffer,
    pub push: Vec<[u32; PUSH_WORDS]>,
    /// Scratch words zeroed before every forward (`Header`).
    header_words: usize,
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
/// likewise (`qkv_tags`); the slots follow (`slots0`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Header {
    act_tags: usize,
    qkv_tags: usize,
    slots0: usize,
}

impl Header {
    fn new(n_layers: usize, n_ff: usize, qkv: usize) -> Header {
        let line = |n: usize| n.next_multiple_of(LINE_WORDS);
        let act_tags = LINE_WORDS * (1 + n_layers);
        let qkv_tags = act_tags + line(2 * n_ff);
        Header {
            act_tags,
            qkv_tags,
            slots0: qkv_tags + line(2 * qkv),
        }
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
        let line = |n: usize| n.next_multiple_of(LINE_WORDS);
        let header = Header::new(layers.len(), n_ff, s.q_dim() + 2 * s.k_dim());
        // The shader's slots: wo's int8 input, down's int8 input.
        let int8_words = |n: usize| int8_token_bytes(n) / 4;
        let words = header.slots0 + line(int8_words(s.q_dim())) + line(int8_words(n_ff));
        let push = layers
            .iter()
            .zip(&params.layers)
            .enumerate()
            .map(|(il, (l, lp))| {
                let types = layer_tensors(l)
                    .iter()
                    .enumerate()
                    .filter(|(_, h)| h.ty() == WeightFormat::Ggml(GgmlType::Q6_K))
                    .fold(0u32, |bits, (t, _)| bits | 1 << t);
                [
                    s.n_embd as u32,
                    l.n_ff as u32,
                    (s.n_head | s.n_head_kv << 16) as u32,
                    s.head_dim as u32,
                    s.rms_eps.to_bits(),
                    s.attn_scale.to_bits(),
                    mode.groups,
                    u32::from(s.rope == SpanRope::Neox),
                    types,
                    lp.attn_norm,
                    lp.ffn_norm,
                    params.rope_tables[l.rope_table],
                    (LINE_WORDS * (1 + il)) as u32,
                    header.slots0 as u32,
                    header.act_tags as u32,
                    header.qkv_tags as u32,
                    0,
                ]
            })
            .collect();
        let pipeline = PersistentPipeline::new(&self.device, self.pipelines.stats.as_ref())?;
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
            push,
            header_words: header.slots0,
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
    /// The dispatches of layer `il`: one, or one per stage (with the stage
    /// each belongs to, for the profile), each to be followed by a barrier.
    pub fn dispatches(&self, il: usize) -> Vec<([u32; PUSH_WORDS], bool)> {
        let p = self.persistent;
        let push = p.push[il];
        if !p.mode.per_phase {
            return vec![(push, false)];
        }
        (0..PHASES)
            .map(|g| {
                let mut one = push;
                one[PUSH_WORDS - 1] = g | (g + 1) << 16;
                // Stage 1 is the attention.
                (one, g == 1)
            })
            .collect()
    }
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

    #[test]
    fn counters_tags_and_the_failure_word_sit_on_lines_of_their_own() {
        // 3 llama-8b layers: 28,672 tag words of the activation, 12,288 of
        // q | k | v.
        let h = Header::new(3, 14336, 6144);
        assert_eq!(h.act_tags, 4 * LINE_WORDS);
        assert_eq!(h.qkv_tags, h.act_tags + 2 * 14336);
        assert_eq!(h.slots0, h.qkv_tags + 2 * 6144);
        assert!([h.act_tags, h.qkv_tags, h.slots0]
            .iter()
            .all(|w| w % LINE_WORDS == 0));
        // Values that do not fill a line still take a whole one.
        let h = Header::new(0, 1024, 100);
        assert_eq!(h.slots0 - h.qkv_tags, 4 * LINE_WORDS);
    }
}
