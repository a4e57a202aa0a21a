//! The AVX-512 tiles (4 rows x `T` tokens) of the 32-value formats in
//! 512-bit vectors: each instruction covers one block of two rows (one row
//! per 256-bit half), halving the dot, convert and multiply-add count of
//! the 256-bit tile in `tiles`.
//!
//! Every lane does exactly what the same lane of the 256-bit tile does
//! (same integer sums, same scale, one fused multiply-add per block in
//! block order, same final lane sum), so results are bit-identical to it:
//! the engine's match with llama.cpp's logits depends on that order, and a
//! token's result does not depend on the batch it came in.

use super::avx512::tiles::codes;
use super::tiles::fmt;
use super::{prefetch_distance, prefetch_lines, ActScale, LaneOffsets, Tile};
use core::arch::x86_64::*;

/// The lane sum of the 256-bit tile, on one half of a 512-bit accumulator.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
#[inline]
unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// The codes of two rows' blocks (`p0` in the low half, `p1` in the high),
/// each half what `codes` gives for its row. The 4- and 5-bit formats
/// spread both rows' nibbles in one 512-bit shift, and set the fifth bits
/// with one masked add whose mask is the two rows' `qh` words.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[inline]
unsafe fn pair_codes<const F: u8>(p0: *const u8, p1: *const u8) -> __m512i {
    let nib_off = match F {
        fmt::Q4_0 => 2,
        fmt::Q4_1 => 4,
        fmt::Q5_0 => 6,
        fmt::Q5_1 => 8,
        _ => {
            return _mm512_inserti64x4::<1>(_mm512_castsi256_si512(codes::<F>(p0)), codes::<F>(p1))
        }
    };
    let both = _mm256_inserti128_si256::<1>(
        _mm256_castsi128_si256(_mm_loadu_si128(p0.add(nib_off) as *const __m128i)),
        _mm_loadu_si128(p1.add(nib_off) as *const __m128i),
    );
    // 128-bit lanes: row 0, row 0, row 1, row 1; the odd ones take the high nibbles.
    let x = _mm512_shuffle_i64x2::<0b01_01_00_00>(
        _mm512_castsi256_si512(both),
        _mm512_castsi256_si512(both),
    );
    let x = _mm512_srlv_epi64(x, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4));
    let nibbles = _mm512_and_si512(x, _mm512_set1_epi8(0x0f));
    let qh_off = match F {
        fmt::Q5_0 => 2,
        fmt::Q5_1 => 4,
        _ => return nibbles,
    };
    let qh = |p: *const u8| (p.add(qh_off) as *const u32).read_unaligned() as u64;
    let fifth = _cvtu64_mask64(qh(p0) | qh(p1) << 32);
    _mm512_mask_add_epi8(nibbles, fifth, nibbles, _mm512_set1_epi8(0x10))
}

/// One tile: `t.rows` (1..=4) rows x `t.toks` (1..=T) tokens, rows taken in
/// pairs. Missing rows and tokens alias the last real one and are not stored.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn tile<const F: u8, const T: usize>(t: &Tile) {
    let bb = fmt::bytes(F);
    let act_bytes = fmt::act_qs(F) + 32;
    let rows = t.rows.clamp(1, 4);
    let toks = t.toks.clamp(1, T);
    let row_off: [usize; 4] = core::array::from_fn(|r| r.min(rows - 1) * t.row_bytes);
    let w: [*const u8; 4] = core::array::from_fn(|r| t.w.add(row_off[r]));
    let a: [*const u8; T] = core::array::from_fn(|k| t.a.add(k.min(toks - 1) * t.act_row_bytes));
    let sc: [*const ActScale; T] = core::array::from_fn(|k| t.scales.add(k.min(toks - 1) * t.apr));
    let offsets: [*const LaneOffsets; T] =
        core::array::from_fn(|k| t.offsets.wrapping_add(k.min(toks - 1) * t.apr));
    let gather_idx = _mm_setr_epi32(
        row_off[0] as i32,
        row_off[1] as i32,
        row_off[2] as i32,
        row_off[3] as i32,
    );
    // Lane 2r of the converted gather holds row r's d, lane 2r + 1 its m;
    // pair p spreads rows 2p and 2p + 1 over its two halves.
    let d_lane: [__m512i; 2] = core::array::from_fn(|p| {
        let (lo, hi) = (4 * p as i32, 4 * p as i32 + 2);
        _mm512_setr_epi32(
            lo, lo, lo, lo, lo, lo, lo, lo, hi, hi, hi, hi, hi, hi, hi, hi,
        )
    });
    let mut acc = [[_mm512_setzero_ps(); T]; 2];
    let mut mins = [_mm256_setzero_ps(); T];
    let ahead = t.w.wrapping_add(prefetch_distance(t));
    for b in 0..t.apr {
        prefetch_lines(ahead.wrapping_add(4 * bb * b), (4 * bb).div_ceil(64));
        let wb = t.w.add(b * bb);
        let dm = _mm256_cvtph_ps(_mm_i32gather_epi32::<1>(wb as *const i32, gather_idx));
        let dw: [__m512; 2] =
            core::array::from_fn(|p| _mm512_permutexvar_ps(d_lane[p], _mm512_castps256_ps512(dm)));
        let q: [__m512i; 2] = core::array::from_fn(|p| {
            pair_codes::<F>(w[2 * p].add(b * bb), w[2 * p + 1].add(b * bb))
        });
        for k in 0..T {
            let s = &*sc[k].add(b);
            let ab = a[k].add(b * act_bytes + fmt::act_qs(F));
            let av = _mm512_broadcast_i64x4(_mm256_loadu_si256(ab as *const __m256i));
            // As in the 256-bit tile: without a min the codes are q + K and
            // each lane starts at -K times its own 4 activations.
            let init = if fmt::has_min(F) {
                _mm512_setzero_si512()
            } else {
                _mm512_broadcast_i64x4(_mm256_load_si256(offsets[k].add(b) as *const __m256i))
            };
            let scale = if fmt::has_min(F) {
                let pair = _mm256_castsi256_ps(_mm256_set1_epi64x(
                    (s as *const ActScale as *const i64).read_unaligned(),
                ));
                let p = _mm256_mul_ps(dm, pair);
                mins[k] = _mm256_add_ps(mins[k], p);
                p
            } else {
                dm
            };
            for p in 0..2 {
                let sumi = _mm512_dpbusd_epi32(init, q[p], av);
                // Without a min, d_w d_a is the same product whether the
                // row's lane is picked before or after the multiply; picking
                // it once per block saves two permutes per token.
                let d = if fmt::has_min(F) {
                    _mm512_permutexvar_ps(d_lane[p], _mm512_castps256_ps512(scale))
                } else {
                    _mm512_mul_ps(dw[p], _mm512_set1_ps(s.d))
                };
                acc[p][k] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sumi), acc[p][k]);
            }
        }
    }
    let mut min_lanes = [[0f32; 8]; T];
    if fmt::has_min(F) {
        for k in 0..T {
            _mm256_storeu_ps(min_lanes[k].as_mut_ptr(), mins[k]);
        }
    }
    for k in 0..toks {
        for r in 0..rows {
            let pair = acc[r / 2][k];
            let half = if r % 2 == 0 {
                _mm512_castps512_ps256(pair)
            } else {
                _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(pair)))
            };
            *t.y.add(k * t.y_stride + r) = hsum(half) + min_lanes[k][2 * r + 1];
        }
    }
}
