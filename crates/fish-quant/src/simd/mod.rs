//! Runtime selection of the SIMD dot products.
//!
//! Each `best_*` returns the fastest kernel this CPU supports; every kernel
//! computes the same per-block integer sums as the portable one in
//! `blocks`, so results differ only in float accumulation order.

use crate::blocks::{
    BlockFormat, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K,
    BlockQ8_0, F16Value, F32Value, VecDot,
};

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod kernels;
#[cfg(target_arch = "x86_64")]
mod ktiles;
#[cfg(target_arch = "x86_64")]
mod quant_acts;
#[cfg(test)]
mod tests;
#[cfg(target_arch = "x86_64")]
mod tiles;
#[cfg(target_arch = "x86_64")]
mod tiles512;

use fish_gguf::GgmlType;

/// The instruction-set level the kernels use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SimdLevel {
    Portable,
    Avx2,
    Avx512Vnni,
}

impl SimdLevel {
    pub fn name(self) -> &'static str {
        match self {
            Self::Portable => "portable",
            Self::Avx2 => "avx2",
            Self::Avx512Vnni => "avx512-vnni",
        }
    }
}

/// The best level this CPU supports, detected once. `FISH_QUANT_SIMD=portable`
/// or `=avx2` caps it (for comparisons).
pub fn simd_level() -> SimdLevel {
    static LEVEL: std::sync::OnceLock<SimdLevel> = std::sync::OnceLock::new();
    *LEVEL.get_or_init(|| {
        let detected = detect();
        match std::env::var("FISH_QUANT_SIMD").as_deref() {
            Ok("portable") => SimdLevel::Portable,
            Ok("avx2") if detected != SimdLevel::Portable => SimdLevel::Avx2,
            _ => detected,
        }
    })
}

#[cfg(target_arch = "x86_64")]
fn detect() -> SimdLevel {
    let avx2 = is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c");
    let vnni = is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni");
    match (avx2, vnni) {
        (true, true) => SimdLevel::Avx512Vnni,
        (true, false) => SimdLevel::Avx2,
        _ => SimdLevel::Portable,
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn detect() -> SimdLevel {
    SimdLevel::Portable
}

/// Defines `best_$name`, choosing between the kernels `$kernel` of the SIMD
/// modules and the portable `vec_dot` of `$B`.
macro_rules! select {
    ($fn_name:ident, $B:ty, $kernel:ident) => {
        pub fn $fn_name() -> VecDot<$B> {
            #[cfg(target_arch = "x86_64")]
            {
                // SAFETY: each kernel is only returned when `simd_level`
                // detected the features it was compiled for.
                match simd_level() {
                    SimdLevel::Avx512Vnni => return |w, a| unsafe { avx512::$kernel(w, a) },
                    SimdLevel::Avx2 => return |w, a| unsafe { avx2::$kernel(w, a) },
                    SimdLevel::Portable => {}
                }
            }
            <$B as BlockFormat>::vec_dot
        }
    };
}

select!(best_f32_dot, F32Value, f32_dot);
select!(best_f16_dot, F16Value, f16_dot);
select!(best_q4_0_dot, BlockQ4_0, q4_0);
select!(best_q4_1_dot, BlockQ4_1, q4_1);
select!(best_q5_0_dot, BlockQ5_0, q5_0);
select!(best_q5_1_dot, BlockQ5_1, q5_1);
select!(best_q8_0_dot, BlockQ8_0, q8_0);
select!(best_q4_k_dot, BlockQ4K, q4_k);
select!(best_q5_k_dot, BlockQ5K, q5_k);
select!(best_q6_k_dot, BlockQ6K, q6_k);

/// One activation block's scale, converted once per set of activations:
/// `d` as f32, and `aux` the f32 bits of `s` (Q8_1; 0 for the others, whose
/// code offsets come as [`LaneOffsets`]).
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub(crate) struct ActScale {
    pub d: f32,
    pub aux: u32,
}

/// What one Q8_0 activation block contributes to each of the 8 i32 lanes
/// of a dot product with codes stored as `q + K` (formats without a min):
/// `-K` times the sum of the lane's 4 activations. The same for every
/// weight row, so it is computed once per matmul call rather than per tile.
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C, align(32))]
pub(crate) struct LaneOffsets(pub [i32; 8]);

/// `K` of the codes `q + K` that the tile kernels use for the formats whose
/// values are `d * (q - K)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CodeOffset {
    /// Q4_0.
    K8,
    /// Q5_0.
    K16,
    /// Q8_0 (signed codes as unsigned bytes).
    K128,
}

impl CodeOffset {
    pub const COUNT: usize = 3;

    /// The offset of weight type `ty`'s tile codes, `None` for formats
    /// with a min or without tiles.
    pub fn of(ty: GgmlType) -> Option<Self> {
        match ty {
            GgmlType::Q4_0 => Some(Self::K8),
            GgmlType::Q5_0 => Some(Self::K16),
            GgmlType::Q8_0 => Some(Self::K128),
            _ => None,
        }
    }

