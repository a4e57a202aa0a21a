//! Workgroup-scope cooperative matrices with tensor addressing
//! (VK_NV_cooperative_matrix2): where the device has them, prefill plans of
//! the cooperative-matrix kernel run shaders/matmul_coopmat2.comp for the
//! weight types it decodes (`has_module`), on the plan's tile (BM x BN)
//! and splits, and the driver stages the tiles through shared memory
//! itself instead of the kernel's own loads, conversions and barriers.
//! Needs a Vulkan 1.3 instance and device (SPIR-V 1.6), the extension's
//! workgroup-scope, flexible-dimension, tensor-addressing and block-load
//! features, and buffer device addresses (the decode functions take buffer
//! references).
//!
//! Opt-in (`FISH_VK_COOPMAT2=1`): on the H200 it is correct (tests/coopmat2.rs)
//! but slower than the staged kernel. `coopmat/Q4_K/4096x14336/n_tok512`,
//! TFLOPS on the 64 x 64 / 128 x 128 tiles: staged 97 / 124; this kernel 29 /
//! 21 at 256 invocations and 32-value steps, 39 / 29 with the weights' block
//! head read as one 16-byte word, 40 / 55 with 16-value steps (the
//! default); with x already in f16 (a plain load, timing only) 41 / 66; with
//! a trivial weight decode as well 71 / 82. The per-element decode calls and
//! the small tiles hold it back (docs/BENCHMARKS.md, "Workgroup-scope
//! cooperative matrices").

use crate::coopmat::{CoopMatTile, Staging};
use crate::device::DeviceInfo;
use crate::instance::has_extension;
use crate::weight_format::WeightFormat;
use ash::vk;
use fish_gguf::GgmlType;
use std::cell::Cell;
use std::ffi::CStr;

pub(crate) const EXTENSION: &CStr = c"VK_NV_cooperative_matrix2";

const FEATURES_STYPE: i32 = 1_000_593_000;
const FLEX_PROPERTIES_STYPE: i32 = 1_000_593_001;
const PROPERTIES_STYPE: i32 = 1_000_593_002;

/// Invocations per workgroup of the kernel (FISH_VK_COOPMAT2_THREADS).
pub const THREADS: u32 = 256;
/// Values of k per step (FISH_VK_COOPMAT2_BK): 16 measured faster than 32
/// and 64 on the H200.
pub const K_STEP: u32 = 16;

/// A power-of-two knob in `range`, else `default`.
fn power_of_two_knob(name: &str, range: std::ops::RangeInclusive<u32>, default: u32) -> u32 {
    Some(crate::config::env_number_in(name, range, default))
        .filter(|v| v.is_power_of_two())
        .unwrap_or(default)
}

fn threads() -> u32 {
    static T: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *T.get_or_init(|| power_of_two_knob("FISH_VK_COOPMAT2_THREADS", 32..=1024, THREADS))
}

fn k_step() -> u32 {
    static K: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *K.get_or_init(|| power_of_two_knob("FISH_VK_COOPMAT2_BK", 16..=256, K_STEP))
}

/// VkPhysicalDeviceCooperativeMatrix2FeaturesNV (the ash release in use
/// predates the extension).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct Features {
    s_type: vk::StructureType,
    p_next: *mut std::ffi::c_void,
    workgroup_scope: vk::Bool32,
    flexible_dimensions: vk::Bool32,
    reductions: vk::Bool32,
    conversions: vk::Bool32,
    per_element_operations: vk::Bool32,
    tensor_addressing: vk::Bool32,
    block_loads: vk::Bool32,
}

// SAFETY: a C struct that starts with sType and pNext, as the extension
// defines it, valid in both chains.
unsafe impl vk::ExtendsPhysicalDeviceFeatures2 for Features {}
unsafe impl vk::ExtendsDeviceCreateInfo for Features {}
// SAFETY: as above; the tag is the extension's structure type.
unsafe impl vk::TaggedStructure for Features {
    const STRUCTURE_TYPE: vk::StructureType = vk::StructureType::from_raw(FEATURES_STYPE);
}

impl Features {
    fn none() -> Features {
        Features {
            s_type: vk::StructureType::from_raw(FEATURES_STYPE),
            p_next: std::ptr::null_mut(),
            workgroup_scope: vk::FALSE,
            flexible_dimensions: vk::FALSE,
            reductions: vk::FALSE,
            conversions: vk::FALSE,
            per_element_operations: vk::FALSE,
            tensor_addressing: vk::FALSE,
            block_loads: vk::FALSE,
        }
    }

