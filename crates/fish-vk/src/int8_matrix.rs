//! The int8 matvec on the matrix units (shaders/matvec_i8mm.comp): decode-
//! sized batches of pre-quantised activations times quantised weights as
//! 16 x N x 32 signed int8 fragment products (VK_KHR_cooperative_matrix),
//! scaled per 32-value block by each invocation for the elements it holds.
//! The packed-dot-product matvec spends its instructions per token; this
//! kernel per block of 16 rows x N tokens, so that a batch would cost about
//! what one token does. Q4_K and Q6_K take a form without staging rounds
//! that multiplies their dequantised weights by x in f16 instead, 16 x 8 x
//! 16 fragments with f32 sums (matvec_i8mm_h16.glsl), the other types the
//! staged int8 one. Its time does
//! hardly grow with the tokens, but on the H200 it starts far above the
//! packed products' one-token time (Q4_K 4096 x 14336: 18.1 us against 7.8;
//! at 8 tokens 26.1 against 33.1), so spans take it by default only for
//! batched decode steps of 8 sequences (`Gpu::int8_span_kernel`), and for
//! every int8 matvec with FISH_VK_I8MM=1 (docs/GPU.md, "int8 products on
//! the matrix units"; docs/BENCHMARKS.md).
//!
//! Here: whether the device has the fragments (`probe`), the workgroup
//! shape a type takes (`Int8MatrixShape`) and the shared memory it needs.

use crate::coopmat::is_subgroup_product;
use crate::weight_format::WeightFormat;
use ash::vk;
use fish_gguf::GgmlType;

/// Rows of a fragment: the shader's TM (a workgroup has `row_frags` of
/// them, `Int8MatrixShape::rows`).
const FRAGMENT_ROWS: u32 = 16;
/// Values of a fragment's depth: one block of int8 activations.
const FRAGMENT_DEPTH: u32 = 32;
/// Invocations per subgroup the shader assumes (its lanes take 16 rows x
/// the two halves of a step).
pub(crate) const LANES: u32 = 32;
/// Subgroups per workgroup where shared memory allows: each takes every
/// fourth step of the same 16 rows (on the H200 4 measured 30.8 us for
/// Q4_K 4096 x 14336 against 34.3 with 8; docs/BENCHMARKS.md).
const MAX_WARPS: u32 = 4;
/// Without staging rounds: subgroups per workgroup. Each takes every
/// WARPS-th super-block (256 values) of the workgroup's rows, so more of
/// them put more of a dispatch's loads in flight where its rows alone do
/// not fill the GPU, at the price of a longer reduction at the end. Four,
/// and eight where a dispatch would have fewer than `FEW_SUBGROUPS` with
/// four (one row fragment each), never more than a row has super-blocks.
/// H200, llama-8b at B = 8 (`FISH_GPU_PROFILE=4`, us per stage, 4 / 8
/// subgroups everywhere): q/k/v (6144 rows of 4096) 17.7 / 16.0, wo (4096
/// of 4096) 16.3 / 13.8, down (4096 of 14336) 44 / 32 (Q4_K layers) and 44
/// / 34 (Q6_K, with two row fragments), but gate/up (28672 of 4096) 44.4 /
/// 47.9 and the output projection (128256 of 4096) 184 / 199; llama-1b
/// q/k/v 11.8 / 10.3, wo 11.1 / 9.0, down (2048 of 8192) 25.6 / 17.9,
/// gate/up 17.6 / 20.1, output 109 / 140 (docs/BENCHMARKS.md).
const WARPS_DIRECT: u32 = 4;
const MAX_WARPS_DIRECT: u32 = 8;
const FEW_SUBGROUPS: usize = 2048;
/// Values of a step of one row (two invocations, 128 values each).
const STEP_VALUES: usize = 256;
/// Bytes of one staged row of a fragment: 32 values padded to 48 (the
/// shader's ROW_WORDS), so that eight rows' 16-byte loads hit distinct banks.
const ROW_BYTES: u32 = 48;

