//! Multi-row, multi-token tile kernels for Q4_K and Q6_K against Q8_K
//! activations (AVX-512 VNNI + BW; the AVX2 level keeps the row kernels).
//!
//! Codes times activations are summed into i16 pairs with `vpmaddubsw`
//! (at most 2 * 63 * 127, no saturation) and then, weighted by the group's
//! scale, into i32 with one `vpdpwssd`, so a super-block's integer sum
//! `sum_g sc[g] * sum(q * a)` is exact before it is scaled by `d_w * d_a`
//! in f32, as in the portable code. Q4_K's min terms
//! `d_a * dmin * sum_g m[g] * bsum[g]` are exact integer sums per block,
//! scaled and accumulated separately; Q6_K's code offset 32 enters the
//! integer sum as `-32 * sum_g sc[g] * bsum[g]` in lane 0. Lane for lane,
//! the sums and their f32 scaling are those of the row kernels, so the
//! results are bit-identical to them.

use crate::blocks::{BlockQ4K, BlockQ6K, BlockQ8K};
use crate::simd::{prefetch_distance, prefetch_lines, Tile, TileKernels};
use core::arch::x86_64::*;

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// `acc + sum over i16 pairs of scale * maddubs(codes, acts)`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn scaled_dot(acc: __m256i, codes: __m256i, acts: *const i8, scale: __m256i) -> __m256i {
    let p = _mm256_maddubs_epi16(codes, _mm256_loadu_si256(acts as *const __m256i));
    _mm256_dpwssd_epi32(acc, p, scale)
}

/// Eight 6-bit scales and eight 6-bit mins of the 12-byte k-quant packing,
/// as bytes (scales in the low, mins in the high 8 bytes).
#[inline(always)]
fn unpack_scales(p: &[u8; 12]) -> u128 {
    let w = |i: usize| u32::from_le_bytes([p[4 * i], p[4 * i + 1], p[4 * i + 2], p[4 * i + 3]]);
    let (w0, w1, w2) = (w(0), w(1), w(2));
    let sc_lo = w0 & 0x3f3f_3f3f;
    let m_lo = w1 & 0x3f3f_3f3f;
    let sc_hi = (w2 & 0x0f0f_0f0f) | ((w0 >> 2) & 0x3030_3030);
    let m_hi = ((w2 >> 4) & 0x0f0f_0f0f) | ((w1 >> 2) & 0x3030_3030);
    sc_lo as u128 | (sc_hi as u128) << 32 | (m_lo as u128) << 64 | (m_hi as u128) << 96
}

