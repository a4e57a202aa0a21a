//! Physical-device selection and the logical device with its one queue.

use crate::config::{Config, CpuDevices, QueuePreference};
use crate::coopmat::{CoopMatFeatures, CoopMatTile};
use crate::error::{Result, VkCall, VkError};
use crate::full_subgroups;
use crate::instance::has_extension;
use crate::int8_dot::{self, Int8Dot, Int8DotFeatures};
use crate::pipeline_stats;
use ash::{ext, vk};

/// What the rest of the crate needs to know about the chosen device.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    pub name: String,
    pub kind: vk::PhysicalDeviceType,
    /// Index in vkEnumeratePhysicalDevices order (what FISH_GPU_DEVICE names).
    pub index: usize,
    pub api_version: u32,
    pub queue_family: u32,
    /// True when the queue family also does graphics.
    pub queue_is_universal: bool,
    pub subgroup_size: u32,
    /// Subgroup arithmetic in compute shaders (reductions use it).
    pub subgroup_arithmetic: bool,
    /// Subgroup shuffles in compute shaders (the cooperative-matrix
    /// attention pairs invocations with them).
    pub subgroup_shuffle: bool,
    pub max_allocation: u64,
    pub max_storage_range: u64,
    pub max_workgroups_x: u32,
    /// Size of the largest device-local heap.
    pub heap_size: u64,
    pub memory_budget_ext: bool,
    /// Nanoseconds per timestamp tick; None when the queue has no timestamps.
    pub timestamp_period_ns: Option<f64>,
    /// maxComputeSharedMemorySize and maxComputeWorkGroupInvocations.
    pub max_shared_memory: u32,
    pub max_workgroup_threads: u32,
    /// The cooperative-matrix prefill tile; None: plain tiles (coopmat.rs).
    pub cooperative_matrix: Option<CoopMatTile>,
    /// The wide prefill tile (coopmat.rs WIDE_WARPS) for prefill plans with
    /// many workgroups, where the prefill tile exists and the device holds it.
    pub cooperative_wide: Option<CoopMatTile>,
    /// The cooperative-matrix tile of batched decode (coopmat.rs
    /// BATCH_WARPS), where the prefill tile exists and the device holds it.
    pub cooperative_batch: Option<CoopMatTile>,
    /// Workgroup-scope cooperative matrices (coopmat2.rs): prefill plans of
    /// the types it decodes run matmul_coopmat2.comp.
    pub cooperative_tensor: Option<crate::coopmat2::CoopMat2>,
    /// Packed int8 dot products (the int8-activation matvec, int8_dot.rs).
    pub int8_dot: Int8Dot,
    /// Arrays of storage buffers indexed by a dynamically uniform value
    /// (shaderStorageBufferArrayDynamicIndexing; enabled where offered):
    /// the persistent decode layers read their matrices so.
    pub storage_array_indexing: bool,
    /// Storage buffers one compute stage may bind (the least of
    /// maxPerStageDescriptorStorageBuffers, maxDescriptorSetStorageBuffers
    /// and maxPerStageResources).
    pub max_stage_storage_buffers: u32,
    /// Tokens per pass of the int8 matvec on the matrix units
    /// (int8_matrix.rs: the device's 16 x N x 32 int8 fragment width), where
    /// the device has those fragments and the prefill tile's features.
    pub int8_matrix: Option<u32>,
    /// f16-input prefill plans of Q4_K and Q6_K (Q4_K only with
    /// FISH_VK_FRAGS=q4_k) run on fragments built in registers (frags.rs):
    /// the device offers them and passed the open-time check.
    pub prefill_frags: bool,
    /// The device offers what the fragments kernel needs (16 x 8 x 16 f16
    /// fragments with f32 accumulators, subgroups of 32), whether or not it
    /// passed the open-time check: tests run the real kernel wherever this
    /// holds, so that a failing check fails them instead of skipping them.
    pub prefill_frags_offered: bool,
    /// Prefill gate/up projections of Q4_K may run the fragments kernel's
    /// form with the gated activation in its epilogue
    /// (`Kernel::PrefillGateUp`): `prefill_frags`, and the form passed its
    /// own open-time check.
    pub prefill_frags_gate_up: bool,
    /// Pipeline statistics asked for (FISH_VK_PIPELINE_STATS=1) and offered
    /// (VK_KHR_pipeline_executable_properties; pipeline_stats.rs).
    pub pipeline_stats: bool,
    /// The largest subgroup size where cooperative-matrix pipelines can
    /// require full subgroups (full_subgroups.rs), else None.
    pub full_subgroups: Option<u32>,
    /// Multiprocessors, where the device reports them
    /// (VK_NV_shader_sm_builtins): how many workgroups of a kernel that
    /// holds one per multiprocessor run at once (coopmat.rs
    /// `wide_fills_its_waves`, the wide tile's rule on fragments).
    pub multiprocessors: Option<u32>,
}