/// The fragment width (tokens per pass) the device offers for signed int8
/// A and B with int32 accumulation at subgroup scope, 16 rows deep 32:
/// 8 preferred (decode batches rarely exceed it, and a fragment of 16
/// would scale twice the elements), else 16.
pub fn pick_tokens(props: &[vk::CooperativeMatrixPropertiesKHR<'_>]) -> Option<u32> {
    use vk::ComponentTypeKHR as C;
    let offered = |n: u32| {
        props.iter().any(|p| {
            is_subgroup_product(p, C::SINT8, C::SINT32)
                && (p.m_size, p.n_size, p.k_size) == (FRAGMENT_ROWS, n, FRAGMENT_DEPTH)
        })
    };
    [8, 16].into_iter().find(|&n| offered(n))
}

/// The tokens per pass of the kernel on this device, or why it has none.
/// The cooperative-matrix extension and its features must already be in
/// use (`DeviceInfo::cooperative_matrix`); the kernel also needs shaderInt8
/// and 32-invocation subgroups.
///
/// # Safety
/// `instance` must be a live instance created from `entry`, `physical` one of its devices.
pub(crate) unsafe fn probe(
    entry: &ash::Entry,
    instance: &ash::Instance,
    physical: vk::PhysicalDevice,
    subgroup_size: u32,
) -> std::result::Result<u32, String> {
    if crate::config::env_switched_off("FISH_VK_INT8_MATRIX") {
        return Err("FISH_VK_INT8_MATRIX=0".into());
    }
    if subgroup_size != LANES {
        return Err(format!("subgroups of {subgroup_size}, not {LANES}"));
    }
    let mut int8 = vk::PhysicalDeviceShaderFloat16Int8Features::default();
    let mut features = vk::PhysicalDeviceFeatures2::default().push_next(&mut int8);
    // SAFETY: the caller checked the extension (cooperative_matrix's set).
    unsafe { instance.get_physical_device_features2(physical, &mut features) };
    if int8.shader_int8 == vk::FALSE {
        return Err("no shaderInt8".into());
    }
    // SAFETY: the device advertises the extension (the caller's contract).
    let props = unsafe { crate::coopmat::matrix_properties(entry, instance, physical) }?;
    let tokens = pick_tokens(&props).ok_or("no 16xNx32 s8 x s8 -> s32 subgroup shape")?;
    if tokens == DIRECT_TOKENS && !has_f16_fragments(&props) {
        return Err("no 16x8x16 f16 x f16 -> f32 subgroup shape".into());
    }
    Ok(tokens)
}

/// Whether the device offers the f16 fragments of the form without staging
/// rounds (Q4_K and Q6_K at 8 tokens): 16 x 8 x 16, f32 accumulators.
pub(crate) fn has_f16_fragments(props: &[vk::CooperativeMatrixPropertiesKHR<'_>]) -> bool {
    use vk::ComponentTypeKHR as C;
    props.iter().any(|p| {
        is_subgroup_product(p, C::FLOAT16, C::FLOAT32)
            && (p.m_size, p.n_size, p.k_size) == (FRAGMENT_ROWS, DIRECT_TOKENS, 16)
    })
}

/// Whether the kernel without staging rounds runs on this device: one
/// tiny Q4_K product (16 rows of 256 zero weights, 8 tokens) must come back
/// finite. That form assumes the element layout the H200 gives 16 x 8 x 16
/// f16 products and writes NaN where a workgroup finds another one
/// (matvec_i8mm_h16.glsl), so a device whose fragments are laid out
/// differently loses the matrix kernel here, at open, instead of giving
/// NaN logits later. A device whose fragments are 16 tokens wide runs only
/// the staged form, which assumes no layout: nothing to check there.
/// (`kernel`: `Kernel::MatvecInt8Matrix`; the emulated kernel in tests.)
pub(crate) fn layout_holds(
    gpu: &crate::Gpu,
    kernel: crate::Kernel,
) -> std::result::Result<(), String> {
    if kernel == crate::Kernel::MatvecInt8Matrix && gpu.info().int8_matrix != Some(DIRECT_TOKENS) {
        return Ok(());
    }
    const N_IN: usize = 256;
    const ROWS: usize = 16;
    const TOKENS: usize = DIRECT_TOKENS as usize;
    let q4k = GgmlType::Q4_K;
    // One Q4_K super-block per row.
    let bytes = vec![0u8; ROWS * q4k.block_bytes()];
    let h = gpu
        .upload(q4k, &bytes, N_IN, ROWS)
        .map_err(|e| e.to_string())?;
    let y = gpu.matmul_group_with(&[h], &[0.0; N_IN * TOKENS], TOKENS, kernel);
    let freed = gpu.free(h);
    let y = y.map_err(|e| e.to_string())?;
    freed.map_err(|e| e.to_string())?;
    match y.iter().flatten().all(|v| v.is_finite()) {
        true => Ok(()),
        false => Err("its fragments are not laid out as the kernel expects".into()),
    }
}

/// Int8 fragments per block the types without staging rounds would take
/// (one, two for Q6_K: one per 16-value scale); None for the staged types.
/// Their shader (matvec_i8mm_h16.glsl) is written for one element layout of
/// 16 x 8 x 16 f16 fragments, so these types take passes of 8 tokens only.
fn unstaged_fragments(ty: WeightFormat) -> Option<u64> {
    match ty {
        WeightFormat::Ggml(GgmlType::Q4_K) => Some(1),
        WeightFormat::Ggml(GgmlType::Q6_K) => Some(2),
        _ => None,
    }
}
/// Whether the kernel for `ty` can read x in f16 (modules
/// `matvec_i8mm[_emu]_x16_*`): the form without staging rounds, whose B
/// fragments are f16 (Q4_K, Q6_K; matvec_i8mm_h16.glsl X_F16).
pub(crate) fn reads_f16_x(ty: WeightFormat) -> bool {
    unstaged_fragments(ty).is_some()
}

/// Tokens per pass of the kernel without staging rounds.
const DIRECT_TOKENS: u32 = 8;

/// Fragments staged per round of a step (the shader's FRAGS): one per x
/// block of each half of the row, two for Q6_K (whose scales cover 16
/// values); None for the types without the kernel.
fn round_fragments(ty: WeightFormat) -> Option<u64> {
    use GgmlType::*;
    match ty {
        WeightFormat::Ggml(Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q4_K | Q5_K) | WeightFormat::Fq3 => {
            Some(2)
        }
        WeightFormat::Ggml(Q6_K) => Some(4),
        _ => None,
    }
}
/// A workgroup of the kernel for one weight type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Int8MatrixShape {
    pub(crate) warps: u32,
    pub(crate) tokens: u32,
    /// Fragments of 16 rows each subgroup multiplies by one x fragment
    /// (the unstaged form; 1 for the staged one).
    pub(crate) row_frags: u32,
}

/// A tuning knob: the power of two up to `most` in the variable `name`,
/// read once into `cell`.
fn power_of_two_knob(
    cell: &'static std::sync::OnceLock<Option<u32>>,
    name: &str,
    most: u32,
) -> Option<u32> {
    *cell.get_or_init(|| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse::<u32>().ok())
            .filter(|&w| w.is_power_of_two() && w <= most)
    })
}

