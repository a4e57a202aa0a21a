//! Compute pipelines for the embedded SPIR-V modules, created on first use.

use crate::error::{Result, VkCall, VkError};
use crate::full_subgroups;
use crate::pipeline_stats::PipelineStats;
use ash::vk;
use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

mod embedded {
    include!(concat!(env!("OUT_DIR"), "/shaders.rs"));
}

pub use embedded::COMPILED_AT_BUILD;

/// The SPIR-V bytes of a module, by name (e.g. `matvec_q4_0`): the embedded
/// one, or with FISH_VK_MODULE_DIR=DIR the file DIR/NAME.spv where there is
/// one (a measurement knob: shader variants tried on a device without
/// rebuilding the binary; the bindings and constants must be the embedded
/// module's).
pub fn module_bytes(name: &str) -> Option<&'static [u8]> {
    if let Some(bytes) = override_module(name) {
        return Some(bytes);
    }
    embedded::MODULES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, b)| *b)
}

/// Modules read from FISH_VK_MODULE_DIR by name (None: no such file).
type ReadModules = HashMap<String, Option<&'static [u8]>>;

/// DIR/NAME.spv under FISH_VK_MODULE_DIR, read once per name and kept for
/// the process (modules are few and small).
fn override_module(name: &str) -> Option<&'static [u8]> {
    static DIR: std::sync::OnceLock<Option<std::path::PathBuf>> = std::sync::OnceLock::new();
    static READ: Mutex<Option<ReadModules>> = Mutex::new(None);
    let dir = DIR
        .get_or_init(|| std::env::var_os("FISH_VK_MODULE_DIR").map(std::path::PathBuf::from))
        .as_ref()?;
    let mut read = READ.lock().unwrap_or_else(|e| e.into_inner());
    *read
        .get_or_insert_with(HashMap::new)
        .entry(name.to_string())
        .or_insert_with(|| {
            let bytes = std::fs::read(dir.join(format!("{name}.spv"))).ok()?;
            eprintln!("fish-vk: module {name} from {}", dir.display());
            Some(&*Box::leak(bytes.into_boxed_slice()))
        })
}

/// Push constants of every matmul kernel (shaders/common.glsl `Params`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Params {
    pub n_in: u32,
    pub n_rows: u32,
    pub n_tok: u32,
    pub row_stride: u32,
    pub y_stride: u32,
    pub y_offset: u32,
    pub groups_x: u32,
    /// 1: the kernel adds its products to y instead of storing them.
    pub accumulate: u32,
    /// `Kernel::MatvecNorm`: float offset of the RMS-norm weights in the
    /// buffer at binding 3, and the norm's epsilon. `Kernel::MatvecGated`:
    /// float offset of the up values after the gate values in x.
    pub norm_off: u32,
    pub norm_eps: f32,
    /// The deferred norm (`Kernel::MatvecResNorm` / `MatvecPrenormed`):
    /// float offset of the per-workgroup sums of squares in the normed-input
    /// buffer, and how many there are per token.
    pub part_off: u32,
    pub parts: u32,
    /// The cooperative batch tile's steps split across workgroups
    /// (split_k.rs): ways (1: none), the uint offset of the dispatch's
    /// arrival counters and the float offset of its partial tiles in the
    /// scratch at binding 3.
    pub split: u32,
    pub split_count_off: u32,
    pub split_part_off: u32,
}

impl Params {
    pub fn bytes(&self) -> [u8; 60] {
        let words = [
            self.n_in,
            self.n_rows,
            self.n_tok,
            self.row_stride,
            self.y_stride,
            self.y_offset,
            self.groups_x,
            self.accumulate,
            self.norm_off,
            self.norm_eps.to_bits(),
            self.part_off,
            self.parts,
            self.split,
            self.split_count_off,
            self.split_part_off,
        ];
        let mut out = [0u8; 60];
        for (chunk, w) in out.chunks_exact_mut(4).zip(words) {
            chunk.copy_from_slice(&w.to_le_bytes());
        }
        out
    }
}

/// Storage buffers of a matmul descriptor set: weights, x, y, then the
/// norm weights of the NORM and RESNORM matvecs and the normed-input buffer
/// the RESNORM matvec writes, then the up weights of the GATE_UP matvec
/// (stage 1 leaves the last three unwritten).
pub(crate) const MATMUL_BINDINGS: u32 = 6;

