//! The cooperative-matrix prefill matmul (shaders/matmul_coopmat.comp): what
//! the device must offer, the fragment shape taken from the shapes it
//! reports, the workgroup tile and its shared-memory budget, and the device
//! features that the module needs enabled.
//!
//! Devices without VK_KHR_cooperative_matrix (lavapipe, older drivers) keep
//! the plain tiled kernel; the choice is printed once per device with
//! FISH_GPU_VERBOSE=1.

use crate::device::DeviceInfo;
use crate::error::{Result, VkError};
use crate::instance::has_extension;
use crate::kernels::Kernel;
use crate::split_k::SplitRule;
use crate::thread_override::with_override;
use crate::tile_padding::{padded_row_stride, PaddingRule, RowStride, SharedLayout};
use crate::{MatmulInput, WeightFormat};
use ash::{khr, vk};
use std::cell::Cell;
use std::ffi::CStr;

/// Values of one staging step along n_in (the shader's BK) unless
/// FISH_VK_COOPMAT_BK says otherwise; steps are multiples of this.
pub const STEP_VALUES: u32 = 32;

/// How the kernel stages each step's A/B tiles in shared memory (the
/// shader's PIPELINE constant).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Staging {
    /// Load, dequantise and store a step, then multiply it: one A/B tile,
    /// two barriers per step.
    #[default]
    Synchronous,
    /// Software-pipelined: the next step's global loads are in flight while
    /// this step multiplies, then go into the other of two A/B tiles; one
    /// barrier per step. Same results, bit for bit.
    Pipelined,
    /// Pipelined with the global loads issued two steps ahead (two register
    /// sets): each load has two steps to arrive. Same tiles and bits.
    TwoAhead,
    /// Every subgroup stages its own rows (shaders/matmul_coopmat_stream.comp):
    /// a double-buffered A tile whose rows each subgroup fences with a
    /// subgroup barrier, loads two steps ahead, and x staged by the
    /// workgroup in chunks of X_CHUNK_VALUES. Only for tiles of one subgroup
    /// along the tokens and unsplit steps (warps_n = warps_k = 1); the same
    /// products in the same order as the other stagings of such a tile.
    PerSubgroup,
}

impl Staging {
    /// A tiles the shader declares.
    fn tiles(self) -> u32 {
        match self {
            Staging::Synchronous => 1,
            Staging::Pipelined | Staging::TwoAhead | Staging::PerSubgroup => 2,
        }
    }

    /// B tiles (x) the shader declares.
    fn x_tiles(self) -> u32 {
        match self {
            Staging::PerSubgroup => 1,
            other => other.tiles(),
        }
    }

    /// The PIPELINE specialisation constant.
    fn spec(self) -> u32 {
        match self {
            Staging::Synchronous => 0,
            Staging::Pipelined => 1,
            Staging::TwoAhead => 2,
            Staging::PerSubgroup => 3,
        }
    }
}

/// Values of x the per-subgroup staging stages at once (its x chunk, made
/// a multiple of the step). On the H200 (llama-8b B = 8) 256 beat 512 (659
/// vs 586 tok/s): the smaller chunk leaves shared memory for more
/// workgroups.
pub const X_CHUNK_VALUES: u32 = 256;

/// X_CHUNK_VALUES, or FISH_VK_BATCH_XCHUNK (64..=1024, a power of two; read
/// once).
fn x_chunk_values() -> u32 {
    static CHUNK: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *CHUNK.get_or_init(|| {
        std::env::var("FISH_VK_BATCH_XCHUNK")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|c: &u32| (64..=1024).contains(c) && c.is_power_of_two())
            .unwrap_or(X_CHUNK_VALUES)
    })
}

/// The workgroup tile of the cooperative-matrix kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CoopMatTile {
    /// Fragment shape (rows x tokens x depth) of one matrix instruction.
    pub tm: u32,
    pub tn: u32,
    pub tk: u32,
    /// Subgroups along rows and tokens.
    pub warps_m: u32,
    pub warps_n: u32,
    /// Fragments per subgroup along rows and tokens.
    pub frags_m: u32,
    pub frags_n: u32,
    /// Groups of warps_m x warps_n subgroups that split each step along
    /// n_in (the shader's WARPS_K; 1 for prefill tiles).
    pub warps_k: u32,
    /// K-quant fetches as 16- and 8-byte loads (WarpLayout::wide_fetch).
    pub wide_fetch: bool,
    /// Invocations per subgroup.
    pub lanes: u32,
    /// Values per staging step (BK, a multiple of STEP_VALUES).
    pub k_step: u32,
    /// Synchronous or pipelined staging.
    pub staging: Staging,
    /// Padded row stride of the staged A tile (tile_padding.rs).
    pub stride: RowStride,
    /// Values of x staged at once: the step, or X_CHUNK_VALUES with
    /// per-subgroup staging.
    pub x_chunk: u32,
    /// Padded row stride of the staged x (B) tile.
    pub x_stride: RowStride,
    /// The padding rule both strides follow (kept to restage the tile).
    pub padding: PaddingRule,
    /// Shared memory one workgroup declares.
    pub shared_bytes: u32,
}

/// Most fragments per subgroup along rows and along tokens: the shader's
/// fragment arrays are sized by this constant (MAX_FRAGS in
/// matmul_coopmat.comp) so that its output can name every accumulator by a
/// literal index; a rolled loop over them put them in local memory on the
/// H200 (docs/GPU.md).
pub const MAX_FRAGS_PER_SIDE: u32 = 4;

/// Subgroups and fragments per subgroup, as FISH_VK_COOPMAT_TILE gives them,
/// the values per staging step (FISH_VK_COOPMAT_BK) and the staging
/// (FISH_VK_COOPMAT_PIPELINE).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WarpLayout {
    pub warps_m: u32,
    pub warps_n: u32,
    pub frags_m: u32,
    pub frags_n: u32,
    /// Groups of subgroups splitting each step along n_in.
    pub warps_k: u32,
    pub k_step: u32,
    /// K-quant weight fetches as 16- and 8-byte loads (the shader's
    /// WIDE_FETCH) instead of 4-byte ones: same values.
    pub wide_fetch: bool,
    pub staging: Staging,
}

/// 2 x 2 subgroups of 2 x 2 fragments: a 64 x 64 tile with 16 x 16
/// fragments, pipelined staging, 32-value steps. On the H200, with the
/// accumulators in registers (2026-11-30, pp512 with 512-token chunks): 4238
/// tok/s on the llama-8b shape and 21785 on llama-1b; 2,2,2,4 and 2,2,4,4
/// were up to 10% faster on llama-8b but slower on llama-1b, 64-value steps
/// slower everywhere, 16 subgroups slower (docs/BENCHMARKS.md). Wide K-quant
/// fetches took pp512 from 4413 to 5069 (llama-8b) and 21746 to 23368.
pub const DEFAULT_WARPS: WarpLayout = WarpLayout {
    warps_m: 2,
    warps_n: 2,
    frags_m: 2,
    frags_n: 2,
    warps_k: 1,
    k_step: STEP_VALUES,
    wide_fetch: true,
    staging: Staging::Pipelined,
};

