//! Multi-row, multi-token kernels for the 32-value block formats (Q4_0,
//! Q4_1, Q5_0, Q5_1, Q8_0), written once and instantiated per instruction
//! set by [`define_tiles!`].
//!
//! One call computes a tile of up to 4 rows x `T` tokens: each weight block
//! is decoded once and fed to every token, each activation block is loaded
//! once and fed to every row. The weights' f16 scales of the 4 rows are
//! fetched with one gather and converted together, and the activation
//! scales come pre-converted ([`super::ActScale`]), so the loop has no
//! scalar f16 conversions and no loop-carried chain besides the
//! accumulators.
//!
//! Numerics are those of the row kernels, bit for bit: for every block the
//! exact integer lane sums (the codes' offset enters each lane as `-K` times
//! its own activations), scaled by `d_w * d_a` with one fused multiply-add
//! per block; min terms `m_w * s_a` are accumulated separately. The
//! offset terms (`-K` times each lane's activations, for codes stored as
//! `q + K`) come precomputed per activation block ([`super::LaneOffsets`]).

/// The layout of one 32-value weight format, as a const generic selector.
pub(crate) mod fmt {
    pub const Q4_0: u8 = 0;
    pub const Q4_1: u8 = 1;
    pub const Q5_0: u8 = 2;
    pub const Q5_1: u8 = 3;
    pub const Q8_0: u8 = 4;
    /// Q4_0 bytes, rounded as ggml's repacked 8-row kernels: each block's
    /// integer sum is reduced to one number per row before it is scaled.
    pub const Q4_0_X8: u8 = 5;

    /// Whether the block's lane sums are reduced to one exact sum per row
    /// and scaled with one scalar fused multiply-add per block.
    pub const fn sums_per_block(f: u8) -> bool {
        f == Q4_0_X8
    }

    /// Bytes per block.
    pub const fn bytes(f: u8) -> usize {
        match f {
            Q4_0 | Q4_0_X8 => 18,
            Q4_1 => 20,
            Q5_0 => 22,
            Q5_1 => 24,
            _ => 34,
        }
    }

    /// Whether the block carries a min (`value = d * q + m`), dotted with
    /// Q8_1 activations; the others are `d * (q - K)` with Q8_0 activations.
    pub const fn has_min(f: u8) -> bool {
        matches!(f, Q4_1 | Q5_1)
    }

    /// Offset of the 32 signed codes inside an activation block (Q8_1
    /// carries `s` after `d`).
    pub const fn act_qs(f: u8) -> usize {
        if has_min(f) {
            4
        } else {
            2
        }
    }
}