/// FISH_VK_I8MM_WARPS: the most subgroups per workgroup (1, 2, 4, 8 or
/// 16; tuning).
fn warps_override() -> Option<u32> {
    static READ: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    power_of_two_knob(&READ, "FISH_VK_I8MM_WARPS", 16)
}

/// FISH_VK_I8MM_ROWFRAGS: row fragments per subgroup of the unstaged form
/// (1, 2 or 4; tuning).
fn row_frags_override() -> Option<u32> {
    static READ: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    power_of_two_knob(&READ, "FISH_VK_I8MM_ROWFRAGS", 4)
}

/// Subgroups a dispatch must keep with two row fragments each: below it
/// one fragment per subgroup (more of them in flight) measured faster.
const TWO_FRAGMENT_MIN_SUBGROUPS: usize = 1024;

/// Row fragments per subgroup of the unstaged form for `n_rows` rows and
/// `warps` subgroups per workgroup: two where the dispatch still has
/// `TWO_FRAGMENT_MIN_SUBGROUPS` subgroups with them. Two fragments share
/// each x fragment and its scales (half the activation loads per weight)
/// and keep two products per block in flight; on the H200 at 8 tokens the
/// llama-8b gate/up matvec (2 x 14336 rows of 4096, 1792 subgroups) went
/// from 70.5 to 57.4 us and down (4096 rows of 14336, 1024) from 43.6 to
/// 37.2, while wo (4096 rows of 4096, 512) lost (15.6 -> 16.9) and every
/// llama-1b projection (512 subgroups or fewer) too (B = 8 2343 -> 2124
/// tok/s with two everywhere). docs/BENCHMARKS.md.
fn default_row_frags(n_rows: usize, warps: u32) -> u32 {
    match dispatch_subgroups(n_rows, warps, 2) >= TWO_FRAGMENT_MIN_SUBGROUPS {
        true => 2,
        false => 1,
    }
}