/// Lower is better; None: never chosen automatically.
fn rank(kind: vk::PhysicalDeviceType, cpu: CpuDevices) -> Option<u8> {
    match kind {
        vk::PhysicalDeviceType::DISCRETE_GPU => Some(0),
        vk::PhysicalDeviceType::INTEGRATED_GPU => Some(1),
        vk::PhysicalDeviceType::VIRTUAL_GPU => Some(2),
        vk::PhysicalDeviceType::CPU if cpu == CpuDevices::Allowed => Some(3),
        _ => None,
    }
}

/// The queue family to use, or None when the device has no compute queue.
fn pick_queue_family(families: &[vk::QueueFamilyProperties], pref: QueuePreference) -> Option<u32> {
    let compute = |f: &vk::QueueFamilyProperties| f.queue_flags.contains(vk::QueueFlags::COMPUTE);
    let graphics = |f: &vk::QueueFamilyProperties| f.queue_flags.contains(vk::QueueFlags::GRAPHICS);
    let find = |want_graphics: bool| {
        families
            .iter()
            .position(|f| compute(f) && graphics(f) == want_graphics && f.queue_count > 0)
    };
    let first = match pref {
        QueuePreference::ComputeOnly => find(false).or_else(|| find(true)),
        QueuePreference::Universal => find(true).or_else(|| find(false)),
    };
    first.map(|i| i as u32)
}

struct Candidate {
    index: usize,
    physical: vk::PhysicalDevice,
    rank: u8,
}

/// Chooses a device per the rules in docs/GPU.md; the error lists why each was rejected.
pub(crate) fn select(
    instance: &ash::Instance,
    config: &Config,
) -> Result<(vk::PhysicalDevice, DeviceInfo)> {
    // SAFETY: queries on a valid instance.
    let physicals =
        unsafe { instance.enumerate_physical_devices() }.call("vkEnumeratePhysicalDevices")?;
    if physicals.is_empty() {
        return Err(VkError::NoDevice(
            "the loader reports no physical device".into(),
        ));
    }
    let mut rejected = Vec::new();
    let mut candidates = Vec::new();
    for (index, &physical) in physicals.iter().enumerate() {
        let props = unsafe { instance.get_physical_device_properties(physical) };
        let name = props
            .device_name_as_c_str()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if config.device_index.is_some_and(|want| want != index) {
            continue;
        }
        let families = unsafe { instance.get_physical_device_queue_family_properties(physical) };
        let why_not = if props.api_version < vk::API_VERSION_1_1 {
            Some("API < 1.1")
        } else if pick_queue_family(&families, config.queue).is_none() {
            Some("no compute queue")
        } else {
            None
        };
        match (why_not, rank(props.device_type, config.cpu_devices)) {
            (Some(reason), _) => rejected.push(format!("#{index} {name}: {reason}")),
            (None, None) => rejected.push(format!(
                "#{index} {name}: {:?} device (CPU implementations need FISH_GPU=cpu)",
                props.device_type
            )),
            (None, Some(rank)) => candidates.push(Candidate {
                index,
                physical,
                rank,
            }),
        }
    }
    if let Some(want) = config.device_index {
        if want >= physicals.len() {
            rejected.push(format!(
                "FISH_GPU_DEVICE={want} but only {} devices",
                physicals.len()
            ));
        }
    }
    let best = candidates
        .iter()
        .min_by_key(|c| (c.rank, c.index))
        .ok_or_else(|| VkError::NoDevice(rejected.join("; ")))?;
    let info = describe_physical(instance, best.physical, best.index, config)?;
    Ok((best.physical, info))
}

