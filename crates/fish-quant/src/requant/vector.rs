//! Eight f32 lanes as one value, for the lane-only steps of the fit (least
//! squares, errors from code sums, selections). Written as plain loops,
//! those steps are partly left scalar by the compiler; with this type they
//! are one vector instruction per operation in the AVX2 build. Both
//! implementations run the same IEEE operations lane by lane (`min` and
//! `max` included: `if a < b { a } else { b }` is what the AVX instruction
//! computes), so the bytes stay the same.

use super::lanes::Lanes;

/// The nearest integer in `0..=max` to each lane (NaN becomes 0), as
/// [`super::lanes::round_code`] computes it.
#[inline(always)]
pub(super) fn round_levels<V: Vector>(t: V, max: f32) -> V {
    let magic = V::splat(super::lanes::ROUND_MAGIC);
    t.max(V::splat(0.0))
        .min(V::splat(max))
        .add(magic)
        .sub(magic)
}

/// Eight lanes and the operations the lane-only steps need. A mask is a
/// vector too (all bits set where true).
pub(super) trait Vector: Copy {
    fn load(a: &Lanes) -> Self;
    fn store(self) -> Lanes;
    fn splat(v: f32) -> Self;
    fn add(self, o: Self) -> Self;
    fn sub(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn div(self, o: Self) -> Self;
    /// `self * a + b` with one rounding (what `f32::mul_add` computes).
    fn mul_add(self, a: Self, b: Self) -> Self;
    /// The low byte of each lane's bits (a code biased by
    /// [`super::lanes::ROUND_MAGIC`] sits there).
    fn low_byte(self) -> [u32; 8];
    /// `if self < o { self } else { o }` per lane.
    fn min(self, o: Self) -> Self;
    /// `if self > o { self } else { o }` per lane.
    fn max(self, o: Self) -> Self;
    /// Mask of `self < o`.
    fn lt(self, o: Self) -> Self;
    /// Mask of `self > o`.
    fn gt(self, o: Self) -> Self;
    /// Both masks.
    fn and(self, o: Self) -> Self;
    /// `a` where the mask `self` is set, else `b`.
    fn select(self, a: Self, b: Self) -> Self;
    /// The 8 x 8 transpose of `m` (`out[g][i] = m[i][g]`).
    fn transpose(m: &[[u32; 8]; 8]) -> [[u32; 8]; 8];

    /// The lanes of each of four vectors summed in lane order,
    /// `((v[0] + v[1]) + v[2]) + ...`.
    #[inline(always)]
    fn sums_of_four(v: [Self; 4]) -> [f32; 4] {
        let mut out = [0f32; 4];
        for (o, v) in out.iter_mut().zip(v) {
            let lanes = v.store();
            *o = lanes[0];
            for &l in &lanes[1..] {
                *o += l;
            }
        }
        out
    }
}

/// The portable lanes.
impl Vector for Lanes {
    #[inline(always)]
    fn load(a: &Lanes) -> Self {
        *a
    }
    #[inline(always)]
    fn store(self) -> Lanes {
        self
    }
    #[inline(always)]
    fn splat(v: f32) -> Self {
        [v; 8]
    }
    #[inline(always)]
    fn add(self, o: Self) -> Self {
        lanewise(self, o, |a, b| a + b)
    }
    #[inline(always)]
    fn sub(self, o: Self) -> Self {
        lanewise(self, o, |a, b| a - b)
    }
    #[inline(always)]
    fn mul(self, o: Self) -> Self {
        lanewise(self, o, |a, b| a * b)
    }
    #[inline(always)]
    fn div(self, o: Self) -> Self {
        lanewise(self, o, |a, b| a / b)
    }
    #[inline(always)]
    fn mul_add(self, a: Self, b: Self) -> Self {
        let mut out = [0f32; 8];
        for g in 0..8 {
            out[g] = self[g].mul_add(a[g], b[g]);
        }
        out
    }
    #[inline(always)]
    fn low_byte(self) -> [u32; 8] {
        let mut out = [0u32; 8];
        for g in 0..8 {
            out[g] = self[g].to_bits() & 0xff;
        }
        out
    }
    #[inline(always)]
    fn min(self, o: Self) -> Self {
        lanewise(self, o, |a, b| if a < b { a } else { b })
    }
    #[inline(always)]
    fn max(self, o: Self) -> Self {
        lanewise(self, o, |a, b| if a > b { a } else { b })
    }
    #[inline(always)]
    fn lt(self, o: Self) -> Self {
        lanewise(self, o, |a, b| mask(a < b))
    }
    #[inline(always)]
    fn gt(self, o: Self) -> Self {
        lanewise(self, o, |a, b| mask(a > b))
    }
    #[inline(always)]
    fn and(self, o: Self) -> Self {
        lanewise(self, o, |a, b| f32::from_bits(a.to_bits() & b.to_bits()))
    }
    #[inline(always)]
    fn select(self, a: Self, b: Self) -> Self {
        let mut out = [0f32; 8];
        for g in 0..8 {
            out[g] = if self[g].to_bits() != 0 { a[g] } else { b[g] };
        }
        out
    }
    #[inline(always)]
    fn transpose(m: &[[u32; 8]; 8]) -> [[u32; 8]; 8] {
        std::array::from_fn(|g| std::array::from_fn(|i| m[i][g]))
    }
}

#[inline(always)]
fn mask(set: bool) -> f32 {
    f32::from_bits(if set { u32::MAX } else { 0 })
}

#[inline(always)]
fn lanewise(a: Lanes, b: Lanes, f: impl Fn(f32, f32) -> f32) -> Lanes {
    let mut out = [0f32; 8];
    for g in 0..8 {
        out[g] = f(a[g], b[g]);
    }
    out
}

/// AVX lanes. Only made inside functions compiled with AVX2 and FMA
/// enabled (the intrinsics are inlined there).
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
pub(super) struct Avx(std::arch::x86_64::__m256);

#[cfg(target_arch = "x86_64")]
pub(super) use avx::transpose8;

#[cfg(target_arch = "x86_64")]
mod avx {
    use super::{Avx, Lanes, Vector};
    use std::arch::x86_64::*;