    pub fn value(self) -> i32 {
        match self {
            Self::K8 => 8,
            Self::K16 => 16,
            Self::K128 => 128,
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }
}

/// One tile of a matmul: `rows` (1..=4) consecutive weight rows times
/// `toks` consecutive tokens, `y[k * y_stride + r] = dot(row r, token k)`.
pub(crate) struct Tile {
    /// First byte of the first row; rows are `row_bytes` apart.
    pub w: *const u8,
    pub row_bytes: usize,
    pub rows: usize,
    /// First activation block of the first token; tokens are
    /// `act_row_bytes` apart.
    pub a: *const u8,
    pub act_row_bytes: usize,
    /// `apr` scales per token, first token first.
    pub scales: *const ActScale,
    /// `apr` lane offsets per token, laid out as `scales`; read only by
    /// the tiles of formats with a [`CodeOffset`].
    pub offsets: *const LaneOffsets,
    /// Blocks per row (weights and activations alike).
    pub apr: usize,
    pub toks: usize,
    pub y: *mut f32,
    pub y_stride: usize,
}

/// A tile kernel. # Safety: every pointer of the tile must cover what it
/// describes (`rows` rows, `toks` tokens of `apr` blocks and scales, and
/// the `y` elements written).
pub(crate) type TileFn = unsafe fn(&Tile);

/// The tile kernels of one weight format at the detected SIMD level.
///
/// A kernel for T tokens does the work of T tokens whatever `toks` says
/// (missing tokens repeat the last one), so a chunk of a batch takes the
/// narrowest kernel that covers it: a batch of two on the 8-token tiles
/// cost as much as a batch of eight (CPU batched decode at B = 2 ran below
/// B = 1). Every kernel gives each token the same bits.
#[derive(Clone, Copy)]
pub(crate) struct TileKernels {
    /// Decode: one token per tile.
    pub one: TileFn,
    /// Up to two tokens.
    pub two: TileFn,
    /// Up to four tokens (up to `max_tok` where that is fewer).
    pub four: TileFn,
    /// Batches: up to `max_tok` tokens per tile.
    pub many: TileFn,
    pub max_tok: usize,
}

impl TileKernels {
    /// The narrowest kernel for a chunk of `toks` (1..=max_tok) tokens.
    pub fn for_tokens(&self, toks: usize) -> TileFn {
        match toks {
            0 | 1 => self.one,
            2 => self.two,
            3 | 4 => self.four,
            _ => self.many,
        }
    }

    /// Every kernel with the tokens it takes at most.
    #[cfg(test)]
    pub fn each(&self) -> [(usize, TileFn); 4] {
        [
            (1, self.one),
            (2.min(self.max_tok), self.two),
            (4.min(self.max_tok), self.four),
            (self.max_tok, self.many),
        ]
    }
}

/// The AVX-512 VNNI tiles of a 32-value format: 512-bit vectors holding
/// two rows, bit-identical to the 256-bit tiles (which run where the CPU
/// lacks AVX-512 BW).
///
/// # Safety
/// The CPU must have AVX-512 F/VL/VNNI, FMA and F16C.
#[cfg(target_arch = "x86_64")]
unsafe fn avx512_tiles<const F: u8>() -> TileKernels {
    if !is_x86_feature_detected!("avx512bw") {
        return avx512::tiles::tiles::<F>();
    }
    TileKernels {
        one: tiles512::tile::<F, 1>,
        two: tiles512::tile::<F, 2>,
        four: tiles512::tile::<F, 4>,
        many: tiles512::tile::<F, WIDE_TILE_TOKENS>,
        max_tok: WIDE_TILE_TOKENS,
    }
}

/// Tokens per batch tile of the 512-bit tiles: their 2 x 8 accumulators
/// still fit the 32 vector registers, and each block's codes and scale
/// gather are shared by twice the tokens of a 4-token tile.
#[cfg(target_arch = "x86_64")]
const WIDE_TILE_TOKENS: usize = 8;

/// Rows per tile of every tile kernel.
pub(crate) const TILE_ROWS: usize = 4;

/// How far ahead of the current tile's weights the kernels prefetch (two
/// tiles, at least 8 KiB): rows are short (a SmolLM2 row is a few cache
/// lines), so the hardware stream prefetcher sees too little of each to
/// ramp up on its own. Measured on the 2-core dev machine: 2-3x decode
/// throughput on matrices larger than the caches.
#[cfg(target_arch = "x86_64")]
fn prefetch_distance(t: &Tile) -> usize {
    (2 * TILE_ROWS * t.row_bytes).max(PREFETCH_MIN_BYTES)
}

/// Lower bound of [`prefetch_distance`]: more than one memory latency of work.
#[cfg(target_arch = "x86_64")]
const PREFETCH_MIN_BYTES: usize = 8192;

/// Prefetches `lines` cache lines from `p` on into L2 (no fault past the
/// end): the L2 tracks more outstanding misses than the L1 fill buffers,
/// and the weights are read once.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_lines(p: *const u8, lines: usize) {
    use core::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
    for i in 0..lines {
        // SAFETY: prefetching is a hint and never faults.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(64 * i) as *const i8) };
    }
}

