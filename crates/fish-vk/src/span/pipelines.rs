//! The span kernels' pipelines: one layout (six storage buffers, up to
//! PUSH_WORDS words of push constants) shared by every span module.

use crate::error::{Result, VkCall};
use crate::pipeline::{module_compute_pipeline, storage_set_layout};
use crate::pipeline_stats::PipelineStats;
use ash::vk;

/// Push-constant words every span kernel may use.
pub(crate) const PUSH_WORDS: usize = 17;
/// Storage buffers per span descriptor set: four per kernel, then the step
/// buffer (the forward's first position) that every set binds, then the
/// parameter buffer for the attention kernel that does RoPE itself
/// (`SpanKernel::AttentionRope`; the other sets leave it unwritten), then
/// the attention's int8 output (the arena's `xn_int8`; attention sets only),
/// then the split attention's scratch (the arena's `attn_split`; attention
/// sets only), then the host-visible step buffer (attention sets only: the
/// failure flag of the overlapped decode attention's waits).
pub(crate) const SPAN_BINDINGS: u32 = 9;

/// The span kernels, by module.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SpanKernel {
    RmsNorm,
    Add,
    Act,
    Rope,
    Attention,
    /// Attention with RoPE and the KV store of its single token fused in.
    AttentionRope,
    /// Attention for the multi-token chunks of plain forwards: one
    /// workgroup per (head, block of `TILED_ATTENTION_QUERIES` tokens),
    /// keys and values staged in shared memory.
    AttentionTiled,
    /// `AttentionTiled` on cooperative matrices, for heads of 64 and of 128
    /// values (shaders/span_attention_coopmat.comp, one workgroup per
    /// (head, block of `COOPMAT_ATTENTION_QUERIES` tokens)): built only on
    /// devices with 16x16x16 f16 fragments and 32-invocation subgroups.
    AttentionCoopMat64,
    AttentionCoopMat128,
    /// `Attention` and `AttentionRope` with each token's keys split across
    /// workgroups (shaders/span_attention_split.comp): built only on
    /// devices with subgroup arithmetic.
    AttentionSplit,
    AttentionSplitRope,
    /// `AttentionSplitRope` dispatched with no barrier after the q/k/v
    /// matvec, each workgroup waiting for its KV head's rows to arrive
    /// (WAIT_QKV): one-token decode steps with `qkv_overlap_wanted`.
    AttentionSplitRopeWait,
}

/// Tokens per workgroup of `SpanKernel::AttentionTiled`
/// (QB in shaders/span_attention_tiled.comp).
pub(crate) const TILED_ATTENTION_QUERIES: usize = 16;

/// Tokens per workgroup of the cooperative-matrix attention kernels (QB in
/// shaders/span_attention_coopmat.comp).
pub(crate) const COOPMAT_ATTENTION_QUERIES: usize = 64;

impl SpanKernel {
    const ALL: [SpanKernel; 7] = [
        SpanKernel::RmsNorm,
        SpanKernel::Add,
        SpanKernel::Act,
        SpanKernel::Rope,
        SpanKernel::Attention,
        SpanKernel::AttentionRope,
        SpanKernel::AttentionTiled,
    ];

    /// The optional kernels on cooperative matrices.
    const COOPMAT: [SpanKernel; 2] = [
        SpanKernel::AttentionCoopMat64,
        SpanKernel::AttentionCoopMat128,
    ];

    /// The optional key-split attention kernels.
    const SPLIT: [SpanKernel; 3] = [
        SpanKernel::AttentionSplit,
        SpanKernel::AttentionSplitRope,
        SpanKernel::AttentionSplitRopeWait,
    ];

    /// The cooperative-matrix attention kernel for heads of `head_dim`
    /// values, if one is compiled for it.
    pub(crate) fn coopmat_attention(head_dim: usize) -> Option<SpanKernel> {
        match head_dim {
            64 => Some(SpanKernel::AttentionCoopMat64),
            128 => Some(SpanKernel::AttentionCoopMat128),
            _ => None,
        }
    }

    fn module(self) -> &'static str {
        match self {
            SpanKernel::RmsNorm => "span_rmsnorm",
            SpanKernel::Add => "span_add",
            SpanKernel::Act => "span_act",
            SpanKernel::Rope => "span_rope",
            SpanKernel::Attention => "span_attention",
            SpanKernel::AttentionRope => "span_attention_rope",
            SpanKernel::AttentionTiled => "span_attention_tiled",
            SpanKernel::AttentionCoopMat64 => "span_attention_coopmat_d64",
            SpanKernel::AttentionCoopMat128 => "span_attention_coopmat_d128",
            SpanKernel::AttentionSplit => "span_attention_split",
            SpanKernel::AttentionSplitRope | SpanKernel::AttentionSplitRopeWait => {
                "span_attention_split_rope"
            }
        }
    }

    /// Its module's specialisation constants from id 0.
    fn spec(self) -> &'static [u32] {
        match self {
            // WAIT_QKV.
            SpanKernel::AttentionSplitRopeWait => &[1],
            _ => &[],
        }
    }
}

