//! AVX2 + FMA + F16C kernels: byte products summed with `vpmaddubsw` into
//! i16 pairs (at most 2 * 63 * 127, no saturation for these formats) and
//! `vpmaddwd` into i32.

use core::arch::x86_64::{__m256i, _mm256_madd_epi16, _mm256_maddubs_epi16, _mm256_set1_epi16};

#[target_feature(enable = "avx2")]
#[inline]
unsafe fn maddubs_sum(x: __m256i, y: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), _mm256_set1_epi16(1))
}

super::kernels::define_kernels!("avx2,fma,f16c", maddubs_sum);