    // SAFETY (every block below): an `Avx` value exists only in code that
    // runs on a CPU with AVX2 and FMA (the fits' AVX2 entry points).
    impl Vector for Avx {
        #[inline(always)]
        fn load(a: &Lanes) -> Self {
            Self(unsafe { _mm256_loadu_ps(a.as_ptr()) })
        }
        #[inline(always)]
        fn store(self) -> Lanes {
            let mut out = [0f32; 8];
            unsafe { _mm256_storeu_ps(out.as_mut_ptr(), self.0) };
            out
        }
        #[inline(always)]
        fn splat(v: f32) -> Self {
            Self(unsafe { _mm256_set1_ps(v) })
        }
        #[inline(always)]
        fn add(self, o: Self) -> Self {
            Self(unsafe { _mm256_add_ps(self.0, o.0) })
        }
        #[inline(always)]
        fn sub(self, o: Self) -> Self {
            Self(unsafe { _mm256_sub_ps(self.0, o.0) })
        }
        #[inline(always)]
        fn mul(self, o: Self) -> Self {
            Self(unsafe { _mm256_mul_ps(self.0, o.0) })
        }
        #[inline(always)]
        fn div(self, o: Self) -> Self {
            Self(unsafe { _mm256_div_ps(self.0, o.0) })
        }
        #[inline(always)]
        fn mul_add(self, a: Self, b: Self) -> Self {
            Self(unsafe { _mm256_fmadd_ps(self.0, a.0, b.0) })
        }
        #[inline(always)]
        fn low_byte(self) -> [u32; 8] {
            let mut out = [0u32; 8];
            unsafe {
                let bits = _mm256_and_si256(_mm256_castps_si256(self.0), _mm256_set1_epi32(0xff));
                _mm256_storeu_si256(out.as_mut_ptr().cast::<__m256i>(), bits);
            }
            out
        }
        #[inline(always)]
        fn min(self, o: Self) -> Self {
            Self(unsafe { _mm256_min_ps(self.0, o.0) })
        }
        #[inline(always)]
        fn max(self, o: Self) -> Self {
            Self(unsafe { _mm256_max_ps(self.0, o.0) })
        }
        #[inline(always)]
        fn lt(self, o: Self) -> Self {
            Self(unsafe { _mm256_cmp_ps::<_CMP_LT_OQ>(self.0, o.0) })
        }
        #[inline(always)]
        fn gt(self, o: Self) -> Self {
            Self(unsafe { _mm256_cmp_ps::<_CMP_GT_OQ>(self.0, o.0) })
        }
        #[inline(always)]
        fn and(self, o: Self) -> Self {
            Self(unsafe { _mm256_and_ps(self.0, o.0) })
        }
        #[inline(always)]
        fn select(self, a: Self, b: Self) -> Self {
            Self(unsafe { _mm256_blendv_ps(b.0, a.0, self.0) })
        }
        /// Lane `g` of the four vectors side by side (a 4 x 8 transpose),
        /// then the eight columns added in order, four sums at once.
        #[inline(always)]
        fn sums_of_four(v: [Self; 4]) -> [f32; 4] {
            unsafe {
                let (a, b, c, d) = (v[0].0, v[1].0, v[2].0, v[3].0);
                let (ab_low, ab_high) = (_mm256_unpacklo_ps(a, b), _mm256_unpackhi_ps(a, b));
                let (cd_low, cd_high) = (_mm256_unpacklo_ps(c, d), _mm256_unpackhi_ps(c, d));
                // col[i]: lanes i (low half) and i + 4 (high half) of a, b, c, d.
                let col = [
                    _mm256_shuffle_ps::<0x44>(ab_low, cd_low),
                    _mm256_shuffle_ps::<0xEE>(ab_low, cd_low),
                    _mm256_shuffle_ps::<0x44>(ab_high, cd_high),
                    _mm256_shuffle_ps::<0xEE>(ab_high, cd_high),
                ];
                let mut sum = _mm256_castps256_ps128(col[0]);
                for c in &col[1..] {
                    sum = _mm_add_ps(sum, _mm256_castps256_ps128(*c));
                }
                for c in &col {
                    sum = _mm_add_ps(sum, _mm256_extractf128_ps::<1>(*c));
                }
                let mut out = [0f32; 4];
                _mm_storeu_ps(out.as_mut_ptr(), sum);
                out
            }
        }