pub(crate) struct Pipelines {
    /// Storage buffers: MATMUL_BINDINGS.
    pub set_layout: vk::DescriptorSetLayout,
    pub layout: vk::PipelineLayout,
    built: Mutex<HashMap<String, (vk::ShaderModule, vk::Pipeline)>>,
    /// The keys asked for since `take_requested` last ran, built or cached:
    /// which pipelines a piece of work planned, where the built list also
    /// holds those that open-time checks built before it.
    requested: Mutex<BTreeSet<String>>,
    /// The driver's statistics of each pipeline built, when asked for.
    pub stats: Option<PipelineStats>,
    /// DeviceInfo::full_subgroups: pipelines built by `get_cooperative`
    /// require full subgroups where this is Some.
    full_subgroups: Option<u32>,
}

/// The embedded module `name` as a shader module.
fn shader_module(device: &ash::Device, name: &str) -> Result<vk::ShaderModule> {
    let bytes = module_bytes(name).ok_or_else(|| VkError::Shader(name.to_string()))?;
    let code = ash::util::read_spv(&mut std::io::Cursor::new(bytes))
        .map_err(|_| VkError::Shader(name.to_string()))?;
    let info = vk::ShaderModuleCreateInfo::default().code(&code);
    // SAFETY: embedded SPIR-V compiled for the interface of its includers.
    unsafe { device.create_shader_module(&info, None) }.call("vkCreateShaderModule")
}

/// The embedded module `name` and its compute pipeline on `layout`, its
/// specialisation constant i set to `spec[i]`, with `stage_flags`; with
/// `stats`, its statistics captured. On failure nothing stays created.
pub(crate) fn module_compute_pipeline(
    device: &ash::Device,
    layout: vk::PipelineLayout,
    name: &str,
    spec: &[u32],
    stage_flags: vk::PipelineShaderStageCreateFlags,
    stats: Option<&PipelineStats>,
) -> Result<(vk::ShaderModule, vk::Pipeline)> {
    let module = shader_module(device, name)?;
    let entries: Vec<vk::SpecializationMapEntry> = (0..spec.len())
        .map(|i| vk::SpecializationMapEntry {
            constant_id: i as u32,
            offset: 4 * i as u32,
            size: 4,
        })
        .collect();
    let data: Vec<u8> = spec.iter().flat_map(|v| v.to_le_bytes()).collect();
    let specialization = vk::SpecializationInfo::default()
        .map_entries(&entries)
        .data(&data);
    let stage = vk::PipelineShaderStageCreateInfo::default()
        .flags(stage_flags)
        .stage(vk::ShaderStageFlags::COMPUTE)
        .module(module)
        .name(c"main")
        .specialization_info(&specialization);
    let flags = if stats.is_some() {
        vk::PipelineCreateFlags::CAPTURE_STATISTICS_KHR
    } else {
        vk::PipelineCreateFlags::empty()
    };
    let create = [vk::ComputePipelineCreateInfo::default()
        .flags(flags)
        .stage(stage)
        .layout(layout)];
    // SAFETY: valid create info on a live device.
    match unsafe { device.create_compute_pipelines(vk::PipelineCache::null(), &create, None) } {
        Ok(p) => {
            if let Some(stats) = stats {
                stats.capture(p[0], name, spec);
            }
            Ok((module, p[0]))
        }
        Err((_, result)) => {
            // SAFETY: the module was made above and is unused.
            unsafe { device.destroy_shader_module(module, None) };
            Err(VkError::Vulkan {
                call: "vkCreateComputePipelines",
                result,
            })
        }
    }
}

/// A descriptor set layout of `n` storage buffers at bindings 0..n for a
/// compute stage (the matmul kernels' and the span kernels' sets).
pub(crate) fn storage_set_layout(device: &ash::Device, n: u32) -> Result<vk::DescriptorSetLayout> {
    storage_array_set_layout(device, &vec![1; n as usize])
}