    /// What the kernel uses.
    pub(crate) fn enabled() -> Features {
        Features {
            workgroup_scope: vk::TRUE,
            flexible_dimensions: vk::TRUE,
            tensor_addressing: vk::TRUE,
            block_loads: vk::TRUE,
            ..Features::none()
        }
    }

    fn has_all_of(&self, wanted: &Features) -> bool {
        let pairs = [
            (self.workgroup_scope, wanted.workgroup_scope),
            (self.flexible_dimensions, wanted.flexible_dimensions),
            (self.tensor_addressing, wanted.tensor_addressing),
            (self.block_loads, wanted.block_loads),
        ];
        pairs
            .iter()
            .all(|&(have, want)| have == vk::TRUE || want == vk::FALSE)
    }
}

/// VkPhysicalDeviceCooperativeMatrix2PropertiesNV.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct Properties {
    s_type: vk::StructureType,
    p_next: *mut std::ffi::c_void,
    workgroup_scope_max_workgroup_size: u32,
    flexible_dimensions_max_dimension: u32,
    workgroup_scope_reserved_shared_memory: u32,
}

// SAFETY: sType/pNext header, as above.
unsafe impl vk::ExtendsPhysicalDeviceProperties2 for Properties {}
unsafe impl vk::TaggedStructure for Properties {
    const STRUCTURE_TYPE: vk::StructureType = vk::StructureType::from_raw(PROPERTIES_STYPE);
}

/// VkCooperativeMatrixFlexibleDimensionsPropertiesNV.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct FlexProperties {
    s_type: vk::StructureType,
    p_next: *mut std::ffi::c_void,
    m_granularity: u32,
    n_granularity: u32,
    k_granularity: u32,
    a_type: vk::ComponentTypeKHR,
    b_type: vk::ComponentTypeKHR,
    c_type: vk::ComponentTypeKHR,
    result_type: vk::ComponentTypeKHR,
    saturating_accumulation: vk::Bool32,
    scope: vk::ScopeKHR,
    workgroup_invocations: u32,
}

impl FlexProperties {
    fn empty() -> FlexProperties {
        FlexProperties {
            s_type: vk::StructureType::from_raw(FLEX_PROPERTIES_STYPE),
            p_next: std::ptr::null_mut(),
            m_granularity: 0,
            n_granularity: 0,
            k_granularity: 0,
            a_type: vk::ComponentTypeKHR::FLOAT16,
            b_type: vk::ComponentTypeKHR::FLOAT16,
            c_type: vk::ComponentTypeKHR::FLOAT32,
            result_type: vk::ComponentTypeKHR::FLOAT32,
            saturating_accumulation: vk::FALSE,
            scope: vk::ScopeKHR::WORKGROUP,
            workgroup_invocations: 0,
        }
    }
}

type GetFlexProperties =
    unsafe extern "system" fn(vk::PhysicalDevice, *mut u32, *mut FlexProperties) -> vk::Result;

/// What the device offers for the kernel: the granularity of workgroup
/// tiles (rows, tokens, k) for f16 x f16 -> f32 at THREADS invocations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CoopMat2 {
    pub granularity: (u32, u32, u32),
}

impl CoopMat2 {
    /// Whether a BM x BN tile stepping K_STEP fits the granularity.
    pub fn takes_tile(&self, rows: u32, tokens: u32) -> bool {
        let (m, n, k) = self.granularity;
        rows.is_multiple_of(m.max(1))
            && tokens.is_multiple_of(n.max(1))
            && k_step().is_multiple_of(k.max(1))
    }
}

/// Whether matmul_coopmat2.comp decodes `ty`.
pub fn has_module(ty: WeightFormat) -> bool {
    matches!(ty, WeightFormat::Ggml(GgmlType::Q4_K | GgmlType::Q6_K))
}

/// Opt-in: slower than the staged kernel where measured (module text).
fn env_enabled() -> bool {
    std::env::var("FISH_VK_COOPMAT2").as_deref() == Ok("1")
}

