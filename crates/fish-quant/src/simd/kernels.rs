//! The x86 dot-product kernels, written once and instantiated per
//! instruction set by [`define_kernels!`]: the only difference between the
//! AVX2 and the AVX-512 VNNI builds is how 32 unsigned-by-signed byte
//! products are summed into eight i32 lanes.
//!
//! Every kernel forms the same per-block (or per-group) integer sums as the
//! portable code in `blocks` and scales them per block in f32.

macro_rules! define_kernels {
    ($features:literal, $dot_u8_i8:path) => {
        use crate::blocks::*;
        use core::arch::x86_64::*;
        use half::f16;

        /// Sums of 4 adjacent byte products `x[i] * y[i]` (x unsigned, y signed).
        #[target_feature(enable = $features)]
        #[inline]
        unsafe fn dot_u8_i8(x: __m256i, y: __m256i) -> __m256i {
            $dot_u8_i8(x, y)
        }

        /// Same for two signed operands (neither may be -128 where the other is negative).
        #[target_feature(enable = $features)]
        #[inline]
        unsafe fn dot_i8_i8(x: __m256i, y: __m256i) -> __m256i {
            dot_u8_i8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x))
        }

        #[target_feature(enable = $features)]
        #[inline]
        unsafe fn hsum_ps(v: __m256) -> f32 {
            let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_movehdup_ps(s));
            _mm_cvtss_f32(s)
        }

        #[target_feature(enable = $features)]
        #[inline]
        unsafe fn load(p: *const u8) -> __m256i {
            _mm256_loadu_si256(p as *const __m256i)
        }

        /// 16 bytes of nibble pairs -> 32 bytes: low nibbles then high nibbles.
        #[target_feature(enable = $features)]
        #[inline]
        unsafe fn nibbles(p: *const u8) -> __m256i {
            let x = _mm_loadu_si128(p as *const __m128i);
            let m = _mm_set1_epi8(0x0f);
            let lo = _mm_and_si128(x, m);
            let hi = _mm_and_si128(_mm_srli_epi16(x, 4), m);
            _mm256_set_m128i(hi, lo)
        }

        /// Byte i = 0x10 if bit i of `bits` is set, else 0.
        #[target_feature(enable = $features)]
        #[inline]
        unsafe fn fifth_bits(bits: u32) -> __m256i {
            let v = _mm256_set1_epi32(bits as i32);
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

        #[target_feature(enable = $features)]
        #[inline]
        unsafe fn h2f(bits: [u8; 2]) -> f32 {
            _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(
                u16::from_le_bytes(bits) as i32
            )))
        }

        #[target_feature(enable = $features)]
        pub unsafe fn q8_0(w: &[BlockQ8_0], a: &[BlockQ8_0]) -> f32 {
            let mut acc = _mm256_setzero_ps();
            for (w, a) in w.iter().zip(a) {
                let d = _mm256_set1_ps(h2f(w.d.0) * h2f(a.d.0));
                let p = dot_i8_i8(
                    load(w.qs.as_ptr() as *const u8),
                    load(a.qs.as_ptr() as *const u8),
                );
                acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc);
            }
            hsum_ps(acc)
        }

        #[target_feature(enable = $features)]
        pub unsafe fn q4_0(w: &[BlockQ4_0], a: &[BlockQ8_0]) -> f32 {
            let mut acc = _mm256_setzero_ps();
            let eight = _mm256_set1_epi8(8);
            for (w, a) in w.iter().zip(a) {
                let d = _mm256_set1_ps(h2f(w.d.0) * h2f(a.d.0));
                let q = _mm256_sub_epi8(nibbles(w.qs.as_ptr()), eight);
                let p = dot_i8_i8(q, load(a.qs.as_ptr() as *const u8));
                acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc);
            }
            hsum_ps(acc)
        }

        #[target_feature(enable = $features)]
        pub unsafe fn q4_1(w: &[BlockQ4_1], a: &[BlockQ8_1]) -> f32 {
            let mut acc = _mm256_setzero_ps();
            let mut offsets = 0.0f32;
            for (w, a) in w.iter().zip(a) {
                let d = _mm256_set1_ps(h2f(w.d.0) * h2f(a.d.0));
                offsets += h2f(w.m.0) * h2f(a.s.0);
                let p = dot_u8_i8(nibbles(w.qs.as_ptr()), load(a.qs.as_ptr() as *const u8));
                acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc);
            }
            hsum_ps(acc) + offsets
        }

        #[target_feature(enable = $features)]
        pub unsafe fn q5_0(w: &[BlockQ5_0], a: &[BlockQ8_0]) -> f32 {
            let mut acc = _mm256_setzero_ps();
            let sixteen = _mm256_set1_epi8(16);
            for (w, a) in w.iter().zip(a) {
                let d = _mm256_set1_ps(h2f(w.d.0) * h2f(a.d.0));
                let q =
                    _mm256_or_si256(nibbles(w.qs.as_ptr()), fifth_bits(u32::from_le_bytes(w.qh)));
                let p = dot_i8_i8(
                    _mm256_sub_epi8(q, sixteen),
                    load(a.qs.as_ptr() as *const u8),
                );
                acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc);
            }
            hsum_ps(acc)
        }

        #[target_feature(enable = $features)]
        pub unsafe fn q5_1(w: &[BlockQ5_1], a: &[BlockQ8_1]) -> f32 {
            let mut acc = _mm256_setzero_ps();
            let mut offsets = 0.0f32;
            for (w, a) in w.iter().zip(a) {
                let d = _mm256_set1_ps(h2f(w.d.0) * h2f(a.d.0));
                offsets += h2f(w.m.0) * h2f(a.s.0);
                let q =
                    _mm256_or_si256(nibbles(w.qs.as_ptr()), fifth_bits(u32::from_le_bytes(w.qh)));
                let p = dot_u8_i8(q, load(a.qs.as_ptr() as *const u8));
                acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc);
            }
            hsum_ps(acc) + offsets
        }

        #[target_feature(enable = $features)]
        pub unsafe fn q4_k(w: &[BlockQ4K], a: &[BlockQ8K]) -> f32 {
            let mut acc = _mm256_setzero_ps();
            let mut mins = 0.0f32;
            let m4 = _mm256_set1_epi8(0x0f);
            for (w, a) in w.iter().zip(a) {
                let (sc, m) = kscales::unpack(&w.scales);
                let summ: i32 = (0..8)
                    .map(|g| m[g] as i32 * (a.bsums[2 * g] as i32 + a.bsums[2 * g + 1] as i32))
                    .sum();
                mins += a.d * h2f(w.dmin.0) * summ as f32;
                let mut sumi = _mm256_setzero_si256();
                for j in 0..4 {
                    let q = load(w.qs.as_ptr().add(32 * j));
                    let lo = _mm256_and_si256(q, m4);
                    let hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
                    let plo = dot_u8_i8(lo, load(a.qs.as_ptr().add(64 * j) as *const u8));
                    let phi = dot_u8_i8(hi, load(a.qs.as_ptr().add(64 * j + 32) as *const u8));
                    sumi = _mm256_add_epi32(
                        sumi,
                        _mm256_mullo_epi32(plo, _mm256_set1_epi32(sc[2 * j] as i32)),
                    );
                    sumi = _mm256_add_epi32(
                        sumi,
                        _mm256_mullo_epi32(phi, _mm256_set1_epi32(sc[2 * j + 1] as i32)),
                    );
                }
                let d = _mm256_set1_ps(a.d * h2f(w.d.0));
                acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
            }
            hsum_ps(acc) - mins
        }

        /// Q4_K with a fifth bit per code: lane `k` of each 32-value group
        /// sums the products of bytes `4k..4k + 4`, times the group's scale,
        /// so the block's integer sum and its f32 scaling are those of
        /// ggml's AVX2 kernel lane for lane. The min terms are accumulated
        /// with a fused multiply-add, as that kernel is compiled (its
        /// `summs += dmin * sum` contracts to one FMA): bit-identical results.
        #[target_feature(enable = $features)]
        pub unsafe fn q5_k(w: &[BlockQ5K], a: &[BlockQ8K]) -> f32 {
            let mut acc = _mm256_setzero_ps();
            let mut mins = 0.0f32;
            let m4 = _mm256_set1_epi8(0x0f);
            let bit = _mm256_set1_epi8(0x01);
            for (w, a) in w.iter().zip(a) {
                let (sc, m) = kscales::unpack(&w.scales);
                let summ: i32 = (0..8)
                    .map(|g| m[g] as i32 * (a.bsums[2 * g] as i32 + a.bsums[2 * g + 1] as i32))
                    .sum();
                mins = (a.d * h2f(w.dmin.0)).mul_add(summ as f32, mins);
                let qh = load(w.qh.as_ptr());
                let mut sumi = _mm256_setzero_si256();
                for j in 0..4 {
                    let q = load(w.qs.as_ptr().add(32 * j));
                    // Bit 2j (2j + 1) of qh[l] moved to bit 4 of byte l.
                    let h_lo = _mm256_and_si256(
                        _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * j as i32)),
                        bit,
                    );
                    let h_hi = _mm256_and_si256(
                        _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * j as i32 + 1)),
                        bit,
                    );
                    let lo = _mm256_or_si256(_mm256_and_si256(q, m4), _mm256_slli_epi16(h_lo, 4));
                    let hi = _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16(q, 4), m4),
                        _mm256_slli_epi16(h_hi, 4),
                    );
                    let plo = dot_u8_i8(lo, load(a.qs.as_ptr().add(64 * j) as *const u8));
                    let phi = dot_u8_i8(hi, load(a.qs.as_ptr().add(64 * j + 32) as *const u8));
                    sumi = _mm256_add_epi32(
                        sumi,
                        _mm256_mullo_epi32(plo, _mm256_set1_epi32(sc[2 * j] as i32)),
                    );
                    sumi = _mm256_add_epi32(
                        sumi,
                        _mm256_mullo_epi32(phi, _mm256_set1_epi32(sc[2 * j + 1] as i32)),
                    );
                }
                let d = _mm256_set1_ps(a.d * h2f(w.d.0));
                acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
            }
            hsum_ps(acc) - mins
        }

        #[target_feature(enable = $features)]
        pub unsafe fn q6_k(w: &[BlockQ6K], a: &[BlockQ8K]) -> f32 {
            let mut acc = _mm256_setzero_ps();
            let m4 = _mm256_set1_epi8(0x0f);
            let m2 = _mm256_set1_epi8(0x03);
            for (w, a) in w.iter().zip(a) {
                // sum (q - 32) * a = sum q * a - 32 * sum a, and the group sums of a are the bsums.
                let offset: i32 = (0..16)
                    .map(|g| w.scales[g] as i32 * a.bsums[g] as i32)
                    .sum();
                let mut sumi = _mm256_setzero_si256();
                for n in 0..2 {
                    let ql0 = load(w.ql.as_ptr().add(64 * n));
                    let ql1 = load(w.ql.as_ptr().add(64 * n + 32));
                    let qh = load(w.qh.as_ptr().add(32 * n));
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
                    for (k, q) in codes.into_iter().enumerate() {
                        let g = 8 * n + 2 * k;
                        let p =
                            dot_u8_i8(q, load(a.qs.as_ptr().add(128 * n + 32 * k) as *const u8));
                        // Lanes 0..4 cover group g, lanes 4..8 group g + 1.
                        let s = _mm256_set_m128i(
                            _mm_set1_epi32(w.scales[g + 1] as i32),
                            _mm_set1_epi32(w.scales[g] as i32),
                        );
                        sumi = _mm256_add_epi32(sumi, _mm256_mullo_epi32(p, s));
                    }
                }
                let d = a.d * h2f(w.d.0);
                // 32 * offset is folded into lane 0 so the block stays one integer sum.
                let total =
                    _mm256_sub_epi32(sumi, _mm256_set_epi32(0, 0, 0, 0, 0, 0, 0, 32 * offset));
                acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(total), acc);
            }
            hsum_ps(acc)
        }

        #[target_feature(enable = $features)]
        pub unsafe fn f32_dot(w: &[F32Value], a: &[f32]) -> f32 {
            let n = w.len().min(a.len());
            let wp = w.as_ptr() as *const f32;
            let mut acc = [_mm256_setzero_ps(); 4];
            let mut i = 0;
            while i + 32 <= n {
                for k in 0..4 {
                    let x = _mm256_loadu_ps(wp.add(i + 8 * k));
                    let y = _mm256_loadu_ps(a.as_ptr().add(i + 8 * k));
                    acc[k] = _mm256_fmadd_ps(x, y, acc[k]);
                }
                i += 32;
            }
            let mut sum = hsum_ps(_mm256_add_ps(
                _mm256_add_ps(acc[0], acc[1]),
                _mm256_add_ps(acc[2], acc[3]),
            ));
            for j in i..n {
                sum += w[j].0.to_f32() * a[j];
            }
            sum
        }

        #[target_feature(enable = $features)]
        pub unsafe fn f16_dot(w: &[F16Value], a: &[f16]) -> f32 {
            let n = w.len().min(a.len());
            let wp = w.as_ptr() as *const u8;
            let ap = a.as_ptr() as *const u8;
            let mut acc = [_mm256_setzero_ps(); 4];
            let mut i = 0;
            while i + 32 <= n {
                for k in 0..4 {
                    let x =
                        _mm256_cvtph_ps(_mm_loadu_si128(wp.add(2 * (i + 8 * k)) as *const __m128i));
                    let y =
                        _mm256_cvtph_ps(_mm_loadu_si128(ap.add(2 * (i + 8 * k)) as *const __m128i));
                    acc[k] = _mm256_fmadd_ps(x, y, acc[k]);
                }
                i += 32;
            }
            let mut sum = hsum_ps(_mm256_add_ps(
                _mm256_add_ps(acc[0], acc[1]),
                _mm256_add_ps(acc[2], acc[3]),
            ));
            for j in i..n {
                sum += w[j].0.to_f32() * a[j].to_f32();
            }
            sum
        }
    };
}
pub(crate) use define_kernels;