/// Subgroups per workgroup of the unstaged form for `n_rows` rows of
/// `n_in` values (a whole number of super-blocks), before the shared-memory
/// fit: `WARPS_DIRECT`, `MAX_WARPS_DIRECT` where the dispatch would have
/// fewer than `FEW_SUBGROUPS` subgroups, at most the largest power of two
/// not above the row's super-blocks (no subgroup without work).
fn direct_warps(n_in: usize, n_rows: usize) -> u32 {
    let warps = match dispatch_subgroups(n_rows, WARPS_DIRECT, 1) < FEW_SUBGROUPS {
        true => MAX_WARPS_DIRECT,
        false => WARPS_DIRECT,
    };
    let super_blocks = (n_in / STEP_VALUES).max(1);
    // The largest power of two <= super_blocks (no more than the most
    // warps, so the cast is exact).
    let cap = (1usize << super_blocks.ilog2()).min(MAX_WARPS_DIRECT as usize) as u32;
    warps.min(cap)
}

/// Subgroups of an unstaged-form dispatch over `n_rows` rows with `warps`
/// subgroups per workgroup of `row_frags` fragments of 16 rows each.
fn dispatch_subgroups(n_rows: usize, warps: u32, row_frags: u32) -> usize {
    n_rows.div_ceil((row_frags * FRAGMENT_ROWS) as usize) * warps as usize
}

impl Int8MatrixShape {
    /// The most subgroups (up to MAX_WARPS, or `direct_warps` for the
    /// unstaged form) whose tiles fit `max_shared`
    /// bytes, for `n_rows` rows of `n_in` values of `ty` and passes of
    /// `tokens`; None where the type has no such kernel or n_in is not a
    /// whole number of steps.
    pub(crate) fn new(
        ty: WeightFormat,
        n_in: usize,
        n_rows: usize,
        tokens: u32,
        max_shared: u32,
    ) -> Option<Int8MatrixShape> {
        round_fragments(ty)?;
        if n_in == 0 || !n_in.is_multiple_of(STEP_VALUES) {
            return None;
        }
        let direct = unstaged_fragments(ty).is_some();
        if direct && tokens != DIRECT_TOKENS {
            return None;
        }
        let most = match direct {
            true => direct_warps(n_in, n_rows),
            false => MAX_WARPS,
        };
        let mut warps = warps_override().unwrap_or(most);
        while warps > 0 {
            let row_frags = match direct {
                true => row_frags_override().unwrap_or_else(|| default_row_frags(n_rows, warps)),
                false => 1,
            };
            let shape = Int8MatrixShape {
                warps,
                tokens,
                row_frags,
            };
            if shape.shared_bytes(ty)? <= u64::from(max_shared) {
                return Some(shape);
            }
            warps /= 2;
        }
        None
    }

    pub(crate) fn threads(&self) -> u32 {
        self.warps * LANES
    }

    /// The shader's shared arrays (matvec_i8mm.comp), in bytes.
    pub(crate) fn shared_bytes(&self, ty: WeightFormat) -> Option<u64> {
        let frags = round_fragments(ty)?;
        let (warps, tokens) = (u64::from(self.warps), u64::from(self.tokens));
        let rows = u64::from(FRAGMENT_ROWS);
        if unstaged_fragments(ty).is_some() {
            let sums = warps * rows * u64::from(self.row_frags) * tokens * 4;
            // On a real device the layout check's index matrices (A and B
            // in f16, C's element numbers in f32); emulated, each
            // subgroup's A and B fragments in f32 (16 deep).
            let real = rows * 16 * 2 + 16 * tokens * 2 + rows * tokens * 4;
            let emulated = warps * (rows * 16 * 4 + tokens * 16 * 4);
            return Some(sums + real.max(emulated));
        }
        let row_bytes = u64::from(ROW_BYTES);
        let per_warp = frags * rows * row_bytes // A fragments of a round
            + 2 * tokens * row_bytes // its two x blocks
            + frags * rows * 8 // (scale, minv') per row
            + frags * tokens * 8 // (d, s) per token
            + rows * tokens * 4; // sums for the reduction
                                 // The element-index matrix.
        Some(warps * per_warp + rows * tokens * 4)
    }

