//! The activation schemes of `blocks` in AVX2, bit for bit: Q8_0/Q8_1
//! (`d = amax / 127`, codes `round_ties_even(x * 127 / amax)`, per 32-value
//! block) and Q8_K (per 256-value block, scaled by the signed maximum), with
//! the same f32 products and the same rounding. Blocks holding a NaN or an
//! infinity go to the portable code, whose saturating casts define them.

use crate::blocks::BlockQ8K;
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

/// Quantises one Q8_K block of 256 values as `BlockQ8K::quantize` does (the
/// signed value of largest magnitude, first one on ties, sets
/// `iscale = -127 / max`; codes `round_ties_even(iscale * x)` capped at 127;
/// group sums of 16 codes; `d = 1 / iscale`). Returns false (nothing
/// written) when the block is not finite.
///
/// # Safety
/// The CPU must have AVX2.
#[target_feature(enable = "avx2")]
pub unsafe fn q8_k_block(x: &[f32; 256], out: &mut BlockQ8K) -> bool {
    let p = x.as_ptr();
    let sign = _mm256_set1_ps(-0.0);
    let mut amax = _mm256_setzero_ps();
    let mut finite = _mm256_setzero_ps();
    for i in 0..32 {
        let v = _mm256_loadu_ps(p.add(8 * i));
        amax = _mm256_max_ps(_mm256_andnot_ps(sign, v), amax);
        finite = _mm256_add_ps(finite, _mm256_sub_ps(v, v));
    }
    if _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_UNORD_Q>(finite, finite)) != 0 {
        return false;
    }
    let m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let m = _mm_max_ss(m, _mm_movehdup_ps(m));
    let amax = _mm_cvtss_f32(m);
    if amax == 0.0 {
        *out = bytemuck::Zeroable::zeroed();
        return true;
    }
    // The first value whose magnitude is the maximum, with its sign.
    let target = _mm256_set1_ps(amax);
    let mut max = amax;
    for i in 0..32 {
        let v = _mm256_loadu_ps(p.add(8 * i));
        let hit = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(
            _mm256_andnot_ps(sign, v),
            target,
        ));
        if hit != 0 {
            max = x[8 * i + hit.trailing_zeros() as usize];
            break;
        }
    }
    let iscale = -127.0 / max;
    let is = _mm256_set1_ps(iscale);
    let cap = _mm256_set1_epi32(127);
    // Per 32 values: the two 16-value groups' codes summed lane-wise (their
    // lane totals are the group sums).
    let mut group_lanes = [_mm256_setzero_si256(); 16];
    for c in 0..8 {
        let q: [__m256i; 4] = core::array::from_fn(|i| {
            let v = _mm256_loadu_ps(p.add(32 * c + 8 * i));
            let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                _mm256_mul_ps(v, is),
            );
            _mm256_min_epi32(_mm256_cvtps_epi32(r), cap)
        });
        // Codes lie in -127..=127: the saturating packs are exact.
        let w01 = _mm256_packs_epi32(q[0], q[1]);
        let w23 = _mm256_packs_epi32(q[2], q[3]);
        let b = _mm256_packs_epi16(w01, w23);
        let b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(out.qs.as_mut_ptr().add(32 * c) as *mut __m256i, b);
        group_lanes[2 * c] = _mm256_add_epi32(q[0], q[1]);
        group_lanes[2 * c + 1] = _mm256_add_epi32(q[2], q[3]);
    }
    let lo = lane_totals(&group_lanes[..8]);
    let hi = lane_totals(&group_lanes[8..]);
    // Group sums are within +-16 * 127: exact in i16.
    let sums = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(lo, hi));
    _mm256_storeu_si256(out.bsums.as_mut_ptr() as *mut __m256i, sums);
    out.d = 1.0 / iscale;
    true
}

/// Lane `i` of the result: the total of the 8 lanes of `v[i]` (8 vectors).
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn lane_totals(v: &[__m256i]) -> __m256i {
    // Per 128-bit half, hadd twice gives the half-totals of four vectors.
    let h0 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    let h1 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
    _mm256_add_epi32(
        _mm256_permute2x128_si256::<0x20>(h0, h1),
        _mm256_permute2x128_si256::<0x31>(h0, h1),
    )
}
