//! The Q8_0/Q8_1 activation scheme of `blocks` (`d = amax / 127`, codes
//! `round_ties_even(x * 127 / amax)`) in AVX2, bit for bit: the same f32
//! products, the same rounding, per 32-value block. Blocks holding a NaN or
//! an infinity go to the portable code, whose saturating casts define them.

use core::arch::x86_64::*;

/// Quantises one block of 32 values into `qs`; returns `(d, sum(qs))`, or
/// `None` (nothing written) when the block is not finite.
///
/// # Safety
/// The CPU must have AVX2.
#[target_feature(enable = "avx2")]
pub unsafe fn q8_block(x: &[f32; 32], qs: &mut [i8; 32]) -> Option<(f32, i32)> {
    let v: [__m256; 4] = core::array::from_fn(|i| _mm256_loadu_ps(x.as_ptr().add(8 * i)));
    let sign = _mm256_set1_ps(-0.0);
    let mut amax = _mm256_setzero_ps();
    let mut finite = _mm256_setzero_ps();
    for vi in v {
        // |x|; max keeps its second operand on NaN, like f32::max keeps the
        // non-NaN side, but NaN blocks are sent away below anyway.
        amax = _mm256_max_ps(_mm256_andnot_ps(sign, vi), amax);
        // x - x is 0 for finite x, NaN otherwise.
        finite = _mm256_add_ps(finite, _mm256_sub_ps(vi, vi));
    }
    if _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_UNORD_Q>(finite, finite)) != 0 {
        return None;
    }
    let m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let m = _mm_max_ss(m, _mm_movehdup_ps(m));
    let amax = _mm_cvtss_f32(m);
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let idv = _mm256_set1_ps(id);
    let q: [__m256i; 4] = core::array::from_fn(|i| {
        let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(v[i], idv),
        );
        _mm256_cvtps_epi32(r)
    });
    // The codes are within -127..=127: the saturating packs are exact; the
    // packs interleave 128-bit lanes, which the final permute undoes.
    let w01 = _mm256_packs_epi32(q[0], q[1]);
    let w23 = _mm256_packs_epi32(q[2], q[3]);
    let b = _mm256_packs_epi16(w01, w23);
    let b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(qs.as_mut_ptr() as *mut __m256i, b);
    let s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    let s = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
    Some((d, _mm_cvtsi128_si32(s)))
}