/// 2 x 2 subgroups of 4 x 4 fragments: a 128 x 128 tile, for prefill
/// dispatches with enough of them to fill the device (`WIDE_MIN_WORKGROUPS`).
/// Each subgroup loads 8 fragments for 16 products per 16 values, where the
/// 64 x 64 tile loads 4 for 4, and each staged weight serves twice the
/// tokens. On the H200 (`coopmat/<type>/4096x14336/n_tok512/pipelined`, 1792
/// 64 x 64 or 448 128 x 128 workgroups) Q4_K ran 123.6 TFLOPS against 98.8
/// and F16 119.7 against ~99; with 4096 rows (128 workgroups at 512 tokens)
/// the wide tile leaves multiprocessors idle, so those keep the default.
pub const WIDE_WARPS: WarpLayout = WarpLayout {
    warps_m: 2,
    warps_n: 2,
    frags_m: 4,
    frags_n: 4,
    warps_k: 1,
    k_step: STEP_VALUES,
    wide_fetch: true,
    staging: Staging::Pipelined,
};

/// Fewest 128 x 128 workgroups for which a prefill plan takes the wide tile
/// (somewhat more than the H200's 132 multiprocessors). On the H200
/// (`fish-cli bench MODEL -p 512 -n 0 -r 2`, two rounds) 160 took llama-8b
/// pp512 from 5717 / 5670 (never wide) to 6129 / 6130 (q/k/v's 192 and
/// gate/up's 896 wide workgroups), llama-1b from 26105 / 25973 to 30354 /
/// 29675 (gate/up only); 320 (gate/up only) gave 5664 / 6117 and 30311 /
/// 28533, every plan wide 5584 / 5539 and 22939 / 23312.
/// FISH_VK_WIDE_MIN overrides it (1..=1048576, read once).
const WIDE_MIN_WORKGROUPS: u64 = 160;

/// Fewest 128 x 128 workgroups for which a prefill plan takes the wide tile
/// with its dispatches' steps split across workgroups (split_k.rs
/// SplitRule::wide); FISH_VK_WIDE_SPLIT_MIN overrides it.
const WIDE_SPLIT_MIN_WORKGROUPS: u64 = 96;

fn wide_split_min_workgroups() -> u64 {
    static MIN: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *MIN.get_or_init(|| {
        crate::config::env_number_in(
            "FISH_VK_WIDE_SPLIT_MIN",
            1..=1 << 20,
            WIDE_SPLIT_MIN_WORKGROUPS,
        )
    })
}

fn wide_min_workgroups() -> u64 {
    wide_min_override().unwrap_or(WIDE_MIN_WORKGROUPS)
}

/// FISH_VK_WIDE_MIN, where set (1..=1048576, read once): it also puts
/// plans on the fragments kernel back on the workgroup-count rule.
fn wide_min_override() -> Option<u64> {
    static MIN: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *MIN.get_or_init(|| {
        std::env::var("FISH_VK_WIDE_MIN").is_ok().then(|| {
            crate::config::env_number_in("FISH_VK_WIDE_MIN", 1..=1 << 20, WIDE_MIN_WORKGROUPS)
        })
    })
}

/// Whether `n` wide tiles on the fragments kernel, which holds one wide
/// workgroup per multiprocessor (248 registers at 256 invocations), keep
/// at least three quarters of the `multiprocessors` busy over their waves
/// (n against whole waves of them): a plan whose last wave leaves more
/// idle takes the 64 x 64 tile, whose workgroups spread over every
/// multiprocessor. On an H100 (132 multiprocessors; llama-8b pp512,
/// `fish-cli bench MODEL -p 512 -n 0 -r 4 --each`, docs/BENCHMARKS.md)
/// each change alone: q/k/v's 192 wide tiles (73% over two waves) on the
/// 64 x 64 tile took ~10745 tok/s to ~10940, wo's 128 (97%) on the wide
/// tile to ~10860, the down projection's 128 unsplit (the staged kernel's
/// rule splits them in two) to ~11140; all of this rule, gate/up's 896
/// (97%) still wide, to ~11860 (llama-1b's plans are the same).
fn wide_fills_its_waves(n: u64, multiprocessors: u32) -> bool {
    let m = u64::from(multiprocessors.max(1));
    n > 0 && 4 * n >= 3 * n.div_ceil(m) * m
}

/// The tile for batched decode (one row per sequence): 2 x 1 subgroups of
/// one fragment each, a 32-row x 16-token tile, 128-value steps split over
/// 4 groups of subgroups (8 subgroups, 32 values each), loads two steps
/// ahead. On the H200 (llama-8b, `fish-cli bench --batch B`, aggregate
/// tok/s), loading one step ahead, it ran B = 16 at 922, B = 32 at 1173 and
/// B = 48 at 1125, against 596 / 883 / 636 for the unsplit 64 x 16 tile
/// (4,1,1,1) it replaced; 1,1,1,1,8 at 256-value steps was level at B = 16,
/// the rest of the sweep slower. Two steps ahead: B = 16 1059 vs 930, B = 8
/// 595 vs 532. Wide K-quant fetches lost here (B = 8 587 vs 653, B = 16 958
/// vs 1055), so the batch tile keeps 4-byte loads (docs/BENCHMARKS.md).
pub const BATCH_WARPS: WarpLayout = WarpLayout {
    warps_m: 2,
    warps_n: 1,
    frags_m: 1,
    frags_n: 1,
    warps_k: 4,
    k_step: 128,
    wide_fetch: false,
    staging: Staging::TwoAhead,
};

impl WarpLayout {
    /// Parses "warps_m,warps_n,frags_m,frags_n[,warps_k]" (each 1..=8),
    /// the rest taken from `base`.
    pub fn parse(text: &str, base: WarpLayout) -> Option<WarpLayout> {
        let v: Vec<u32> = text
            .split(',')
            .map(|s| s.trim().parse().ok())
            .collect::<Option<_>>()?;
        if !v.iter().all(|x| (1..=8).contains(x)) {
            return None;
        }
        let (warps_m, warps_n, frags_m, frags_n, warps_k) = match v[..] {
            [m, n, fm, fn_] => (m, n, fm, fn_, 1),
            [m, n, fm, fn_, k] => (m, n, fm, fn_, k),
            _ => return None,
        };
        Some(WarpLayout {
            warps_m,
            warps_n,
            frags_m,
            frags_n,
            warps_k,
            ..base
        })
    }
}

/// What a device must satisfy for the tile to run.
#[derive(Clone, Copy, Debug)]
pub struct TileLimits {
    pub max_shared_bytes: u32,
    pub max_threads: u32,
}

impl CoopMatTile {
    /// Every staging, synchronous first (for A/B runs through
    /// `Gpu::with_coopmat_staging`).
    pub const STAGINGS: [Staging; 3] =
        [Staging::Synchronous, Staging::Pipelined, Staging::TwoAhead];