/// The device's workgroup-scope cooperative matrices, or why not.
///
/// # Safety
/// `instance` must be a live instance created from `entry` at `api_version`,
/// `physical` one of its devices.
pub(crate) unsafe fn probe(
    entry: &ash::Entry,
    instance: &ash::Instance,
    instance_version: u32,
    physical: vk::PhysicalDevice,
    info: &DeviceInfo,
) -> std::result::Result<CoopMat2, String> {
    if !env_enabled() {
        return Err("off (FISH_VK_COOPMAT2=1 turns it on)".into());
    }
    if info.cooperative_matrix.is_none() {
        return Err("no cooperative matrices".into());
    }
    if instance_version < vk::API_VERSION_1_3 || info.api_version < vk::API_VERSION_1_3 {
        return Err("needs Vulkan 1.3".into());
    }
    let exts = unsafe { instance.enumerate_device_extension_properties(physical) }
        .map_err(|e| format!("vkEnumerateDeviceExtensionProperties: {e}"))?;
    if !has_extension(&exts, EXTENSION) {
        return Err(format!("no {}", EXTENSION.to_string_lossy()));
    }
    let mut have = Features::none();
    let mut address = vk::PhysicalDeviceBufferDeviceAddressFeatures::default();
    let mut features = vk::PhysicalDeviceFeatures2::default()
        .push_next(&mut have)
        .push_next(&mut address);
    // SAFETY: structs of a listed extension and of core 1.2, on a 1.3 device.
    unsafe { instance.get_physical_device_features2(physical, &mut features) };
    if !have.has_all_of(&Features::enabled()) || address.buffer_device_address == vk::FALSE {
        return Err(format!(
            "missing features: {have:?}, bufferDeviceAddress {}",
            address.buffer_device_address
        ));
    }
    let mut props = Properties {
        s_type: vk::StructureType::from_raw(PROPERTIES_STYPE),
        p_next: std::ptr::null_mut(),
        workgroup_scope_max_workgroup_size: 0,
        flexible_dimensions_max_dimension: 0,
        workgroup_scope_reserved_shared_memory: 0,
    };
    let mut props2 = vk::PhysicalDeviceProperties2::default().push_next(&mut props);
    // SAFETY: as above.
    unsafe { instance.get_physical_device_properties2(physical, &mut props2) };
    if props.workgroup_scope_max_workgroup_size < threads() {
        return Err(format!(
            "workgroup-scope matrices allow {} invocations, the kernel has {}",
            props.workgroup_scope_max_workgroup_size,
            threads()
        ));
    }
    let granularity = unsafe { flexible_granularity(entry, instance, physical) }?;
    Ok(CoopMat2 { granularity })
}

/// The tile granularity the device lists for f16 x f16 + f32 -> f32 at
/// workgroup scope with THREADS invocations.
unsafe fn flexible_granularity(
    entry: &ash::Entry,
    instance: &ash::Instance,
    physical: vk::PhysicalDevice,
) -> std::result::Result<(u32, u32, u32), String> {
    let name = c"vkGetPhysicalDeviceCooperativeMatrixFlexibleDimensionsPropertiesNV";
    // SAFETY: a lookup on a live instance.
    let f = unsafe { entry.get_instance_proc_addr(instance.handle(), name.as_ptr()) }
        .ok_or("no vkGetPhysicalDeviceCooperativeMatrixFlexibleDimensionsPropertiesNV")?;
    // SAFETY: the loader returned this entry point for that name.
    let get: GetFlexProperties = unsafe { std::mem::transmute(f) };
    let mut count = 0u32;
    // SAFETY: the two-call enumeration the command defines.
    unsafe { get(physical, &mut count, std::ptr::null_mut()) }
        .result()
        .map_err(|e| format!("flexible dimensions: {e}"))?;
    let mut list = vec![FlexProperties::empty(); count.min(256) as usize];
    count = list.len() as u32;
    unsafe { get(physical, &mut count, list.as_mut_ptr()) }
        .result()
        .map_err(|e| format!("flexible dimensions: {e}"))?;
    list.truncate(count as usize);
    use vk::ComponentTypeKHR as C;
    list.iter()
        .find(|p| {
            p.a_type == C::FLOAT16
                && p.b_type == C::FLOAT16
                && p.c_type == C::FLOAT32
                && p.result_type == C::FLOAT32
                && p.scope == vk::ScopeKHR::WORKGROUP
                && p.workgroup_invocations == threads()
        })
        .map(|p| (p.m_granularity, p.n_granularity, p.k_granularity))
        .ok_or_else(|| format!("no f16 workgroup shape for {} invocations", threads()))
}