pub(crate) struct SpanPipelines {
    pub set_layout: vk::DescriptorSetLayout,
    pub layout: vk::PipelineLayout,
    modules: Vec<vk::ShaderModule>,
    /// One per `SpanKernel::ALL`, then the cooperative-matrix kernels that
    /// were built (`built`, in the same order).
    pipelines: Vec<vk::Pipeline>,
    built: Vec<SpanKernel>,
}

impl SpanPipelines {
    /// With `stats` (FISH_VK_PIPELINE_STATS=1) each pipeline's statistics
    /// are captured and printed with the matmul pipelines'. With `coopmat`
    /// the cooperative-matrix kernels are built too, with `split` the
    /// key-split attention kernels; one the driver rejects is left out
    /// (`has` says so) and its chunks keep the plain kernel.
    pub fn new(
        device: &ash::Device,
        stats: Option<&PipelineStats>,
        coopmat: bool,
        split: bool,
    ) -> Result<SpanPipelines> {
        let set_layout = storage_set_layout(device, SPAN_BINDINGS)?;
        let mut out = SpanPipelines {
            set_layout,
            layout: vk::PipelineLayout::null(),
            modules: Vec::new(),
            pipelines: Vec::new(),
            built: Vec::new(),
        };
        match push_layout(device, set_layout, PUSH_WORDS) {
            Ok(l) => out.layout = l,
            Err(e) => {
                out.destroy(device);
                return Err(e);
            }
        }
        for k in SpanKernel::ALL {
            if let Err(e) = out.build(device, k, stats) {
                out.destroy(device);
                return Err(e);
            }
        }
        let optional = [
            (coopmat, &SpanKernel::COOPMAT[..]),
            (split, &SpanKernel::SPLIT[..]),
        ];
        for (wanted, kernels) in optional {
            for &k in kernels.iter().filter(|_| wanted) {
                if out.build(device, k, stats).is_ok() {
                    out.built.push(k);
                }
            }
        }
        Ok(out)
    }

    fn build(
        &mut self,
        device: &ash::Device,
        kernel: SpanKernel,
        stats: Option<&PipelineStats>,
    ) -> Result<()> {
        let flags = vk::PipelineShaderStageCreateFlags::empty();
        let (module, pipeline) = module_compute_pipeline(
            device,
            self.layout,
            kernel.module(),
            kernel.spec(),
            flags,
            stats,
        )?;
        self.modules.push(module);
        self.pipelines.push(pipeline);
        Ok(())
    }

    pub fn get(&self, kernel: SpanKernel) -> vk::Pipeline {
        let i = SpanKernel::ALL
            .iter()
            .chain(&self.built)
            .position(|k| *k == kernel)
            .expect("only built kernels are recorded");
        self.pipelines[i]
    }

    /// The prefill attention these pipelines give chunks of 32+ tokens, for
    /// FISH_GPU_VERBOSE=1 (`unavailable`: why the cooperative-matrix kernels
    /// were not asked for).
    pub fn attention_choice(&self, unavailable: Option<&str>) -> String {
        if !super::record::tiled_attention_enabled() {
            return "one workgroup per head and token (FISH_GPU_ATTN_TILED=0)".to_string();
        }
        let built: Vec<&str> = self.built.iter().map(|k| k.module()).collect();
        match unavailable {
            Some(why) => format!("query-blocked f32 tiles (cooperative matrices: {why})"),
            None if built.is_empty() => {
                "query-blocked f32 tiles (the driver rejected the cooperative-matrix kernels)"
                    .to_string()
            }
            None => format!(
                "cooperative matrices for heads of 64 / 128 values ({}), query-blocked f32 tiles otherwise",
                built.join(", ")
            ),
        }
    }

    /// Whether `kernel` was built (the optional cooperative-matrix and
    /// key-split ones).
    pub fn has(&self, kernel: SpanKernel) -> bool {
        SpanKernel::ALL.contains(&kernel) || self.built.contains(&kernel)
    }

    pub fn destroy(&self, device: &ash::Device) {
        // SAFETY: no command buffer using them is pending (callers wait).
        unsafe {
            for &p in &self.pipelines {
                device.destroy_pipeline(p, None);
            }
            for &m in &self.modules {
                device.destroy_shader_module(m, None);
            }
            if self.layout != vk::PipelineLayout::null() {
                device.destroy_pipeline_layout(self.layout, None);
            }
            device.destroy_descriptor_set_layout(self.set_layout, None);
        }
    }
}

/// A pipeline layout of one set and `push_words` words of push constants.
pub(crate) fn push_layout(
    device: &ash::Device,
    set_layout: vk::DescriptorSetLayout,
    push_words: usize,
) -> Result<vk::PipelineLayout> {
    let ranges = [vk::PushConstantRange::default()
        .stage_flags(vk::ShaderStageFlags::COMPUTE)
        .size((push_words * 4) as u32)];
    let set_layouts = [set_layout];
    let info = vk::PipelineLayoutCreateInfo::default()
        .set_layouts(&set_layouts)
        .push_constant_ranges(&ranges);
    // SAFETY: valid create info on a live device.
    unsafe { device.create_pipeline_layout(&info, None) }.call("vkCreatePipelineLayout")
}