fn describe_physical(
    instance: &ash::Instance,
    physical: vk::PhysicalDevice,
    index: usize,
    config: &Config,
) -> Result<DeviceInfo> {
    let exts = unsafe { instance.enumerate_device_extension_properties(physical) }
        .call("vkEnumerateDeviceExtensionProperties")?;
    let mut subgroup = vk::PhysicalDeviceSubgroupProperties::default();
    let mut maint3 = vk::PhysicalDeviceMaintenance3Properties::default();
    let mut sm = vk::PhysicalDeviceShaderSMBuiltinsPropertiesNV::default();
    let has_sm = has_extension(&exts, ash::nv::shader_sm_builtins::NAME);
    let mut props2 = vk::PhysicalDeviceProperties2::default()
        .push_next(&mut subgroup)
        .push_next(&mut maint3);
    if has_sm {
        props2 = props2.push_next(&mut sm);
    }
    // SAFETY: a 1.1 query on a device that reports API >= 1.1; the SM
    // structure is chained only where the device has its extension.
    unsafe { instance.get_physical_device_properties2(physical, &mut props2) };
    let props = props2.properties;
    let multiprocessors = (has_sm && sm.shader_sm_count > 0).then_some(sm.shader_sm_count);
    let families = unsafe { instance.get_physical_device_queue_family_properties(physical) };
    let queue_family = pick_queue_family(&families, config.queue)
        .ok_or_else(|| VkError::NoDevice("no compute queue".into()))?;
    let family = families[queue_family as usize];
    let mem = unsafe { instance.get_physical_device_memory_properties(physical) };
    let heap_size = mem
        .memory_heaps_as_slice()
        .iter()
        .filter(|h| h.flags.contains(vk::MemoryHeapFlags::DEVICE_LOCAL))
        .map(|h| h.size)
        .max()
        .unwrap_or(0);
    let memory_budget_ext = has_extension(&exts, ext::memory_budget::NAME);
    // Whether compute shaders have the basic subgroup operations and `ops`.
    let compute_subgroup_ops = |ops: vk::SubgroupFeatureFlags| {
        subgroup
            .supported_stages
            .contains(vk::ShaderStageFlags::COMPUTE)
            && subgroup
                .supported_operations
                .contains(vk::SubgroupFeatureFlags::BASIC | ops)
    };
    let subgroup_arithmetic = compute_subgroup_ops(vk::SubgroupFeatureFlags::ARITHMETIC);
    let subgroup_shuffle = compute_subgroup_ops(vk::SubgroupFeatureFlags::SHUFFLE);
    // SAFETY: `physical` comes from `instance`.
    let int8_dot = unsafe { int8_dot::probe(instance, physical, &exts) };
    // SAFETY: `physical` comes from `instance`.
    let storage_array_indexing = unsafe { instance.get_physical_device_features(physical) }
        .shader_storage_buffer_array_dynamic_indexing
        == vk::TRUE;
    // SAFETY: `physical` comes from `instance`.
    let full_subgroups = unsafe { full_subgroups::probe(instance, physical, &exts) };
    let pipeline_stats =
        pipeline_stats::wanted() && has_extension(&exts, pipeline_stats::extension_name());
    let timestamp_period_ns = (family.timestamp_valid_bits > 0
        && props.limits.timestamp_period > 0.0)
        .then_some(f64::from(props.limits.timestamp_period));
    Ok(DeviceInfo {
        name: props
            .device_name_as_c_str()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        kind: props.device_type,
        index,
        api_version: props.api_version,
        queue_family,
        queue_is_universal: family.queue_flags.contains(vk::QueueFlags::GRAPHICS),
        subgroup_size: subgroup.subgroup_size,
        subgroup_arithmetic,
        subgroup_shuffle,
        max_allocation: maint3.max_memory_allocation_size,
        max_storage_range: u64::from(props.limits.max_storage_buffer_range),
        max_workgroups_x: props.limits.max_compute_work_group_count[0],
        heap_size,
        memory_budget_ext,
        timestamp_period_ns,
        max_shared_memory: props.limits.max_compute_shared_memory_size,
        max_workgroup_threads: props.limits.max_compute_work_group_invocations,
        cooperative_matrix: None,
        cooperative_wide: None,
        cooperative_batch: None,
        cooperative_tensor: None,
        int8_dot,
        storage_array_indexing,
        max_stage_storage_buffers: props
            .limits
            .max_per_stage_descriptor_storage_buffers
            .min(props.limits.max_descriptor_set_storage_buffers)
            .min(props.limits.max_per_stage_resources),
        int8_matrix: None,
        prefill_frags: false,
        prefill_frags_offered: false,
        prefill_frags_gate_up: false,
        pipeline_stats,
        full_subgroups,
        multiprocessors,
    })
}