    /// The tile for fragment shape (tm, tn, tk), `lanes` per subgroup and
    /// `warps`, with its stride padded by `rule`; refused when the shared
    /// memory or the invocation count exceeds the device's limits.
    pub fn new(
        shape: (u32, u32, u32),
        lanes: u32,
        warps: WarpLayout,
        rule: PaddingRule,
        limits: TileLimits,
    ) -> std::result::Result<CoopMatTile, String> {
        let (tm, tn, tk) = shape;
        let k_step = warps.k_step;
        if k_step == 0 || !k_step.is_multiple_of(STEP_VALUES) {
            return Err(format!(
                "steps of {k_step} values are not a multiple of {STEP_VALUES}"
            ));
        }
        if tk == 0 || !STEP_VALUES.is_multiple_of(tk) || tm == 0 || tn == 0 {
            return Err(format!(
                "fragment {tm}x{tn}x{tk} does not fit {STEP_VALUES}-value steps"
            ));
        }
        if warps.warps_k == 0 || !k_step.is_multiple_of(warps.warps_k * tk) {
            return Err(format!(
                "steps of {k_step} values do not split into {} whole {tk}-deep slices",
                warps.warps_k
            ));
        }
        if warps.frags_m > MAX_FRAGS_PER_SIDE || warps.frags_n > MAX_FRAGS_PER_SIDE {
            return Err(format!(
                "{}x{} fragments per subgroup exceed the shader's {MAX_FRAGS_PER_SIDE} per side",
                warps.frags_m, warps.frags_n
            ));
        }
        let threads = warps.warps_m * warps.warps_n * warps.warps_k * lanes;
        if threads > limits.max_threads {
            return Err(format!(
                "{threads} invocations exceed the device's {}",
                limits.max_threads
            ));
        }
        let tile = CoopMatTile {
            tm,
            tn,
            tk,
            warps_m: warps.warps_m,
            warps_n: warps.warps_n,
            frags_m: warps.frags_m,
            frags_n: warps.frags_n,
            warps_k: warps.warps_k,
            wide_fetch: warps.wide_fetch,
            lanes,
            k_step,
            staging: warps.staging,
            stride: padded_row_stride(k_step, rule),
            x_chunk: k_step,
            x_stride: padded_row_stride(k_step, rule),
            padding: rule,
            shared_bytes: 0,
        };
        tile.checked(limits.max_shared_bytes)
    }

    /// The same tile staged as `staging`, refused when its shared memory
    /// exceeds `max_shared_bytes`.
    pub fn with_staging(
        self,
        staging: Staging,
        max_shared_bytes: u32,
    ) -> std::result::Result<CoopMatTile, String> {
        CoopMatTile { staging, ..self }.checked(max_shared_bytes)
    }

    /// The shared memory the shader declares: pipelined staging doubles the
    /// A and B tiles (2 x BM and 2 x BN padded rows), per-subgroup staging
    /// the A tile only (x is one chunk of BN rows); the output staging (one
    /// fragment per subgroup) stays single.
    pub fn shared_layout(&self) -> SharedLayout {
        SharedLayout {
            a_rows: self.staging.tiles() * self.rows(),
            b_rows: self.staging.x_tiles() * self.tokens(),
            stride: self.stride,
            b_stride: self.x_stride,
            c_values: self.subgroups() * self.tm * self.tn,
        }
    }

    /// The tile with its x chunk and shared-memory size for its staging, if
    /// the staging admits its layout and the memory fits.
    fn checked(self, max_shared_bytes: u32) -> std::result::Result<CoopMatTile, String> {
        let x_chunk = match self.staging {
            Staging::PerSubgroup => {
                if self.warps_n != 1 || self.warps_k != 1 {
                    return Err(format!(
                        "per-subgroup staging needs one subgroup along the tokens and unsplit steps, not {} and {}",
                        self.warps_n, self.warps_k
                    ));
                }
                // K-quant runs pair the two sub-blocks of a 64-value chunk
                // (shaders/coopmat_runs.glsl).
                if !self.k_step.is_multiple_of(64) {
                    return Err(format!(
                        "per-subgroup staging needs steps of a multiple of 64 values, not {}",
                        self.k_step
                    ));
                }
                x_chunk_values().next_multiple_of(self.k_step)
            }
            _ => self.k_step,
        };
        let tile = CoopMatTile {
            x_chunk,
            x_stride: padded_row_stride(x_chunk, self.padding),
            ..self
        };
        let shared_bytes = tile.shared_layout().check(max_shared_bytes)?;
        Ok(CoopMatTile {
            shared_bytes,
            ..tile
        })
    }

    /// The shader module family of the tile's staging (`<family>_<type>`,
    /// `<family>_emu_<type>` emulated).
    pub(crate) fn module_family(&self) -> &'static str {
        match self.staging {
            Staging::PerSubgroup => "coopmat_stream",
            _ => "coopmat",
        }
    }

    /// Weight rows per workgroup (BM).
    pub fn rows(&self) -> u32 {
        self.warps_m * self.frags_m * self.tm
    }

    /// Tokens per workgroup (BN).
    pub fn tokens(&self) -> u32 {
        self.warps_n * self.frags_n * self.tn
    }

    /// Subgroups per workgroup.
    pub fn subgroups(&self) -> u32 {
        self.warps_m * self.warps_n * self.warps_k
    }

    pub fn threads(&self) -> u32 {
        self.subgroups() * self.lanes
    }

    /// Specialisation constants in the shader's constant_id order.
    pub(crate) fn spec(&self) -> Vec<u32> {
        vec![
            self.stride.dwords(),
            self.tm,
            self.tn,
            self.tk,
            self.warps_m,
            self.warps_n,
            self.frags_m,
            self.frags_n,
            self.lanes,
            self.threads(),
            self.k_step,
            self.staging.spec(),
            self.warps_k,
            u32::from(self.wide_fetch),
            self.x_chunk,
            self.x_stride.dwords(),
        ]
    }

    /// Workgroups for a chunk of `n_rows` rows and `n_tok` tokens.
    pub(crate) fn groups(&self, n_rows: u32, n_tok: u32) -> (u32, u32) {
        (n_rows.div_ceil(self.rows()), n_tok.div_ceil(self.tokens()))
    }

    /// How many of those workgroups there are (before any split).
    pub(crate) fn workgroups(&self, n_rows: usize, n_tok: usize) -> u64 {
        let (gx, gy) = self.groups(n_rows as u32, n_tok as u32);
        gx as u64 * gy as u64
    }

    /// One line for logs and benchmark records.
    pub fn describe(&self) -> String {
        format!(
            "{}x{}x{} f16 fragments, tile {}x{}x{} ({} subgroups of {}, step split {} ways), {:?} staging, x in chunks of {}, row strides {} / {} dwords, {} B shared",
            self.tm,
            self.tn,
            self.tk,
            self.rows(),
            self.tokens(),
            self.k_step,
            self.subgroups(),
            self.lanes,
            self.warps_k,
            self.staging,
            self.x_chunk,
            self.stride.dwords(),
            self.x_stride.dwords(),
            self.shared_bytes
        )
    }
}

/// Device extensions the cooperative-matrix module needs (the instance is
/// Vulkan 1.1, so the 1.2 features come through their extensions).
const EXTENSIONS: [&CStr; 3] = [
    khr::cooperative_matrix::NAME,
    khr::vulkan_memory_model::NAME,
    khr::shader_float16_int8::NAME,
];

/// The feature structs to chain into vkCreateDevice when the tile is used.
pub(crate) struct CoopMatFeatures {
    coop: vk::PhysicalDeviceCooperativeMatrixFeaturesKHR<'static>,
    memory_model: vk::PhysicalDeviceVulkanMemoryModelFeatures<'static>,
    float16: vk::PhysicalDeviceShaderFloat16Int8Features<'static>,
}

impl CoopMatFeatures {
    /// `int8`: also shaderInt8, for the int8 matvec on the matrix units
    /// (int8_matrix.rs).
    pub(crate) fn enabled(int8: bool) -> CoopMatFeatures {
        CoopMatFeatures {
            coop: vk::PhysicalDeviceCooperativeMatrixFeaturesKHR::default()
                .cooperative_matrix(true),
            memory_model: vk::PhysicalDeviceVulkanMemoryModelFeatures::default()
                .vulkan_memory_model(true),
            float16: vk::PhysicalDeviceShaderFloat16Int8Features::default()
                .shader_float16(true)
                .shader_int8(int8),
        }
    }

    pub(crate) fn extension_names() -> impl Iterator<Item = *const std::ffi::c_char> {
        EXTENSIONS.into_iter().map(CStr::as_ptr)
    }