/// The feature structs to chain into vkCreateDevice.
pub(crate) struct DeviceFeatures {
    coop2: Features,
    address: vk::PhysicalDeviceBufferDeviceAddressFeatures<'static>,
}

impl DeviceFeatures {
    pub(crate) fn enabled() -> DeviceFeatures {
        DeviceFeatures {
            coop2: Features::enabled(),
            address: vk::PhysicalDeviceBufferDeviceAddressFeatures::default()
                .buffer_device_address(true),
        }
    }

    pub(crate) fn chain<'a>(
        &'a mut self,
        info: vk::DeviceCreateInfo<'a>,
    ) -> vk::DeviceCreateInfo<'a> {
        info.push_next(&mut self.coop2).push_next(&mut self.address)
    }
}

thread_local! {
    /// Whether this thread's plans may take the kernel
    /// (Gpu::with_tensor_tiles; None: the default, they may).
    static ALLOWED: Cell<Option<bool>> = const { Cell::new(None) };
}

impl crate::gpu::Gpu {
    /// Runs `f` with this thread's prefill plans taking the workgroup-scope
    /// kernel where it applies (`true`, the default) or never (`false`), so
    /// that one process can compare it with the staged kernel (tests,
    /// benches).
    pub fn with_tensor_tiles<R>(&self, allowed: bool, f: impl FnOnce() -> R) -> R {
        crate::thread_override::with_override(&ALLOWED, allowed, f)
    }

    /// Whether the device runs prefill through matmul_coopmat2.comp.
    pub fn has_tensor_tiles(&self) -> bool {
        self.info.cooperative_tensor.is_some()
    }

    /// Whether a prefill plan (`Kernel::CoopMat`) of one `ty` matrix of
    /// `n_out` rows of `n_in` values at `n_tok` tokens runs the
    /// workgroup-scope kernel on this thread.
    pub fn takes_tensor_tiles(
        &self,
        ty: WeightFormat,
        (n_in, n_out): (usize, usize),
        n_tok: usize,
    ) -> bool {
        let kernel = crate::Kernel::CoopMat;
        match self.plan_tile_for(kernel, (n_in, n_out), n_tok) {
            Ok(Some(tile)) => self.tensor_module(kernel, &tile, ty, n_out).is_some(),
            _ => false,
        }
    }

    /// The module and constants of the workgroup-scope kernel for a plan of
    /// `kernel` on `tile` over `ty` rows whose outputs are `n_out` apart
    /// (y_stride), where it applies; None: keep the staged kernel.
    pub(crate) fn tensor_module(
        &self,
        kernel: crate::Kernel,
        tile: &CoopMatTile,
        ty: WeightFormat,
        n_out: usize,
    ) -> Option<(String, Vec<u32>)> {
        let c = self.info.cooperative_tensor?;
        let applies = kernel == crate::Kernel::CoopMat
            && ALLOWED.with(Cell::get).unwrap_or(true)
            && tile.staging != Staging::PerSubgroup
            && has_module(ty)
            // The kernel's y loads and stores start on 16-byte boundaries.
            && n_out.is_multiple_of(4)
            && c.takes_tile(tile.rows(), tile.tokens());
        applies.then(|| {
            let name = format!("coopmat2_{}", ty.name().to_ascii_lowercase());
            (name, vec![threads(), tile.rows(), tile.tokens(), k_step()])
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_follow_the_granularity() {
        let c = CoopMat2 {
            granularity: (16, 16, 16),
        };
        assert!(c.takes_tile(128, 128));
        assert!(c.takes_tile(64, 64));
        assert!(!c.takes_tile(72, 64));
        let coarse = CoopMat2 {
            granularity: (64, 64, 64),
        };
        // The step (16, or FISH_VK_COOPMAT2_BK) is below its k granularity.
        assert!(!coarse.takes_tile(128, 128));
    }

    #[test]
    fn only_the_decoded_types_have_the_module() {
        assert!(has_module(WeightFormat::Ggml(GgmlType::Q4_K)));
        assert!(has_module(WeightFormat::Ggml(GgmlType::Q6_K)));
        assert!(!has_module(WeightFormat::Ggml(GgmlType::Q8_0)));
        assert!(!has_module(WeightFormat::Fq3));
    }
}