    /// The shape of the gate/up kernel with the activation in its
    /// epilogue (`Kernel::MatvecInt8MatrixGateUp`): these subgroups with
    /// two row fragments, one of gate rows and one of the same up rows,
    /// where the type has the unstaged form and the tiles fit.
    pub(crate) fn gate_up(self, ty: WeightFormat, max_shared: u32) -> Option<Self> {
        unstaged_fragments(ty)?;
        let shape = Int8MatrixShape {
            row_frags: 2,
            ..self
        };
        (shape.shared_bytes(ty)? <= u64::from(max_shared)).then_some(shape)
    }

    /// Rows of a workgroup.
    pub(crate) fn rows(&self) -> u32 {
        FRAGMENT_ROWS * self.row_frags
    }

    /// Specialisation constants 0..3: subgroups, tokens, threads, row
    /// fragments.
    pub(crate) fn spec(&self) -> [u32; 4] {
        [self.warps, self.tokens, self.threads(), self.row_frags]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::coopmat::fragment_property as prop;

    #[test]
    fn eight_token_fragments_are_preferred() {
        use vk::ComponentTypeKHR as C;
        let both = [prop(16, 16, 32, C::SINT8), prop(16, 8, 32, C::SINT8)];
        assert_eq!(pick_tokens(&both), Some(8));
        assert_eq!(pick_tokens(&both[..1]), Some(16));
        // f16 shapes, unsigned bytes and other depths do not count.
        assert_eq!(pick_tokens(&[prop(16, 8, 16, C::FLOAT16)]), None);
        assert_eq!(pick_tokens(&[prop(16, 8, 32, C::UINT8)]), None);
        assert_eq!(pick_tokens(&[prop(16, 8, 16, C::SINT8)]), None);
    }

    #[test]
    fn the_unstaged_form_needs_16_by_8_by_16_f16_fragments() {
        use vk::ComponentTypeKHR as C;
        assert!(has_f16_fragments(&[
            prop(16, 8, 32, C::SINT8),
            prop(16, 8, 16, C::FLOAT16)
        ]));
        assert!(!has_f16_fragments(&[prop(16, 16, 16, C::FLOAT16)]));
        assert!(!has_f16_fragments(&[prop(16, 8, 32, C::SINT8)]));
        // f16 accumulators do not count: the sums run over whole rows.
        let f16_sums = prop(16, 8, 16, C::FLOAT16)
            .c_type(C::FLOAT16)
            .result_type(C::FLOAT16);
        assert!(!has_f16_fragments(&[f16_sums]));
    }

    /// The open-time check's upload, product and free run on any device
    /// through the emulated kernel (same layout, no products on the matrix
    /// units); the real kernel's check runs at every open of a device with
    /// int8 fragments.
    #[test]
    fn the_layout_check_runs_a_product_and_frees_its_tensor() {
        let Some(gpu) = crate::global() else {
            assert!(
                std::env::var("FISH_REQUIRE_GPU").as_deref() != Ok("1"),
                "FISH_REQUIRE_GPU=1 but no device"
            );
            return;
        };
        // (Freeing the tensor is part of the result.)
        assert_eq!(
            layout_holds(gpu, crate::Kernel::MatvecInt8MatrixEmulated),
            Ok(())
        );
    }

    #[test]
    fn shapes_fit_the_shared_memory_and_whole_steps() {
        use GgmlType::*;
        let q4k = WeightFormat::Ggml(Q4_K);
        let q6k = WeightFormat::Ggml(Q6_K);
        // 4096 rows (256 fragments): fewer than 2048 subgroups with four per
        // workgroup, so eight.
        let s = Int8MatrixShape::new(q4k, 4096, 4096, 8, 48 * 1024).expect("Q4_K");
        assert_eq!((s.warps, s.threads()), (8, 256));
        // Q4_K without staging rounds: the sums (8 x 16 rows x 2 fragments
        // x 8 tokens x 4 bytes), and the larger of the layout check's
        // matrices (512 + 256 + 512) and the emulation's f32 fragments (8 x
        // (1024 + 512)).
        assert_eq!(s.row_frags, 2);
        assert_eq!(s.shared_bytes(q4k), Some(8192 + 12288));
        // Q6_K's fragments are the same.
        let s = Int8MatrixShape::new(q6k, 4096, 4096, 8, 48 * 1024).expect("Q6_K");
        assert_eq!((s.warps, s.shared_bytes(q6k)), (8, Some(8192 + 12288)));
        // Where shared memory is short the subgroups halve.
        let small = Int8MatrixShape::new(q6k, 4096, 4096, 8, 3 * 1024).expect("Q6_K, 3 KiB");
        assert_eq!(small.warps, 1);
        // Subgroups per workgroup: four where the rows alone give 2048
        // subgroups or more (llama-8b's gate/up, 28672 rows, and output
        // projection; llama-1b's gate/up, 16384 rows), eight below (down
        // rows, 4096 or 2048 of them), never more than the row's super-
        // blocks (512 values: two; 256: one).
        for (n_in, n_rows, warps) in [
            (4096, 28672, 4),
            (4096, 128256, 4),
            (2048, 16384, 4),
            (14336, 4096, 8),
            (8192, 2048, 8),
            (2048, 3072, 8),
            (65536, 4096, 8),
            (512, 4096, 2),
            (256, 4096, 1),
        ] {
            let s = Int8MatrixShape::new(q4k, n_in, n_rows, 8, 48 * 1024).expect("Q4_K");
            assert_eq!(s.warps, warps, "{n_in} x {n_rows}");
        }
        // The unstaged kernel is written for passes of 8 tokens.
        assert_eq!(Int8MatrixShape::new(q6k, 4096, 4096, 16, 48 * 1024), None);
        // The staged types: per subgroup 2 fragments (1536 B), two x blocks
        // (768), their scales (256 + 128) and the sums (512); the index
        // matrix (512).
        let q4_0 = WeightFormat::Ggml(Q4_0);
        let s = Int8MatrixShape::new(q4_0, 4096, 4096, 8, 48 * 1024).expect("Q4_0");
        assert_eq!(s.shared_bytes(q4_0), Some(4 * 3200 + 512));
        let small = Int8MatrixShape::new(q4_0, 4096, 4096, 8, 12 * 1024).expect("Q4_0, 12 KiB");
        assert_eq!(small.warps, 2);
        // Steps are 256 values.
        assert_eq!(
            Int8MatrixShape::new(q6k, 4096 + 128, 4096, 8, 48 * 1024),
            None
        );
        assert_eq!(
            Int8MatrixShape::new(WeightFormat::Fq3, 896, 4096, 8, 48 * 1024),
            None
        );
        assert!(Int8MatrixShape::new(WeightFormat::Fq3, 4096, 4096, 16, 48 * 1024).is_some());
        assert_eq!(
            Int8MatrixShape::new(WeightFormat::Ggml(F16), 4096, 4096, 8, 48 * 1024),
            None
        );
        // Two row fragments per subgroup where the dispatch keeps 1024
        // subgroups with them: llama-8b's gate/up (14336 rows of 4096 here,
        // 4 subgroups) and down (4096 rows of 14336, 8), not llama-1b's
        // down (2048 rows of 8192, 8) nor the staged types; the sums grow
        // with the rows.
        let s = Int8MatrixShape::new(q4k, 4096, 14336, 8, 48 * 1024).expect("gate");
        assert_eq!((s.warps, s.row_frags, s.rows()), (4, 2, 32));
        assert_eq!(s.shared_bytes(q4k), Some(2 * 2048 + 6144));
        assert_eq!(s.spec(), [4, 8, 128, 2]);
        let s = Int8MatrixShape::new(q6k, 14336, 4096, 8, 48 * 1024).expect("down");
        assert_eq!((s.warps, s.row_frags), (8, 2));
        let s = Int8MatrixShape::new(q4k, 8192, 2048, 8, 48 * 1024).expect("llama-1b down");
        assert_eq!((s.warps, s.row_frags, s.rows()), (8, 1, 16));
        let s = Int8MatrixShape::new(q4k, 256, 32 * 1024 + 17, 8, 48 * 1024).expect("tail");
        assert_eq!((s.warps, s.row_frags), (1, 2));
        let s = Int8MatrixShape::new(q4_0, 4096, 1 << 20, 8, 48 * 1024).expect("Q4_0 tall");
        assert_eq!(s.row_frags, 1);
        // A device too small for one subgroup's tiles has none.
        assert_eq!(Int8MatrixShape::new(q4k, 4096, 4096, 8, 1024), None);
    }
}