/// The tile kernels for a matrix of `n_out` rows of type `ty`, if this CPU
/// has them; the choice is made once per matmul call.
pub(crate) fn tile_kernels(ty: GgmlType, n_out: usize) -> Option<TileKernels> {
    #[cfg(target_arch = "x86_64")]
    {
        use tiles::fmt;
        let f = match ty {
            // Rounded as ggml's repacked kernels (see
            // `BlockFormat::interleaved_vec_dot`).
            GgmlType::Q4_0 if n_out.is_multiple_of(crate::blocks::INTERLEAVED_ROWS) => fmt::Q4_0_X8,
            GgmlType::Q4_0 => fmt::Q4_0,
            GgmlType::Q4_1 => fmt::Q4_1,
            GgmlType::Q5_0 => fmt::Q5_0,
            GgmlType::Q5_1 => fmt::Q5_1,
            GgmlType::Q8_0 => fmt::Q8_0,
            GgmlType::Q4_K | GgmlType::Q6_K => {
                // SAFETY: the k-quant tiles need AVX-512 BW on top of VNNI.
                return (simd_level() == SimdLevel::Avx512Vnni
                    && is_x86_feature_detected!("avx512bw"))
                .then(|| unsafe {
                    if ty == GgmlType::Q4_K {
                        ktiles::q4_k()
                    } else {
                        ktiles::q6_k()
                    }
                });
            }
            _ => return None,
        };
        // SAFETY: each level's kernels are only returned when `simd_level`
        // detected its features.
        unsafe {
            match (simd_level(), f) {
                // One sum per block and row: no lanes to pack two rows into.
                (SimdLevel::Avx512Vnni, fmt::Q4_0_X8) => {
                    Some(avx512::tiles::tiles::<{ fmt::Q4_0_X8 }>())
                }
                (SimdLevel::Avx512Vnni, fmt::Q4_0) => Some(avx512_tiles::<{ fmt::Q4_0 }>()),
                (SimdLevel::Avx512Vnni, fmt::Q4_1) => Some(avx512_tiles::<{ fmt::Q4_1 }>()),
                (SimdLevel::Avx512Vnni, fmt::Q5_0) => Some(avx512_tiles::<{ fmt::Q5_0 }>()),
                (SimdLevel::Avx512Vnni, fmt::Q5_1) => Some(avx512_tiles::<{ fmt::Q5_1 }>()),
                (SimdLevel::Avx512Vnni, _) => Some(avx512_tiles::<{ fmt::Q8_0 }>()),
                (SimdLevel::Avx2, fmt::Q4_0_X8) => Some(avx2::tiles::tiles::<{ fmt::Q4_0_X8 }>()),
                (SimdLevel::Avx2, fmt::Q4_0) => Some(avx2::tiles::tiles::<{ fmt::Q4_0 }>()),
                (SimdLevel::Avx2, fmt::Q4_1) => Some(avx2::tiles::tiles::<{ fmt::Q4_1 }>()),
                (SimdLevel::Avx2, fmt::Q5_0) => Some(avx2::tiles::tiles::<{ fmt::Q5_0 }>()),
                (SimdLevel::Avx2, fmt::Q5_1) => Some(avx2::tiles::tiles::<{ fmt::Q5_1 }>()),
                _ => None,
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (ty, n_out);
        None
    }
}

/// Quantises 32 activations the Q8_0/Q8_1 way into `qs`, returning
/// `(d, sum(qs))`, with SIMD where the CPU has it; `None` (nothing written)
/// where the portable code must do it (no SIMD, or a non-finite value).
#[inline]
pub(crate) fn quantize_q8_block(x: &[f32; 32], qs: &mut [i8; 32]) -> Option<(f32, i32)> {
    #[cfg(target_arch = "x86_64")]
    if simd_level() != SimdLevel::Portable {
        // SAFETY: every level above portable has AVX2.
        return unsafe { quant_acts::q8_block(x, qs) };
    }
    let _ = (x, qs);
    None
}

/// Quantises 256 activations the Q8_K way into `out` with SIMD where the
/// CPU has it; false (nothing written) where the portable code must do it
/// (no SIMD, or a non-finite value).
#[inline]
pub(crate) fn quantize_q8_k_block(x: &[f32; 256], out: &mut crate::blocks::BlockQ8K) -> bool {
    #[cfg(target_arch = "x86_64")]
    if simd_level() != SimdLevel::Portable {
        // SAFETY: every level above portable has AVX2.
        return unsafe { quant_acts::q8_k_block(x, out) };
    }
    let _ = (x, out);
    false
}