/// Creates the logical device with one queue of the chosen family.
pub(crate) fn create_logical(
    instance: &ash::Instance,
    physical: vk::PhysicalDevice,
    info: &DeviceInfo,
) -> Result<(ash::Device, vk::Queue)> {
    let priorities = [1.0f32];
    let queues = [vk::DeviceQueueCreateInfo::default()
        .queue_family_index(info.queue_family)
        .queue_priorities(&priorities)];
    let mut exts = Vec::new();
    if info.memory_budget_ext {
        exts.push(ext::memory_budget::NAME.as_ptr());
    }
    let mut coop_features = CoopMatFeatures::enabled(info.int8_matrix.is_some());
    if info.cooperative_matrix.is_some() {
        exts.extend(CoopMatFeatures::extension_names());
    }
    let mut coop2_features = crate::coopmat2::DeviceFeatures::enabled();
    if info.cooperative_tensor.is_some() {
        exts.push(crate::coopmat2::EXTENSION.as_ptr());
    }
    let mut int8_features = Int8DotFeatures::enabled();
    if info.int8_dot != Int8Dot::Absent {
        exts.push(Int8DotFeatures::extension_name());
    }
    let mut full_subgroup_features = full_subgroups::features();
    if info.full_subgroups.is_some() {
        exts.push(full_subgroups::extension_name());
    }
    let mut stats_features = pipeline_stats::features();
    if info.pipeline_stats {
        exts.push(pipeline_stats::extension_name().as_ptr());
    }
    let core_features = vk::PhysicalDeviceFeatures::default()
        .shader_storage_buffer_array_dynamic_indexing(info.storage_array_indexing);
    let mut create = vk::DeviceCreateInfo::default()
        .queue_create_infos(&queues)
        .enabled_extension_names(&exts)
        .enabled_features(&core_features);
    if info.pipeline_stats {
        create = create.push_next(&mut stats_features);
    }
    if info.full_subgroups.is_some() {
        create = create.push_next(&mut full_subgroup_features);
    }
    if info.cooperative_matrix.is_some() {
        create = coop_features.chain(create);
    }
    if info.int8_dot != Int8Dot::Absent {
        create = int8_features.chain(create);
    }
    if info.cooperative_tensor.is_some() {
        create = coop2_features.chain(create);
    }
    // SAFETY: the create info refers to locals alive across the call.
    let device =
        unsafe { instance.create_device(physical, &create, None) }.call("vkCreateDevice")?;
    let queue = unsafe { device.get_device_queue(info.queue_family, 0) };
    Ok((device, queue))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn family(flags: vk::QueueFlags) -> vk::QueueFamilyProperties {
        vk::QueueFamilyProperties {
            queue_flags: flags,
            queue_count: 1,
            ..Default::default()
        }
    }

    #[test]
    fn compute_only_family_is_preferred_unless_universal_is_asked() {
        let families = [
            family(vk::QueueFlags::GRAPHICS | vk::QueueFlags::COMPUTE | vk::QueueFlags::TRANSFER),
            family(vk::QueueFlags::TRANSFER),
            family(vk::QueueFlags::COMPUTE | vk::QueueFlags::TRANSFER),
        ];
        assert_eq!(
            pick_queue_family(&families, QueuePreference::ComputeOnly),
            Some(2)
        );
        assert_eq!(
            pick_queue_family(&families, QueuePreference::Universal),
            Some(0)
        );
        assert_eq!(
            pick_queue_family(&families[..2], QueuePreference::ComputeOnly),
            Some(0)
        );
        assert_eq!(
            pick_queue_family(&families[1..2], QueuePreference::ComputeOnly),
            None
        );
    }

    #[test]
    fn ranking_puts_discrete_first_and_cpu_only_when_allowed() {
        use vk::PhysicalDeviceType as T;
        let r = |t| rank(t, CpuDevices::Excluded);
        assert!(r(T::DISCRETE_GPU) < r(T::INTEGRATED_GPU));
        assert!(r(T::INTEGRATED_GPU) < r(T::VIRTUAL_GPU));
        assert_eq!(r(T::CPU), None);
        assert!(rank(T::CPU, CpuDevices::Allowed) > r(T::VIRTUAL_GPU));
    }
}