macro_rules! define_tiles {
    ($features:literal, $dot_u8_i8:path, $max_tok:literal) => {
        use crate::simd::tiles::fmt;
        use crate::simd::{ActScale, LaneOffsets, Tile};
        use core::arch::x86_64::*;

        /// `acc` plus the sums of 4 adjacent byte products (x unsigned, y signed).
        #[target_feature(enable = $features)]
        #[inline]
        unsafe fn dot_acc(acc: __m256i, x: __m256i, y: __m256i) -> __m256i {
            $dot_u8_i8(acc, x, y)
        }

        #[target_feature(enable = $features)]
        #[inline]
        unsafe fn hsum(v: __m256) -> f32 {
            let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_movehdup_ps(s));
            _mm_cvtss_f32(s)
        }

        /// 16 bytes of nibble pairs at `p` -> 32 codes: low nibbles, then high.
        #[target_feature(enable = $features)]
        #[inline]
        unsafe fn nibbles(p: *const u8) -> __m256i {
            let x = _mm256_broadcastsi128_si256(_mm_loadu_si128(p as *const __m128i));
            let x = _mm256_srlv_epi64(x, _mm256_setr_epi64x(0, 0, 4, 4));
            _mm256_and_si256(x, _mm256_set1_epi8(0x0f))
        }

        /// Byte i = 0x10 if bit i of the little-endian word at `p` is set.
        #[target_feature(enable = $features)]
        #[inline]
        unsafe fn fifth_bits(p: *const u8) -> __m256i {
            let v = _mm256_set1_epi32((p as *const i32).read_unaligned());
            let shuf = _mm256_set_epi64x(
                0x0303030303030303,
                0x0202020202020202,
                0x0101010101010101,
                0x0000000000000000,
            );
            let bytes = _mm256_shuffle_epi8(v, shuf);
            let select = _mm256_set1_epi64x(0x8040201008040201u64 as i64);
            let set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, select), select);
            _mm256_and_si256(set, _mm256_set1_epi8(0x10))
        }

        /// The 32 unsigned codes of the block at `p`.
        #[target_feature(enable = $features)]
        #[inline]
        pub(crate) unsafe fn codes<const F: u8>(p: *const u8) -> __m256i {
            match F {
                fmt::Q4_0 | fmt::Q4_0_X8 => nibbles(p.add(2)),
                fmt::Q4_1 => nibbles(p.add(4)),
                fmt::Q5_0 => _mm256_or_si256(nibbles(p.add(6)), fifth_bits(p.add(2))),
                fmt::Q5_1 => _mm256_or_si256(nibbles(p.add(8)), fifth_bits(p.add(4))),
                // Signed codes as unsigned ones: q + 128.
                _ => _mm256_xor_si256(
                    _mm256_loadu_si256(p.add(2) as *const __m256i),
                    _mm256_set1_epi8(-128),
                ),
            }
        }

        /// One tile: `t.rows` (1..=4) rows x `t.toks` (1..=T) tokens. Missing
        /// rows and tokens alias the last real one and are not stored.
        #[target_feature(enable = $features)]
        unsafe fn tile<const F: u8, const T: usize>(t: &Tile) {
            let bb = fmt::bytes(F);
            let rows = t.rows.clamp(1, 4);
            let toks = t.toks.clamp(1, T);
            let row_off: [usize; 4] = core::array::from_fn(|r| r.min(rows - 1) * t.row_bytes);
            let w: [*const u8; 4] = core::array::from_fn(|r| t.w.add(row_off[r]));
            let a: [*const u8; T] =
                core::array::from_fn(|k| t.a.add(k.min(toks - 1) * t.act_row_bytes));
            let sc: [*const ActScale; T] =
                core::array::from_fn(|k| t.scales.add(k.min(toks - 1) * t.apr));
            let offsets: [*const LaneOffsets; T] =
                core::array::from_fn(|k| t.offsets.wrapping_add(k.min(toks - 1) * t.apr));
            let gather_idx = _mm_setr_epi32(
                row_off[0] as i32,
                row_off[1] as i32,
                row_off[2] as i32,
                row_off[3] as i32,
            );
            // Lane 2r of the converted gather holds row r's d, lane 2r + 1 its m
            // (or, without a min, the first code bytes: never used).
            let d_lane: [__m256i; 4] = core::array::from_fn(|r| _mm256_set1_epi32(2 * r as i32));
            let mut acc = [[_mm256_setzero_ps(); T]; 4];
            let mut mins = [_mm256_setzero_ps(); T];
            // Per token, the 4 rows' sums of `fmt::sums_per_block` formats.
            let mut acc_rows = [_mm_setzero_ps(); T];
            let even_lanes = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
            // The tile reads 4 * bb bytes per block; prefetch as much further on.
            let ahead = t.w.wrapping_add(crate::simd::prefetch_distance(t));
            for b in 0..t.apr {
                crate::simd::prefetch_lines(ahead.wrapping_add(4 * bb * b), (4 * bb).div_ceil(64));
                let wb = t.w.add(b * bb);
                let dm = _mm256_cvtph_ps(_mm_i32gather_epi32::<1>(wb as *const i32, gather_idx));
                let q: [__m256i; 4] = core::array::from_fn(|r| codes::<F>(w[r].add(b * bb)));
                for k in 0..T {
                    let s = &*sc[k].add(b);
                    let ab = a[k].add(b * (fmt::act_qs(F) + 32));
                    let av = _mm256_loadu_si256(ab.add(fmt::act_qs(F)) as *const __m256i);
                    // Without a min the codes are stored as q + K; each lane
                    // starts at -K times its own 4 activations, so that lane
                    // sums are those of the signed products (q - K) * a, as in
                    // ggml's kernels: the lanes are scaled and summed in f32,
                    // and a different split between lanes rounds differently.
                    let init = if fmt::has_min(F) {
                        _mm256_setzero_si256()
                    } else {
                        _mm256_load_si256(offsets[k].add(b) as *const __m256i)
                    };
                    let scale = if fmt::has_min(F) {
                        // (d_a, s_a) pairs: lanes 2r = d_w d_a, 2r + 1 = m_w s_a.
                        let pair = _mm256_castsi256_ps(_mm256_set1_epi64x(
                            (s as *const ActScale as *const i64).read_unaligned(),
                        ));
                        let p = _mm256_mul_ps(dm, pair);
                        mins[k] = _mm256_add_ps(mins[k], p);
                        p
                    } else {
                        _mm256_mul_ps(dm, _mm256_set1_ps(s.d))
                    };
                    if fmt::sums_per_block(F) {
                        let s: [__m256i; 4] = core::array::from_fn(|r| dot_acc(init, q[r], av));
                        // Integer adds are exact in any order: lane r of
                        // `sums` is row r's whole block sum.
                        let h = _mm256_hadd_epi32(
                            _mm256_hadd_epi32(s[0], s[1]),
                            _mm256_hadd_epi32(s[2], s[3]),
                        );
                        let sums = _mm_add_epi32(
                            _mm256_castsi256_si128(h),
                            _mm256_extracti128_si256::<1>(h),
                        );
                        let d = _mm256_castps256_ps128(_mm256_permutevar8x32_ps(scale, even_lanes));
                        acc_rows[k] = _mm_fmadd_ps(_mm_cvtepi32_ps(sums), d, acc_rows[k]);
                        continue;
                    }
                    for r in 0..4 {
                        let sumi = dot_acc(init, q[r], av);
                        let d = _mm256_permutevar8x32_ps(scale, d_lane[r]);
                        acc[r][k] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc[r][k]);
                    }
                }
            }
            let mut min_lanes = [[0f32; 8]; T];
            if fmt::has_min(F) {
                for k in 0..T {
                    _mm256_storeu_ps(min_lanes[k].as_mut_ptr(), mins[k]);
                }
            }
            if fmt::sums_per_block(F) {
                for k in 0..toks {
                    let mut v = [0f32; 4];
                    _mm_storeu_ps(v.as_mut_ptr(), acc_rows[k]);
                    for r in 0..rows {
                        *t.y.add(k * t.y_stride + r) = v[r];
                    }
                }
                return;
            }
            for k in 0..toks {
                for r in 0..rows {
                    let v = hsum(acc[r][k]) + min_lanes[k][2 * r + 1];
                    *t.y.add(k * t.y_stride + r) = v;
                }
            }
        }

        /// The tile kernels of format `F`: one token, two, four (at most
        /// `MAX_TOK`), and up to `MAX_TOK`.
        ///
        /// # Safety
        /// The CPU must have the features of this level.
        pub unsafe fn tiles<const F: u8>() -> crate::simd::TileKernels {
            crate::simd::TileKernels {
                one: tile::<F, 1>,
                two: tile::<F, 2>,
                four: tile::<
                    F,
                    {
                        if $max_tok < 4 {
                            $max_tok
                        } else {
                            4
                        }
                    },
                >,
                many: tile::<F, $max_tok>,
                max_tok: $max_tok,
            }
        }
    };
}
pub(crate) use define_tiles;