    /// Chains the features into a device create info.
    pub(crate) fn chain<'a>(
        &'a mut self,
        info: vk::DeviceCreateInfo<'a>,
    ) -> vk::DeviceCreateInfo<'a> {
        info.push_next(&mut self.coop)
            .push_next(&mut self.memory_model)
            .push_next(&mut self.float16)
    }
}

/// Whether `p` is a subgroup-scope product of `ab` A and B elements with
/// `c` accumulators and results.
pub(crate) fn is_subgroup_product(
    p: &vk::CooperativeMatrixPropertiesKHR<'_>,
    ab: vk::ComponentTypeKHR,
    c: vk::ComponentTypeKHR,
) -> bool {
    p.a_type == ab
        && p.b_type == ab
        && p.c_type == c
        && p.result_type == c
        && p.scope == vk::ScopeKHR::SUBGROUP
}

/// The fragment shape to use among those the device reports: f16 A and B,
/// f32 accumulator and result, subgroup scope, depth dividing a staging
/// step; 16x16x16 when offered, else the largest.
pub fn pick_shape(props: &[vk::CooperativeMatrixPropertiesKHR<'_>]) -> Option<(u32, u32, u32)> {
    use vk::ComponentTypeKHR as C;
    props
        .iter()
        .filter(|p| {
            is_subgroup_product(p, C::FLOAT16, C::FLOAT32)
                && p.k_size > 0
                && STEP_VALUES.is_multiple_of(p.k_size)
                && p.m_size > 0
                && p.n_size > 0
        })
        .map(|p| (p.m_size, p.n_size, p.k_size))
        .max_by_key(|&(m, n, k)| ((m, n, k) == (16, 16, 16), m * n * k))
}

/// The environment variables that override one tile (docs/GPU.md).
struct TileKnobs {
    /// "warps_m,warps_n,frags_m,frags_n[,warps_k]".
    layout: &'static str,
    /// Values per step: 32, 64, 128, 256 or 512.
    k_step: &'static str,
    /// 3 per subgroup, 2 loads two steps ahead, 1 pipelined, 0 synchronous.
    pipeline: &'static str,
}

const PREFILL_KNOBS: TileKnobs = TileKnobs {
    layout: "FISH_VK_COOPMAT_TILE",
    k_step: "FISH_VK_COOPMAT_BK",
    pipeline: "FISH_VK_COOPMAT_PIPELINE",
};

const WIDE_KNOBS: TileKnobs = TileKnobs {
    layout: "FISH_VK_WIDE_TILE",
    k_step: "FISH_VK_WIDE_BK",
    pipeline: "FISH_VK_WIDE_PIPELINE",
};

const BATCH_KNOBS: TileKnobs = TileKnobs {
    layout: "FISH_VK_BATCH_TILE",
    k_step: "FISH_VK_BATCH_BK",
    pipeline: "FISH_VK_BATCH_PIPELINE",
};

/// `base` with the overrides of `knobs`, read at device open.
fn env_warps(knobs: &TileKnobs, base: WarpLayout) -> WarpLayout {
    let warps = std::env::var(knobs.layout)
        .ok()
        .and_then(|v| WarpLayout::parse(&v, base))
        .unwrap_or(base);
    let k_step = std::env::var(knobs.k_step)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|k: &u32| [32, 64, 128, 256, 512].contains(k));
    let staging = match std::env::var(knobs.pipeline).as_deref() {
        Ok("3") => Staging::PerSubgroup,
        Ok("2") => Staging::TwoAhead,
        Ok("1" | "on" | "true" | "yes") => Staging::Pipelined,
        Ok("0" | "off" | "false" | "no") => Staging::Synchronous,
        _ => warps.staging,
    };
    WarpLayout {
        k_step: k_step.unwrap_or(warps.k_step),
        staging,
        ..warps
    }
}

thread_local! {
    /// The staging forced on this thread's cooperative-matrix plans
    /// (Gpu::with_coopmat_staging), over the device's.
    static STAGING_OVERRIDE: Cell<Option<Staging>> = const { Cell::new(None) };
    /// Wide prefill tiles forced on (Some(true)) or off (Some(false)) for
    /// this thread's plans (Gpu::with_wide_tiles), over the size rule.
    static WIDE_OVERRIDE: Cell<Option<bool>> = const { Cell::new(None) };
    /// Multiprocessors the wide tile's wave rule counts for this thread's
    /// plans on the fragments kernel (Gpu::with_multiprocessors), over the
    /// device's report.
    static MULTIPROCESSORS_OVERRIDE: Cell<Option<u32>> = const { Cell::new(None) };
}

fn env_rule() -> PaddingRule {
    let load_dwords = std::env::var("FISH_VK_COOPMAT_LOAD_DWORDS")
        .ok()
        .and_then(|v| v.parse().ok())
        // Only 16-byte multiples: coopMatLoad requires them (tile_padding.rs).
        .filter(|&d: &u32| [4, 8, 16].contains(&d));
    PaddingRule {
        load_dwords: load_dwords.unwrap_or(PaddingRule::default().load_dwords),
        ..PaddingRule::default()
    }
}

fn env_disabled() -> bool {
    crate::config::env_switched_off("FISH_VK_COOPMAT")
}

/// The fragment shapes and types the device reports.
///
/// # Safety
/// As `probe`; the device must advertise VK_KHR_cooperative_matrix.
pub(crate) unsafe fn matrix_properties(
    entry: &ash::Entry,
    instance: &ash::Instance,
    physical: vk::PhysicalDevice,
) -> std::result::Result<Vec<vk::CooperativeMatrixPropertiesKHR<'static>>, String> {
    let loader = khr::cooperative_matrix::Instance::new(entry, instance);
    // SAFETY: the caller's contract.
    let props = unsafe { loader.get_physical_device_cooperative_matrix_properties(physical) }
        .map_err(|e| format!("vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR: {e}"))?;
    Ok(props.iter().map(owned_property).collect())
}

/// `p` without its extension chain, so that it outlives the query.
fn owned_property(
    p: &vk::CooperativeMatrixPropertiesKHR<'_>,
) -> vk::CooperativeMatrixPropertiesKHR<'static> {
    vk::CooperativeMatrixPropertiesKHR {
        m_size: p.m_size,
        n_size: p.n_size,
        k_size: p.k_size,
        a_type: p.a_type,
        b_type: p.b_type,
        c_type: p.c_type,
        result_type: p.result_type,
        saturating_accumulation: p.saturating_accumulation,
        scope: p.scope,
        ..Default::default()
    }
}

/// A subgroup-scope fragment property for tests: M x N x K with A and B
/// of type `ab`, accumulating in int32 for int8 inputs, else in f32.
#[cfg(test)]
pub(crate) fn fragment_property(
    m: u32,
    n: u32,
    k: u32,
    ab: vk::ComponentTypeKHR,
) -> vk::CooperativeMatrixPropertiesKHR<'static> {
    let c = match ab {
        vk::ComponentTypeKHR::SINT8 => vk::ComponentTypeKHR::SINT32,
        _ => vk::ComponentTypeKHR::FLOAT32,
    };
    vk::CooperativeMatrixPropertiesKHR::default()
        .m_size(m)
        .n_size(n)
        .k_size(k)
        .a_type(ab)
        .b_type(ab)
        .c_type(c)
        .result_type(c)
        .scope(vk::ScopeKHR::SUBGROUP)
}

