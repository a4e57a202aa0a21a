//! AVX-512 VNNI kernels (256-bit vectors): byte products summed exactly
//! into i32 lanes with one `vpdpbusd`.

use core::arch::x86_64::{__m256i, _mm256_dpbusd_epi32, _mm256_setzero_si256};

#[target_feature(enable = "avx2,avx512f,avx512vl,avx512vnni")]
#[inline]
unsafe fn dpbusd_sum(x: __m256i, y: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(_mm256_setzero_si256(), x, y)
}

#[target_feature(enable = "avx2,avx512f,avx512vl,avx512vnni")]
#[inline]
unsafe fn dpbusd_acc(acc: __m256i, x: __m256i, y: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(acc, x, y)
}

super::kernels::define_kernels!("avx2,fma,f16c,avx512f,avx512vl,avx512vnni", dpbusd_sum);

/// The 256-bit tiles at this level: the matmul runs the 512-bit tiles of
/// `tiles512`, which use `codes` from here and are tested bit for bit
/// against these.
#[cfg_attr(not(test), allow(dead_code))]
pub mod tiles {
    super::super::tiles::define_tiles!(
        "avx2,fma,f16c,avx512f,avx512vl,avx512vnni",
        super::dpbusd_acc,
        4
    );
}