/// Per-row pointers and gather offsets of a tile; missing rows alias the
/// last real one.
struct Rows {
    w: [*const u8; 4],
    gather: __m128i,
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn rows(t: &Tile) -> Rows {
    let rows = t.rows.clamp(1, 4);
    let off: [usize; 4] = core::array::from_fn(|r| r.min(rows - 1) * t.row_bytes);
    Rows {
        w: core::array::from_fn(|r| t.w.add(off[r])),
        gather: _mm_setr_epi32(off[0] as i32, off[1] as i32, off[2] as i32, off[3] as i32),
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn q4_k_tile<const T: usize>(t: &Tile) {
    const BB: usize = size_of::<BlockQ4K>();
    let toks = t.toks.clamp(1, T);
    let rw = rows(t);
    let a: [*const BlockQ8K; T] =
        core::array::from_fn(|k| t.a.add(k.min(toks - 1) * t.act_row_bytes) as *const BlockQ8K);
    let m4 = _mm256_set1_epi8(0x0f);
    let d_lane: [__m256i; 4] = core::array::from_fn(|r| _mm256_set1_epi32(2 * r as i32));
    let dmin_lanes = _mm256_setr_epi32(1, 3, 5, 7, 1, 3, 5, 7);
    let mut acc = [[_mm256_setzero_ps(); T]; 4];
    let mut mins = [_mm_setzero_ps(); T];
    let ahead = t.w.wrapping_add(prefetch_distance(t));
    for b in 0..t.apr {
        prefetch_lines(ahead.wrapping_add(4 * BB * b), (4 * BB).div_ceil(64));
        // Lane 2r: row r's d, lane 2r + 1: its dmin.
        let dm = _mm256_cvtph_ps(_mm_i32gather_epi32::<1>(
            t.w.add(b * BB) as *const i32,
            rw.gather,
        ));
        let ab: [&BlockQ8K; T] = core::array::from_fn(|k| &*a[k].add(b));
        let da: [__m256; T] = core::array::from_fn(|k| _mm256_mul_ps(dm, _mm256_set1_ps(ab[k].d)));
        // Sums of the 32-value groups' activations, 8 x i16.
        let gsum: [__m128i; T] = core::array::from_fn(|k| {
            let p = ab[k].bsums.as_ptr() as *const __m128i;
            _mm_hadd_epi16(_mm_loadu_si128(p), _mm_loadu_si128(p.add(1)))
        });
        let mut msum = [[_mm_setzero_si128(); 4]; T];
        for r in 0..4 {
            let blk = &*(rw.w[r].add(b * BB) as *const BlockQ4K);
            let sm = unpack_scales(&blk.scales);
            let sm = _mm_loadu_si128(&sm as *const u128 as *const __m128i);
            let sc16 = _mm256_cvtepu8_epi16(sm);
            let m16 = _mm_cvtepu8_epi16(_mm_unpackhi_epi64(sm, sm));
            for k in 0..T {
                msum[k][r] = _mm_madd_epi16(m16, gsum[k]);
            }
            let mut isum = [_mm256_setzero_si256(); T];
            for j in 0..4 {
                let q = _mm256_loadu_si256(blk.qs.as_ptr().add(32 * j) as *const __m256i);
                let lo = _mm256_and_si256(q, m4);
                let hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
                let s_lo = _mm256_permutexvar_epi16(_mm256_set1_epi16(2 * j as i16), sc16);
                let s_hi = _mm256_permutexvar_epi16(_mm256_set1_epi16(2 * j as i16 + 1), sc16);
                for k in 0..T {
                    let aq = ab[k].qs.as_ptr().add(64 * j);
                    isum[k] = scaled_dot(isum[k], lo, aq, s_lo);
                    isum[k] = scaled_dot(isum[k], hi, aq.add(32), s_hi);
                }
            }
            for k in 0..T {
                let d = _mm256_permutevar8x32_ps(da[k], d_lane[r]);
                acc[r][k] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(isum[k]), acc[r][k]);
            }
        }
        for k in 0..T {
            let s = msum[k];
            let per_row = _mm_hadd_epi32(_mm_hadd_epi32(s[0], s[1]), _mm_hadd_epi32(s[2], s[3]));
            let dmin = _mm256_castps256_ps128(_mm256_permutevar8x32_ps(da[k], dmin_lanes));
            // Product, then sum, rounded apart: the row kernel's
            // `mins += d_a * dmin * summ`.
            mins[k] = _mm_add_ps(mins[k], _mm_mul_ps(dmin, _mm_cvtepi32_ps(per_row)));
        }
    }
    store(t, toks, &acc, Some(&mins));
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn q6_k_tile<const T: usize>(t: &Tile) {
    const BB: usize = size_of::<BlockQ6K>();
    // The gather reads the dword ending with d: scales 14..16, then d.
    const D_DWORD: usize = BB - 4;
    let toks = t.toks.clamp(1, T);
    let rw = rows(t);
    let a: [*const BlockQ8K; T] =
        core::array::from_fn(|k| t.a.add(k.min(toks - 1) * t.act_row_bytes) as *const BlockQ8K);
    let m4 = _mm256_set1_epi8(0x0f);
    let m2 = _mm256_set1_epi8(0x03);
    let d_lane: [__m256i; 4] = core::array::from_fn(|r| _mm256_set1_epi32(2 * r as i32 + 1));
    // Chunk c (32 values) covers groups 2c and 2c + 1: one scale per 128-bit half.
    let pair_idx: [__m256i; 8] = core::array::from_fn(|c| {
        _mm256_setr_m128i(
            _mm_set1_epi16(2 * c as i16),
            _mm_set1_epi16(2 * c as i16 + 1),
        )
    });
    let mut acc = [[_mm256_setzero_ps(); T]; 4];
    let ahead = t.w.wrapping_add(prefetch_distance(t));
    for b in 0..t.apr {
        prefetch_lines(ahead.wrapping_add(4 * BB * b), (4 * BB).div_ceil(64));
        // Lane 2r + 1: row r's d.
        let dm = _mm256_cvtph_ps(_mm_i32gather_epi32::<1>(
            t.w.add(b * BB + D_DWORD) as *const i32,
            rw.gather,
        ));
        let ab: [&BlockQ8K; T] = core::array::from_fn(|k| &*a[k].add(b));
        for r in 0..4 {
            let blk = &*(rw.w[r].add(b * BB) as *const BlockQ6K);
            let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(blk.scales.as_ptr() as *const __m128i));
            // sum (q - 32) a = sum q a - 32 sum a; the group sums of a are the
            // bsums. The whole offset goes into lane 0, as in the row kernel,
            // so the lanes (scaled and summed in f32) match it bit for bit.
            let mut isum: [__m256i; T] = core::array::from_fn(|k| {
                let bsums = _mm256_loadu_si256(ab[k].bsums.as_ptr() as *const __m256i);
                let o = _mm256_madd_epi16(sc16, bsums);
                let o = _mm_add_epi32(_mm256_castsi256_si128(o), _mm256_extracti128_si256(o, 1));
                let o = _mm_add_epi32(o, _mm_shuffle_epi32(o, 0b01_00_11_10));
                let o = _mm_add_epi32(o, _mm_shuffle_epi32(o, 0b10_11_00_01));
                _mm256_zextsi128_si256(_mm_cvtsi32_si128(-32 * _mm_cvtsi128_si32(o)))
            });
            for n in 0..2 {
                let ql0 = _mm256_loadu_si256(blk.ql.as_ptr().add(64 * n) as *const __m256i);
                let ql1 = _mm256_loadu_si256(blk.ql.as_ptr().add(64 * n + 32) as *const __m256i);
                let qh = _mm256_loadu_si256(blk.qh.as_ptr().add(32 * n) as *const __m256i);
                let codes = [
                    _mm256_or_si256(
                        _mm256_and_si256(ql0, m4),
                        _mm256_slli_epi16(_mm256_and_si256(qh, m2), 4),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(ql1, m4),
                        _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m2), 4),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                        _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m2), 4),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                        _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m2), 4),
                    ),
                ];
                for (c4, q) in codes.into_iter().enumerate() {
                    let c = 4 * n + c4;
                    let s = _mm256_permutexvar_epi16(pair_idx[c], sc16);
                    for k in 0..T {
                        isum[k] = scaled_dot(isum[k], q, ab[k].qs.as_ptr().add(32 * c), s);
                    }
                }
            }
            for k in 0..T {
                let d = _mm256_mul_ps(
                    _mm256_permutevar8x32_ps(dm, d_lane[r]),
                    _mm256_set1_ps(ab[k].d),
                );
                acc[r][k] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(isum[k]), acc[r][k]);
            }
        }
    }
    store(t, toks, &acc, None);
}