/// The cooperative-matrix tile for this device, or why there is none.
///
/// # Safety
/// `instance` must be a live instance created from `entry`, `physical` one of its devices.
pub(crate) unsafe fn probe(
    entry: &ash::Entry,
    instance: &ash::Instance,
    physical: vk::PhysicalDevice,
    info: &DeviceInfo,
) -> std::result::Result<CoopMatTile, String> {
    if env_disabled() {
        return Err("FISH_VK_COOPMAT=0".into());
    }
    let exts = unsafe { instance.enumerate_device_extension_properties(physical) }
        .map_err(|e| format!("vkEnumerateDeviceExtensionProperties: {e}"))?;
    if let Some(missing) = EXTENSIONS.iter().find(|n| !has_extension(&exts, n)) {
        return Err(format!("no {}", missing.to_string_lossy()));
    }
    let mut coop = vk::PhysicalDeviceCooperativeMatrixFeaturesKHR::default();
    let mut memory_model = vk::PhysicalDeviceVulkanMemoryModelFeatures::default();
    let mut float16 = vk::PhysicalDeviceShaderFloat16Int8Features::default();
    let mut features = vk::PhysicalDeviceFeatures2::default()
        .push_next(&mut coop)
        .push_next(&mut memory_model)
        .push_next(&mut float16);
    // SAFETY: a 1.1 query with extension structs the device advertises.
    unsafe { instance.get_physical_device_features2(physical, &mut features) };
    if coop.cooperative_matrix == vk::FALSE
        || memory_model.vulkan_memory_model == vk::FALSE
        || float16.shader_float16 == vk::FALSE
    {
        return Err("cooperativeMatrix, vulkanMemoryModel or shaderFloat16 not supported".into());
    }
    // SAFETY: the device advertises the extension.
    let props = unsafe { matrix_properties(entry, instance, physical) }?;
    let shape = pick_shape(&props).ok_or("no f16 x f16 -> f32 subgroup shape")?;
    if info.subgroup_size == 0 {
        return Err("subgroup size unknown".into());
    }
    let limits = unsafe { instance.get_physical_device_properties(physical) }.limits;
    env_tile(
        shape,
        info.subgroup_size,
        env_warps(&PREFILL_KNOBS, DEFAULT_WARPS),
        TileLimits {
            max_shared_bytes: limits.max_compute_shared_memory_size,
            max_threads: limits.max_compute_work_group_invocations,
        },
    )
}

/// The tile of `warps`; a pipelined tile the device cannot hold (doubled
/// A/B tiles beyond the shared memory) stays synchronous.
fn env_tile(
    shape: (u32, u32, u32),
    lanes: u32,
    warps: WarpLayout,
    limits: TileLimits,
) -> std::result::Result<CoopMatTile, String> {
    CoopMatTile::new(shape, lanes, warps, env_rule(), limits).or_else(|e| {
        if warps.staging == Staging::Synchronous {
            return Err(e);
        }
        let single = WarpLayout {
            staging: Staging::Synchronous,
            ..warps
        };
        CoopMatTile::new(shape, lanes, single, env_rule(), limits).map_err(|_| e)
    })
}

/// Prints the prefill kernel choice (called once per device open).
pub(crate) fn log_choice(choice: &std::result::Result<CoopMatTile, String>) {
    match choice {
        Ok(tile) => eprintln!(
            "fish-vk: prefill matmul: cooperative matrix, {}",
            tile.describe()
        ),
        Err(why) => eprintln!(
            "fish-vk: prefill matmul: plain tiles (cooperative matrix unavailable: {why})"
        ),
    }
}

/// Lists the fragment shapes the device reports (FISH_GPU_VERBOSE=1), as
/// M x N x K A-type B-type C-type, so that a kernel's choice can be read
/// against them.
pub(crate) fn log_shapes(
    props: std::result::Result<Vec<vk::CooperativeMatrixPropertiesKHR<'static>>, String>,
) {
    let Ok(props) = props else { return };
    let shapes: Vec<String> = props
        .iter()
        .filter(|p| p.scope == vk::ScopeKHR::SUBGROUP)
        .map(|p| {
            format!(
                "{}x{}x{} {:?}*{:?}+{:?}",
                p.m_size, p.n_size, p.k_size, p.a_type, p.b_type, p.c_type
            )
        })
        .collect();
    eprintln!("fish-vk: subgroup fragment shapes: {}", shapes.join(", "));
}

/// The batched-decode tile (BATCH_WARPS, or what FISH_VK_BATCH_TILE /
/// _BK / _PIPELINE ask for) with the prefill tile's fragment shape and
/// subgroup width, where the device holds it.
pub(crate) fn batch_tile(prefill: &CoopMatTile, info: &DeviceInfo) -> Option<CoopMatTile> {
    env_tile(
        (prefill.tm, prefill.tn, prefill.tk),
        prefill.lanes,
        env_warps(&BATCH_KNOBS, BATCH_WARPS),
        device_limits(info),
    )
    .ok()
}

/// The wide prefill tile (WIDE_WARPS, or what FISH_VK_WIDE_TILE / _BK /
/// _PIPELINE ask for) with the prefill tile's fragment shape and subgroup
/// width, where the device holds it with the staging asked for (a wide tile
/// that would fall back to synchronous staging is not worth its registers);
/// FISH_VK_WIDE_TILE=0 turns it off.
pub(crate) fn wide_tile(prefill: &CoopMatTile, info: &DeviceInfo) -> Option<CoopMatTile> {
    if crate::config::env_switched_off("FISH_VK_WIDE_TILE") {
        return None;
    }
    let warps = env_warps(&WIDE_KNOBS, WIDE_WARPS);
    CoopMatTile::new(
        (prefill.tm, prefill.tn, prefill.tk),
        prefill.lanes,
        warps,
        env_rule(),
        device_limits(info),
    )
    .ok()
}

fn device_limits(info: &DeviceInfo) -> TileLimits {
    TileLimits {
        max_shared_bytes: info.max_shared_memory,
        max_threads: info.max_workgroup_threads,
    }
}

/// Whether batched span forwards take the emulated batch tile on devices
/// without cooperative matrices (FISH_GPU_BATCH_EMULATED=1, a test knob read
/// at each call).
/// FISH_GPU_PREFILL_EMULATED=1: `Gpu::prefill_kernel` (test knob).
pub(crate) fn emulated_prefill_wanted() -> bool {
    std::env::var("FISH_GPU_PREFILL_EMULATED").as_deref() == Ok("1")
}

pub(crate) fn emulated_batch_wanted() -> bool {
    std::env::var("FISH_GPU_BATCH_EMULATED").as_deref() == Ok("1")
}

/// The tile of the emulated module (`Kernel::CoopMatEmulated`, the prefill
/// tile; `Kernel::CoopMatBatchEmulated`, the batch tile): 16x16x16
/// fragments in logical subgroups of 32, any device.
pub(crate) fn emulated_tile(info: &DeviceInfo, batch: bool) -> Result<CoopMatTile> {
    let warps = match batch {
        true => env_warps(&BATCH_KNOBS, BATCH_WARPS),
        false => env_warps(&PREFILL_KNOBS, DEFAULT_WARPS),
    };
    env_tile((16, 16, 16), 32, warps, device_limits(info)).map_err(VkError::KernelUnavailable)
}

