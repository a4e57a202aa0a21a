//! Full subgroups for the cooperative-matrix pipelines
//! (VK_EXT_subgroup_size_control's computeFullSubgroups): cooperative-matrix
//! operations need every invocation of a subgroup active, and without
//! REQUIRE_FULL_SUBGROUPS a driver may not assume that its subgroups are
//! full, which can cost it its fast path. Requested with
//! `FISH_VK_FULL_SUBGROUPS=1` where the device offers the feature, for
//! workgroups that are a multiple of the largest subgroup size (the
//! extension's rule). Opt-in: on the H200 it changed neither the bare
//! products (coopmat_peak, 609 vs 600 TFLOPS) nor prefill
//! (docs/BENCHMARKS.md).

use crate::instance::has_extension;
use ash::{ext, vk};

/// The largest subgroup size when full subgroups can be required, else None.
///
/// # Safety
/// `physical` must come from `instance`.
pub(crate) unsafe fn probe(
    instance: &ash::Instance,
    physical: vk::PhysicalDevice,
    exts: &[vk::ExtensionProperties],
) -> Option<u32> {
    if std::env::var("FISH_VK_FULL_SUBGROUPS").as_deref() != Ok("1") {
        return None;
    }
    if !has_extension(exts, ext::subgroup_size_control::NAME) {
        return None;
    }
    let mut feature = vk::PhysicalDeviceSubgroupSizeControlFeatures::default();
    let mut features = vk::PhysicalDeviceFeatures2::default().push_next(&mut feature);
    // SAFETY: a 1.1 query with a struct of an extension the device lists.
    unsafe { instance.get_physical_device_features2(physical, &mut features) };
    if feature.compute_full_subgroups == vk::FALSE {
        return None;
    }
    let mut props = vk::PhysicalDeviceSubgroupSizeControlProperties::default();
    let mut props2 = vk::PhysicalDeviceProperties2::default().push_next(&mut props);
    // SAFETY: as above.
    unsafe { instance.get_physical_device_properties2(physical, &mut props2) };
    (props.max_subgroup_size > 0).then_some(props.max_subgroup_size)
}

pub(crate) fn extension_name() -> *const std::ffi::c_char {
    ext::subgroup_size_control::NAME.as_ptr()
}

/// The feature struct that allows the stage flag at device creation.
pub(crate) fn features() -> vk::PhysicalDeviceSubgroupSizeControlFeatures<'static> {
    vk::PhysicalDeviceSubgroupSizeControlFeatures::default().compute_full_subgroups(true)
}

/// The stage flags of a cooperative-matrix pipeline whose workgroup has
/// `threads` invocations, given the probe's result: full subgroups where
/// they can be required and the workgroup is whole subgroups.
pub(crate) fn stage_flags(
    max_subgroup: Option<u32>,
    threads: u32,
) -> vk::PipelineShaderStageCreateFlags {
    match max_subgroup {
        Some(max) if max > 0 && threads.is_multiple_of(max) => {
            vk::PipelineShaderStageCreateFlags::REQUIRE_FULL_SUBGROUPS
        }
        _ => vk::PipelineShaderStageCreateFlags::empty(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_workgroups_of_whole_subgroups_ask_for_full_ones() {
        let full = vk::PipelineShaderStageCreateFlags::REQUIRE_FULL_SUBGROUPS;
        let none = vk::PipelineShaderStageCreateFlags::empty();
        assert_eq!(stage_flags(Some(32), 128), full);
        assert_eq!(stage_flags(Some(64), 128), full);
        assert_eq!(stage_flags(Some(64), 96), none);
        assert_eq!(stage_flags(None, 128), none);
    }
}