/// A set layout of storage buffers for compute, binding b an array of
/// `counts[b]` buffers.
pub(crate) fn storage_array_set_layout(
    device: &ash::Device,
    counts: &[u32],
) -> Result<vk::DescriptorSetLayout> {
    let bindings: Vec<_> = (0u32..)
        .zip(counts)
        .map(|(b, &count)| {
            vk::DescriptorSetLayoutBinding::default()
                .binding(b)
                .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                .descriptor_count(count)
                .stage_flags(vk::ShaderStageFlags::COMPUTE)
        })
        .collect();
    let info = vk::DescriptorSetLayoutCreateInfo::default().bindings(&bindings);
    // SAFETY: valid create infos on a live device.
    unsafe { device.create_descriptor_set_layout(&info, None) }.call("vkCreateDescriptorSetLayout")
}

impl Pipelines {
    pub fn new(
        device: &ash::Device,
        stats: Option<PipelineStats>,
        full_subgroups: Option<u32>,
    ) -> Result<Pipelines> {
        let set_layout = storage_set_layout(device, MATMUL_BINDINGS)?;
        let ranges = [vk::PushConstantRange::default()
            .stage_flags(vk::ShaderStageFlags::COMPUTE)
            .size(std::mem::size_of::<Params>() as u32)];
        let set_layouts = [set_layout];
        let info = vk::PipelineLayoutCreateInfo::default()
            .set_layouts(&set_layouts)
            .push_constant_ranges(&ranges);
        let layout = match unsafe { device.create_pipeline_layout(&info, None) } {
            Ok(l) => l,
            Err(result) => {
                unsafe { device.destroy_descriptor_set_layout(set_layout, None) };
                return Err(VkError::Vulkan {
                    call: "vkCreatePipelineLayout",
                    result,
                });
            }
        };
        Ok(Pipelines {
            set_layout,
            layout,
            built: Mutex::new(HashMap::new()),
            requested: Mutex::new(BTreeSet::new()),
            stats,
            full_subgroups,
        })
    }

    /// The pipeline of module `name` with specialisation constants `spec`
    /// (constant_id i takes spec[i]), built on first use.
    pub fn get(&self, device: &ash::Device, name: &str, spec: &[u32]) -> Result<vk::Pipeline> {
        self.get_with(
            device,
            name,
            spec,
            vk::PipelineShaderStageCreateFlags::empty(),
        )
    }

    /// `get` for a cooperative-matrix module whose workgroup has `threads`
    /// invocations: it requires full subgroups where the device allows
    /// (full_subgroups.rs).
    pub fn get_cooperative(
        &self,
        device: &ash::Device,
        name: &str,
        spec: &[u32],
        threads: u32,
    ) -> Result<vk::Pipeline> {
        let flags = full_subgroups::stage_flags(self.full_subgroups, threads);
        self.get_with(device, name, spec, flags)
    }

    /// A module's flags follow from its name (only cooperative-matrix
    /// modules are asked for with flags), so name and constants key the cache.
    fn get_with(
        &self,
        device: &ash::Device,
        name: &str,
        spec: &[u32],
        stage_flags: vk::PipelineShaderStageCreateFlags,
    ) -> Result<vk::Pipeline> {
        let key = format!("{name}{spec:?}");
        self.requested
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.clone());
        let mut built = self.built.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, p)) = built.get(&key) {
            return Ok(*p);
        }
        let (module, pipeline) = module_compute_pipeline(
            device,
            self.layout,
            name,
            spec,
            stage_flags,
            self.stats.as_ref(),
        )?;
        built.insert(key, (module, pipeline));
        Ok(pipeline)
    }

    /// The keys (module and specialisation) of the pipelines built so far, sorted.
    pub fn built_names(&self) -> Vec<String> {
        let built = self.built.lock().unwrap_or_else(|e| e.into_inner());
        let mut names: Vec<String> = built.keys().cloned().collect();
        names.sort();
        names
    }

    /// The keys asked for since the last call, sorted; starts a new list.
    pub fn take_requested(&self) -> Vec<String> {
        let mut requested = self.requested.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::take(&mut *requested).into_iter().collect()
    }

    pub fn destroy(&self, device: &ash::Device) {
        let mut built = self.built.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the device is idle (called from the device's Drop).
        unsafe {
            for (_, (module, pipeline)) in built.drain() {
                device.destroy_pipeline(pipeline, None);
                device.destroy_shader_module(module, None);
            }
            device.destroy_pipeline_layout(self.layout, None);
            device.destroy_descriptor_set_layout(self.set_layout, None);
        }
    }
}