        #[inline(always)]
        fn transpose(m: &[[u32; 8]; 8]) -> [[u32; 8]; 8] {
            let mut v = [unsafe { _mm256_setzero_ps() }; 8];
            for (v, m) in v.iter_mut().zip(m) {
                *v = unsafe { _mm256_loadu_ps(m.as_ptr().cast::<f32>()) };
            }
            let t = unsafe { transpose8(v) };
            let mut out = [[0u32; 8]; 8];
            for (o, t) in out.iter_mut().zip(t) {
                unsafe { _mm256_storeu_ps(o.as_mut_ptr().cast::<f32>(), t) };
            }
            out
        }
    }

    /// `out[g]` lane `i` is `v[i]` lane `g`.
    #[inline(always)]
    pub(in crate::requant) unsafe fn transpose8(v: [__m256; 8]) -> [__m256; 8] {
        // t[2p], t[2p + 1]: rows 2p and 2p + 1 interleaved.
        let mut t = [unsafe { _mm256_setzero_ps() }; 8];
        for p in 0..4 {
            t[2 * p] = unsafe { _mm256_unpacklo_ps(v[2 * p], v[2 * p + 1]) };
            t[2 * p + 1] = unsafe { _mm256_unpackhi_ps(v[2 * p], v[2 * p + 1]) };
        }
        // u[k] for k < 4 from rows 0-3, u[k + 4] from rows 4-7: columns k
        // and k + 4 of its four rows.
        let mut u = t;
        for half in 0..2 {
            let b = 4 * half;
            u[b] = unsafe { _mm256_shuffle_ps::<0x44>(t[b], t[b + 2]) };
            u[b + 1] = unsafe { _mm256_shuffle_ps::<0xEE>(t[b], t[b + 2]) };
            u[b + 2] = unsafe { _mm256_shuffle_ps::<0x44>(t[b + 1], t[b + 3]) };
            u[b + 3] = unsafe { _mm256_shuffle_ps::<0xEE>(t[b + 1], t[b + 3]) };
        }
        let mut out = u;
        for k in 0..4 {
            out[k] = unsafe { _mm256_permute2f128_ps::<0x20>(u[k], u[k + 4]) };
            out[k + 4] = unsafe { _mm256_permute2f128_ps::<0x31>(u[k], u[k + 4]) };
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lanes whose sum depends on the order of the additions.
    fn lanes(seed: u32) -> [Lanes; 4] {
        let mut s = seed;
        std::array::from_fn(|_| {
            std::array::from_fn(|g| {
                s = s.wrapping_mul(1664525).wrapping_add(1013904223);
                let v = (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5;
                if g % 3 == 0 {
                    v * 1e7
                } else {
                    v
                }
            })
        })
    }

    #[test]
    fn sums_of_four_add_the_lanes_in_order() {
        for seed in 0..64 {
            let v = lanes(seed);
            let expected = v.map(|l| l[1..].iter().fold(l[0], |a, &b| a + b));
            let portable = <Lanes as Vector>::sums_of_four(v);
            assert_eq!(portable.map(f32::to_bits), expected.map(f32::to_bits));
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2") {
                #[target_feature(enable = "avx2")]
                unsafe fn avx(v: [Lanes; 4]) -> [f32; 4] {
                    Avx::sums_of_four([
                        Avx::load(&v[0]),
                        Avx::load(&v[1]),
                        Avx::load(&v[2]),
                        Avx::load(&v[3]),
                    ])
                }
                // SAFETY: the CPU supports AVX2.
                let wide = unsafe { avx(v) };
                assert_eq!(wide.map(f32::to_bits), expected.map(f32::to_bits));
            }
        }
    }
}