/// Writes the tile's real rows and tokens: the lane sums, less the min terms.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn store<const T: usize>(
    t: &Tile,
    toks: usize,
    acc: &[[__m256; T]; 4],
    mins: Option<&[__m128; T]>,
) {
    let rows = t.rows.clamp(1, 4);
    for k in 0..toks {
        let mut m = [0f32; 4];
        if let Some(mins) = mins {
            _mm_storeu_ps(m.as_mut_ptr(), mins[k]);
        }
        for r in 0..rows {
            *t.y.add(k * t.y_stride + r) = hsum(acc[r][k]) - m[r];
        }
    }
}

/// Q4_K tiles. # Safety: the CPU must have AVX-512 F/BW/VL/VNNI, FMA, F16C.
pub unsafe fn q4_k() -> TileKernels {
    TileKernels {
        one: q4_k_tile::<1>,
        two: q4_k_tile::<2>,
        four: q4_k_tile::<4>,
        many: q4_k_tile::<4>,
        max_tok: 4,
    }
}

/// Q6_K tiles. # Safety: as for [`q4_k`].
pub unsafe fn q6_k() -> TileKernels {
    TileKernels {
        one: q6_k_tile::<1>,
        two: q6_k_tile::<2>,
        four: q6_k_tile::<4>,
        many: q6_k_tile::<4>,
        max_tok: 4,
    }
}