impl crate::gpu::Gpu {
    /// The kernel for a matmul of `n_tok` tokens above the matvec range:
    /// `Kernel::CoopMat` where the device has cooperative matrices and the
    /// batch fills at least one cooperative tile along the tokens, else
    /// `Kernel::Tiled`. Both take the same bindings and push constants.
    /// (On the H200 a 64-token span chunk through a 128-token cooperative
    /// tile made prefill slower end to end: pp512 1630 vs 2857 tok/s on the
    /// llama-1b shape, 404 vs 730 on llama-8b; hence the 64-token default
    /// tile, DEFAULT_WARPS.)
    /// With FISH_GPU_PREFILL_EMULATED=1 (a test knob, read at each plan) a
    /// device without cooperative matrices takes the emulated kernel
    /// instead, so that the lavapipe tests run spans through the prefill
    /// kernel's paths (f16 input included).
    pub fn prefill_kernel(&self, n_tok: usize) -> Kernel {
        match self.info.cooperative_matrix {
            Some(tile) if n_tok >= tile.tokens() as usize => Kernel::CoopMat,
            None if emulated_prefill_wanted() => match emulated_tile(&self.info, false) {
                Ok(tile) if n_tok >= tile.tokens() as usize => Kernel::CoopMatEmulated,
                _ => Kernel::Tiled,
            },
            _ => Kernel::Tiled,
        }
    }

    /// How the matmuls after a norm in a span's prefill chunk of `n_tok`
    /// tokens take x of `n_in` values: in f16 (the norm writes it so) where
    /// they run the cooperative prefill kernel (`coopmat_x16_*`; emulated
    /// with FISH_GPU_PREFILL_EMULATED=1) on rows of 8k values: half the
    /// input bytes and no conversion in its staging, +5.6% on the 128 x 128
    /// tile and +8.5% on the 64 x 64 one for Q4_K 4096 x 14336 on the H200
    /// (docs/BENCHMARKS.md, ninth round). `FISH_GPU_F16_INPUT=0` keeps f32.
    pub fn prefill_input(&self, n_tok: usize, n_in: usize) -> crate::MatmulInput {
        let f16 = !crate::config::env_switched_off("FISH_GPU_F16_INPUT")
            && n_in.is_multiple_of(8)
            && matches!(
                self.prefill_kernel(n_tok),
                Kernel::CoopMat | Kernel::CoopMatEmulated
            );
        match f16 {
            true => crate::MatmulInput::F16,
            false => crate::MatmulInput::F32,
        }
    }

    /// The cooperative-matrix tile in use, if any.
    pub fn coopmat_tile_in_use(&self) -> Option<CoopMatTile> {
        self.info.cooperative_matrix
    }

    /// The batched-decode tile (`Kernel::CoopMatBatch`), if the device has
    /// cooperative matrices and holds it.
    pub fn coopmat_batch_tile(&self) -> Option<CoopMatTile> {
        self.info.cooperative_batch
    }

    /// Runs `f` with every cooperative-matrix kernel (real and emulated)
    /// that this thread plans staged as `staging`, whatever
    /// FISH_VK_COOPMAT_PIPELINE says, so that one process can compare both
    /// stagings (tests, benches). Plans are made on the calling thread;
    /// spans recorded inside `f` keep the staging they were recorded with.
    /// `CoopMatTile::STAGINGS` lists the choices.
    pub fn with_coopmat_staging<R>(&self, staging: Staging, f: impl FnOnce() -> R) -> R {
        with_override(&STAGING_OVERRIDE, staging, f)
    }

    /// Runs `f` with this thread's prefill plans taking the wide tile
    /// wherever the device has one (`true`) or never (`false`), whatever
    /// the dispatch sizes (tests, benches).
    pub fn with_wide_tiles<R>(&self, wide: bool, f: impl FnOnce() -> R) -> R {
        with_override(&WIDE_OVERRIDE, wide, f)
    }

    /// Runs `f` with this thread's plans on the fragments kernel counting
    /// the wide tile's waves over `multiprocessors`, as on a device that
    /// reports them (tests: lavapipe reports none).
    pub fn with_multiprocessors<R>(&self, multiprocessors: u32, f: impl FnOnce() -> R) -> R {
        with_override(&MULTIPROCESSORS_OVERRIDE, multiprocessors, f)
    }

    /// The wide prefill tile, if the device holds it.
    pub fn coopmat_wide_tile(&self) -> Option<CoopMatTile> {
        self.info.cooperative_wide
    }

    /// The wide prefill tile of `kernel`: the device's for `Kernel::CoopMat`;
    /// for `Kernel::CoopMatEmulated` the emulated one, so that the wide
    /// shape's staging, output and split paths run on any device
    /// (synchronous where doubled tiles do not fit: lavapipe has 32 KiB of
    /// shared memory).
    pub(crate) fn wide_tile_of(&self, kernel: Kernel) -> Option<CoopMatTile> {
        match kernel {
            Kernel::CoopMat => self.info.cooperative_wide,
            Kernel::CoopMatEmulated => env_tile(
                (16, 16, 16),
                32,
                env_warps(&WIDE_KNOBS, WIDE_WARPS),
                device_limits(&self.info),
            )
            .ok(),
            _ => None,
        }
    }

    /// The tile a plan of `kernel` takes and how its dispatches split:
    /// `tile` (the kernel's; the batch tiles split by their rule), or for
    /// the prefill kernels the wide tile where the device has one, the
    /// `n_tok` tokens fill at least one wide tile, and the plan's
    /// dispatches would have at least WIDE_MIN_WORKGROUPS of it
    /// (`workgroups` counts them for a tile), or at least
    /// WIDE_SPLIT_MIN_WORKGROUPS where every row (the shortest has `min_n_in`
    /// values) is long enough to split in two (split_k.rs SplitRule::wide);
    /// or where forced. A plan whose tensors all go to the fragments kernel
    /// (`on_frags`) on a device that reports its multiprocessors takes the
    /// wide tile by `wide_fills_its_waves` instead, and splits no steps
    /// unless the wide tile is forced.
    pub(crate) fn plan_tile(
        &self,
        kernel: Kernel,
        tile: Option<CoopMatTile>,
        (min_n_in, n_tok, on_frags): (usize, usize, bool),
        workgroups: impl Fn(&CoopMatTile) -> u64,
    ) -> Result<(Option<CoopMatTile>, Option<SplitRule>)> {
        if matches!(kernel, Kernel::CoopMatBatch | Kernel::CoopMatBatchEmulated) {
            return Ok((tile, Some(SplitRule::batch())));
        }
        let Some(wide) = self.wide_tile_of(kernel) else {
            return Ok((tile, None));
        };
        let forced = WIDE_OVERRIDE.with(Cell::get);
        let by_waves = self.frags_wide_by_waves().filter(|_| on_frags);
        let split = match (forced, by_waves) {
            (None, Some(_)) => None,
            _ => SplitRule::wide(),
        };
        let take = match forced {
            Some(forced) => forced,
            None if n_tok < wide.tokens() as usize => false,
            None => {
                let n = workgroups(&wide);
                let splits = split.is_some_and(|rule| {
                    min_n_in / wide.k_step as usize >= 2 * rule.min_steps as usize
                });
                match by_waves {
                    Some(multiprocessors) => wide_fills_its_waves(n, multiprocessors),
                    None => {
                        n >= wide_min_workgroups() || (splits && n >= wide_split_min_workgroups())
                    }
                }
            }
        };
        if !take {
            return Ok((tile, None));
        }
        Ok((Some(self.staged_as_forced(wide)?), split))
    }

    /// `tile` with this thread's forced staging (with_coopmat_staging), if any.
    fn staged_as_forced(&self, tile: CoopMatTile) -> Result<CoopMatTile> {
        match STAGING_OVERRIDE.with(Cell::get) {
            Some(staging) if staging != tile.staging => tile
                .with_staging(staging, self.info.max_shared_memory)
                .map_err(VkError::KernelUnavailable),
            _ => Ok(tile),
        }
    }

