//! AVX2 + FMA + F16C kernels: byte products summed with `vpmaddubsw` into
//! i16 pairs (at most 2 * 63 * 127, no saturation for these formats) and
//! `vpmaddwd` into i32.

use core::arch::x86_64::{
    __m256i, _mm256_add_epi32, _mm256_madd_epi16, _mm256_maddubs_epi16, _mm256_set1_epi16,
};

#[target_feature(enable = "avx2")]
#[inline]
unsafe fn maddubs_sum(x: __m256i, y: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), _mm256_set1_epi16(1))
}

#[target_feature(enable = "avx2")]
#[inline]
unsafe fn maddubs_acc(acc: __m256i, x: __m256i, y: __m256i) -> __m256i {
    _mm256_add_epi32(acc, maddubs_sum(x, y))
}

super::kernels::define_kernels!("avx2,fma,f16c", maddubs_sum);

/// Multi-row tiles. Two tokens per tile: 16 vector registers hold 4 x 2
/// accumulators plus the decoded rows. Q8_0 stays on the row kernels here:
/// its codes shifted to unsigned (up to 255) would saturate `vpmaddubsw`.
pub mod tiles {
    super::super::tiles::define_tiles!("avx2,fma,f16c", super::maddubs_acc, 2);
}