    /// The multiprocessors over which plans on the fragments kernel count
    /// the wide tile's waves (`wide_fills_its_waves`), where the device
    /// reports them and FISH_VK_WIDE_MIN does not put those plans back on
    /// the workgroup-count rule.
    pub(crate) fn frags_wide_by_waves(&self) -> Option<u32> {
        MULTIPROCESSORS_OVERRIDE
            .with(Cell::get)
            .or(self.info.multiprocessors)
            .filter(|_| wide_min_override().is_none())
    }

    /// The tile a plan of `kernel` takes for one matrix of `n_rows` rows of
    /// `n_in` values at `n_tok` tokens (None: not a cooperative-matrix
    /// kernel), by the staged kernel's rule.
    pub fn plan_tile_for(
        &self,
        kernel: Kernel,
        (n_in, n_rows): (usize, usize),
        n_tok: usize,
    ) -> Result<Option<CoopMatTile>> {
        self.plan_tile_of_one(kernel, (n_in, n_rows), n_tok, false)
    }

    /// `plan_tile_for` for weights of `ty` on x arriving as `input`: by the
    /// fragments kernel's rule where a plan gives it those weights
    /// (`Gpu::frags_takes`), as `Gpu::matmul_group_on` would plan them.
    pub fn plan_tile_for_weights(
        &self,
        kernel: Kernel,
        (ty, input): (WeightFormat, MatmulInput),
        (n_in, n_rows): (usize, usize),
        n_tok: usize,
    ) -> Result<Option<CoopMatTile>> {
        let on_frags = self.frags_takes(kernel, ty, input).is_some();
        self.plan_tile_of_one(kernel, (n_in, n_rows), n_tok, on_frags)
    }

    fn plan_tile_of_one(
        &self,
        kernel: Kernel,
        (n_in, n_rows): (usize, usize),
        n_tok: usize,
        on_frags: bool,
    ) -> Result<Option<CoopMatTile>> {
        let size = (n_in, n_tok, on_frags);
        let (tile, _) = self.plan_tile(kernel, self.coopmat_tile(kernel)?, size, |tile| {
            tile.workgroups(n_rows, n_tok)
        })?;
        Ok(tile)
    }

    /// The tile of a cooperative-matrix `kernel` (None for the others).
    pub(crate) fn coopmat_tile(&self, kernel: Kernel) -> Result<Option<CoopMatTile>> {
        let tile = match kernel {
            Kernel::CoopMat => self.info.cooperative_matrix.ok_or_else(|| {
                VkError::KernelUnavailable(format!(
                    "{} has no usable cooperative matrices",
                    self.info.name
                ))
            })?,
            Kernel::CoopMatBatch => self.info.cooperative_batch.ok_or_else(|| {
                VkError::KernelUnavailable(format!(
                    "{} has no cooperative-matrix batch tile",
                    self.info.name
                ))
            })?,
            Kernel::CoopMatEmulated => emulated_tile(&self.info, false)?,
            Kernel::CoopMatBatchEmulated => emulated_tile(&self.info, true)?,
            _ => return Ok(None),
        };
        self.staged_as_forced(tile).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wide_tile_on_fragments_goes_where_its_waves_are_three_quarters_busy() {
        // llama-8b at 512 tokens on 132 multiprocessors: q/k/v, wo,
        // gate/up, down.
        assert!(!wide_fills_its_waves(192, 132));
        assert!(wide_fills_its_waves(128, 132));
        assert!(wide_fills_its_waves(896, 132));
        // llama-1b: q/k/v and wo stay on the 64 x 64 tile, gate/up is wide.
        assert!(!wide_fills_its_waves(96, 132));
        assert!(!wide_fills_its_waves(64, 132));
        assert!(wide_fills_its_waves(512, 132));
        // Chunks of 1024 tokens: gate/up's 1792 (a last wave 58% full of
        // 14), q/k/v's 384.
        assert!(wide_fills_its_waves(1792, 132));
        assert!(wide_fills_its_waves(384, 132));
        // Whole waves, the bound itself, and nothing at all.
        assert!(wide_fills_its_waves(264, 132));
        assert!(wide_fills_its_waves(99, 132));
        assert!(!wide_fills_its_waves(98, 132));
        assert!(!wide_fills_its_waves(0, 132));
    }

    fn limits() -> TileLimits {
        TileLimits {
            max_shared_bytes: 48 * 1024,
            max_threads: 1024,
        }
    }

    /// `warps` on 16x16x16 fragments, 32-lane subgroups, the default padding
    /// and 48 KiB / 1024 invocations.
    fn tile(warps: WarpLayout) -> std::result::Result<CoopMatTile, String> {
        CoopMatTile::new((16, 16, 16), 32, warps, PaddingRule::default(), limits())
    }

    #[test]
    fn the_batch_tile_holds_16_tokens_and_fits_the_smallest_limits() {
        let t = tile(BATCH_WARPS).expect("batch tile");
        assert_eq!(
            (t.rows(), t.tokens(), t.k_step, t.warps_k),
            (32, 16, 128, 4)
        );
        assert_eq!(t.staging, Staging::TwoAhead);
        assert!(t.shared_bytes <= 48 * 1024, "{}", t.shared_bytes);
    }

    use super::fragment_property as prop;

    #[test]
    fn the_sixteen_cube_f16_shape_is_preferred() {
        use vk::ComponentTypeKHR as C;
        let props = [
            prop(16, 8, 16, C::FLOAT16),
            prop(16, 16, 32, C::SINT8),
            prop(16, 16, 16, C::FLOAT16),
            prop(32, 32, 16, C::SINT8),
        ];
        assert_eq!(pick_shape(&props), Some((16, 16, 16)));
        assert_eq!(pick_shape(&props[..2]), Some((16, 8, 16)));
        assert_eq!(pick_shape(&props[1..2]), None);
        // A depth that does not divide a 32-value step is unusable.
        assert_eq!(pick_shape(&[prop(16, 16, 24, C::FLOAT16)]), None);
    }

    #[test]
    fn the_default_tile_is_64_square_and_fits_48_kib() {
        let t = tile(DEFAULT_WARPS).expect("fits");
        assert_eq!((t.rows(), t.tokens(), t.threads()), (64, 64, 128));
        assert_eq!(t.stride.dwords(), 20);
        // Pipelined: two A and two B tiles of 64 rows at 80 bytes, one
        // 16 x 16 f32 fragment per subgroup.
        assert_eq!(t.staging, Staging::Pipelined);
        assert_eq!(t.shared_bytes, 2 * 128 * 80 + 4 * 4 * 256);
        let spec = t.spec();
        assert_eq!(spec.len(), 16);
        assert_eq!(spec[14..16], [32, 20]);
        assert_eq!(spec[12], 1);
        assert_eq!(spec[13], 1);
        assert_eq!(spec[10], 32);
        assert_eq!(spec[11], 1);
        assert_eq!(spec[0], 20);
        assert_eq!(spec[9], 128);
        assert_eq!(t.groups(129, 37), (3, 1));
    }

    #[test]
    fn pipelined_staging_doubles_exactly_the_a_and_b_tiles() {
        let single = WarpLayout {
            staging: Staging::Synchronous,
            ..DEFAULT_WARPS
        };
        let sync = tile(single).expect("fits");
        let piped = sync
            .with_staging(Staging::Pipelined, 48 * 1024)
            .expect("fits");
        // Two A and two B tiles of 64 rows at 80 bytes; the output staging
        // (one 16 x 16 f32 fragment per subgroup) is not doubled.
        assert_eq!(piped.shared_bytes, 2 * 128 * 80 + 4 * 4 * 256);
        assert_eq!(piped.spec()[11], 1);
        assert_eq!(piped.spec()[..11], sync.spec()[..11]);
        // Back to synchronous gives the original tile.
        assert_eq!(
            piped.with_staging(Staging::Synchronous, 48 * 1024),
            Ok(sync)
        );
        // A budget between the two sizes takes only the synchronous tile.
        let between = 128 * 80 + 4 * 4 * 256 + 1;
        assert!(sync.with_staging(Staging::Pipelined, between).is_err());
        assert!(sync
            .with_staging(Staging::Pipelined, piped.shared_bytes)
            .is_ok());
        assert!(sync
            .with_staging(Staging::Pipelined, piped.shared_bytes - 1)
            .is_err());
        // The same through the layout: 128 x 128 tiles with 64-value steps
        // (stride 36 dwords) fit 48 KiB once (36 KiB + 4 KiB) but not twice.
        let big = WarpLayout {
            frags_m: 4,
            frags_n: 4,
            k_step: 64,
            ..single
        };
        let t = tile(big).expect("fits once");
        assert_eq!(t.shared_bytes, 256 * 36 * 4 + 4 * 4 * 256);
        let piped_big = WarpLayout {
            staging: Staging::Pipelined,
            ..big
        };
        let err = tile(piped_big).unwrap_err();
        assert!(err.contains("256 + 256 rows"), "{err}");
    }

    #[test]
    fn tiles_beyond_the_device_limits_are_refused() {
        let big = WarpLayout {
            warps_m: 4,
            warps_n: 4,
            frags_m: 8,
            frags_n: 8,
            ..DEFAULT_WARPS
        };
        let err = tile(big);
        assert!(err.is_err());
        let many = WarpLayout {
            warps_m: 8,
            warps_n: 8,
            frags_m: 1,
            frags_n: 1,
            ..DEFAULT_WARPS
        };
        let odd_step = WarpLayout {
            k_step: 48,
            ..DEFAULT_WARPS
        };
        assert!(tile(odd_step).is_err());
        let err = tile(many).unwrap_err();
        assert!(err.contains("2048 invocations"), "{err}");
        // The shader's fragment arrays hold at most 4 per side.
        let wide = WarpLayout {
            warps_m: 1,
            warps_n: 1,
            frags_m: 1,
            frags_n: 5,
            ..DEFAULT_WARPS
        };
        let err = tile(wide).unwrap_err();
        assert!(err.contains("exceed the shader's 4 per side"), "{err}");
        let widest = WarpLayout {
            frags_n: MAX_FRAGS_PER_SIDE,
            ..wide
        };
        assert!(tile(widest).is_ok());
    }

    #[test]
    fn warp_layouts_parse_from_four_or_five_numbers() {
        assert_eq!(
            WarpLayout::parse("2,4,4,2", DEFAULT_WARPS),
            Some(WarpLayout {
                warps_m: 2,
                warps_n: 4,
                frags_m: 4,
                frags_n: 2,
                warps_k: 1,
                k_step: 32,
                wide_fetch: true,
                staging: DEFAULT_WARPS.staging,
            })
        );
        // The fifth number splits the steps; the rest comes from the base.
        assert_eq!(
            WarpLayout::parse("1,1,1,1,4", BATCH_WARPS),
            Some(WarpLayout {
                warps_m: 1,
                warps_n: 1,
                frags_m: 1,
                frags_n: 1,
                warps_k: 4,
                ..BATCH_WARPS
            })
        );
        assert_eq!(WarpLayout::parse("2,4,4", DEFAULT_WARPS), None);
        assert_eq!(WarpLayout::parse("2,4,0,2", DEFAULT_WARPS), None);
        assert_eq!(WarpLayout::parse("2,4,1,2,9", DEFAULT_WARPS), None);
        assert_eq!(WarpLayout::parse("a,b,c,d", DEFAULT_WARPS), None);
    }

    #[test]
    fn per_subgroup_staging_doubles_only_the_a_tile_and_stages_x_in_chunks() {
        let stream = WarpLayout {
            warps_m: 4,
            warps_n: 1,
            frags_m: 1,
            frags_n: 1,
            warps_k: 1,
            k_step: 64,
            wide_fetch: false,
            staging: Staging::PerSubgroup,
        };
        let t = tile(stream).expect("fits");
        assert_eq!((t.rows(), t.tokens(), t.threads()), (64, 16, 128));
        assert_eq!(t.x_chunk, X_CHUNK_VALUES);
        assert_eq!((t.stride.dwords(), t.x_stride.dwords()), (36, 132));
        // Two A tiles of 64 rows at 36 dwords, one x chunk of 16 tokens at
        // 132 dwords, one 16 x 16 f32 fragment per subgroup.
        assert_eq!(t.shared_bytes, 2 * 64 * 36 * 4 + 16 * 132 * 4 + 4 * 256 * 4);
        let spec = t.spec();
        assert_eq!(spec.len(), 16);
        assert_eq!((spec[10], spec[11], spec[14], spec[15]), (64, 3, 256, 132));
        assert_eq!(t.module_family(), "coopmat_stream");
        // A workgroup staging of the same tile stages x one step at a time.
        let sync = t
            .with_staging(Staging::Synchronous, 48 * 1024)
            .expect("fits");
        assert_eq!((sync.x_chunk, sync.x_stride), (64, sync.stride));
        assert_eq!(sync.module_family(), "coopmat");
        assert_eq!(sync.with_staging(Staging::PerSubgroup, 48 * 1024), Ok(t));
        // Refused: steps split over subgroups, two subgroups along the
        // tokens, steps that do not hold whole 64-value chunks.
        let split = WarpLayout {
            warps_k: 2,
            k_step: 128,
            ..stream
        };
        let err = tile(split).unwrap_err();
        assert!(err.contains("one subgroup along the tokens"), "{err}");
        let wide = WarpLayout {
            warps_n: 2,
            ..stream
        };
        assert!(tile(wide).is_err());
        let short = WarpLayout {
            k_step: 32,
            ..stream
        };
        assert!(tile(short).unwrap_err().contains("multiple of 64"));
    }

    #[test]
    fn split_steps_multiply_the_subgroups_and_the_output_staging() {
        let split = WarpLayout {
            warps_m: 1,
            warps_n: 1,
            frags_m: 1,
            frags_n: 1,
            warps_k: 8,
            k_step: 256,
            wide_fetch: false,
            staging: Staging::Pipelined,
        };
        let t = tile(split).expect("fits");
        assert_eq!(
            (t.rows(), t.tokens(), t.subgroups(), t.threads()),
            (16, 16, 8, 256)
        );
        // Two A and two B tiles of 16 rows at 132 dwords, and one 16 x 16
        // f32 fragment for each of the 8 subgroups.
        assert_eq!(t.stride.dwords(), 132);
        assert_eq!(t.shared_bytes, 2 * (16 + 16) * 132 * 4 + 8 * 256 * 4);
        assert_eq!(t.spec()[12], 8);
        assert_eq!(t.spec()[9], 256);
        // Each group multiplies whole fragments: 256 / 8 = 32 values fit,
        // 128-value steps split 16 ways (8 values each) do not.
        let too_thin = WarpLayout {
            k_step: 128,
            warps_k: 16,
            ..split
        };
        assert!(tile(too_thin).is_err());
        let thin = WarpLayout {
            k_step: 64,
            ..split
        };
        let err = tile(thin).unwrap_err();
        assert!(err.contains("8 whole 16-deep slices"), "{err}");
    }
}
