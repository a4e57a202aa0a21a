//! The affine super-block fit used by re-quantisation: start each group of
//! 32 from its min/max and alternate nearest-code assignment with a
//! closed-form least-squares refit, instead of the file quantiser's
//! 21-point scale search (which `quantize_row` keeps for byte-exactness).
//!
//! Sums run in eight fixed lanes reduced in a fixed order and rounding uses
//! plain float adds, so the AVX2 / AVX-512 builds and the portable build
//! perform the same IEEE operations in the same order and give the same bytes.

use crate::blocks::kfit::{quantize_group_scales, AffineSuperBlock};

/// Independent accumulators per sum; a multiple of every vector width used.
const LANES: usize = 8;
/// Alternations of assignment and least-squares refit per group.
const REFITS: usize = 2;
/// Initial scales `(max - min) / (nmax + stretch)`: each start refits to
/// its own local optimum; the best is kept.
const STARTS: [f32; 3] = [-0.5, 0.0, 0.5];
/// Adding then subtracting 1.5 * 2^23 rounds a float in [0, 2^22) to the
/// nearest integer, ties to even, without a libm call.
const ROUND_MAGIC: f32 = 12_582_912.0;

/// Quantises 256 values to codes in `0..=nmax` (8 groups of 32 under 6-bit
/// scales and mins), picking the widest SIMD level the CPU has.
pub fn quantize_superblock(x: &[f32; 256], nmax: u8) -> AffineSuperBlock {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2 (checked just above).
            return unsafe { quantize_avx2(x, nmax) };
        }
    }
    quantize_portable(x, nmax)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn quantize_avx2(x: &[f32; 256], nmax: u8) -> AffineSuperBlock {
    quantize_with::<avx2::Avx2>(x, nmax)
}

/// The fit itself, written for the compiler to vectorise in whatever
/// target-feature context it is inlined into.
#[inline(always)]
pub(crate) fn quantize_portable(x: &[f32; 256], nmax: u8) -> AffineSuperBlock {
    quantize_with::<Portable>(x, nmax)
}

/// The two passes over a group that the fit repeats.
trait GroupPasses {
    /// Per-lane sums of q, q² and q·x for the nearest codes
    /// `q = round(clamp((x - offset) * inv, 0, nmax))`.
    fn code_sums(x: &[f32; 32], offset: f32, inv: f32, nmax: f32) -> [[f32; LANES]; 3];
    /// Per-lane squared error of those codes under `scale * q + offset`.
    fn code_error(x: &[f32; 32], scale: f32, offset: f32, inv: f32, nmax: f32) -> [f32; LANES];
}

struct Portable;

impl GroupPasses for Portable {
    #[inline(always)]
    fn code_sums(x: &[f32; 32], offset: f32, inv: f32, nmax: f32) -> [[f32; LANES]; 3] {
        let (mut sl, mut sl2, mut sxl) = ([0f32; LANES], [0f32; LANES], [0f32; LANES]);
        for c in lanes(x) {
            for l in 0..LANES {
                let q = round_code((c[l] - offset) * inv, nmax);
                sl[l] += q;
                sl2[l] += q * q;
                sxl[l] += q * c[l];
            }
        }
        [sl, sl2, sxl]
    }

    #[inline(always)]
    fn code_error(x: &[f32; 32], scale: f32, offset: f32, inv: f32, nmax: f32) -> [f32; LANES] {
        let mut err = [0f32; LANES];
        for c in lanes(x) {
            for l in 0..LANES {
                let q = round_code((c[l] - offset) * inv, nmax);
                let e = scale * q + offset - c[l];
                err[l] += e * e;
            }
        }
        err
    }
}

/// The same passes with one 256-bit vector per row of lanes, in the same
/// operation order as [`Portable`] (so the same bits).
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{GroupPasses, LANES, ROUND_MAGIC};
    use std::arch::x86_64::*;

    pub(super) struct Avx2;

    impl GroupPasses for Avx2 {
        #[inline(always)]
        fn code_sums(x: &[f32; 32], offset: f32, inv: f32, nmax: f32) -> [[f32; LANES]; 3] {
            // SAFETY: only instantiated inside `quantize_avx2`, which needs AVX2.
            unsafe { code_sums(x, offset, inv, nmax) }
        }

        #[inline(always)]
        fn code_error(x: &[f32; 32], scale: f32, offset: f32, inv: f32, nmax: f32) -> [f32; LANES] {
            // SAFETY: as above.
            unsafe { code_error(x, scale, offset, inv, nmax) }
        }
    }

    /// `round(clamp((v - offset) * inv, 0, nmax))`; `max_ps(NaN, 0)` is 0
    /// like `f32::max`.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn codes(v: __m256, offset: __m256, inv: __m256, nmax: __m256) -> __m256 {
        let magic = _mm256_set1_ps(ROUND_MAGIC);
        let t = _mm256_mul_ps(_mm256_sub_ps(v, offset), inv);
        let t = _mm256_min_ps(_mm256_max_ps(t, _mm256_setzero_ps()), nmax);
        _mm256_sub_ps(_mm256_add_ps(t, magic), magic)
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    fn load(row: &[f32; LANES]) -> __m256 {
        // SAFETY: `row` is 8 readable f32s.
        unsafe { _mm256_loadu_ps(row.as_ptr()) }
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    fn store(v: __m256) -> [f32; LANES] {
        let mut out = [0f32; LANES];
        // SAFETY: `out` is 8 writable f32s.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), v) };
        out
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    fn code_sums(x: &[f32; 32], offset: f32, inv: f32, nmax: f32) -> [[f32; LANES]; 3] {
        let (o, i, n) = (
            _mm256_set1_ps(offset),
            _mm256_set1_ps(inv),
            _mm256_set1_ps(nmax),
        );
        let (mut sl, mut sl2, mut sxl) = (
            _mm256_setzero_ps(),
            _mm256_setzero_ps(),
            _mm256_setzero_ps(),
        );
        for row in super::lanes(x) {
            let v = load(row);
            let q = codes(v, o, i, n);
            sl = _mm256_add_ps(sl, q);
            sl2 = _mm256_add_ps(sl2, _mm256_mul_ps(q, q));
            sxl = _mm256_add_ps(sxl, _mm256_mul_ps(q, v));
        }
        [store(sl), store(sl2), store(sxl)]
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    fn code_error(x: &[f32; 32], scale: f32, offset: f32, inv: f32, nmax: f32) -> [f32; LANES] {
        let (o, i, n) = (
            _mm256_set1_ps(offset),
            _mm256_set1_ps(inv),
            _mm256_set1_ps(nmax),
        );
        let s = _mm256_set1_ps(scale);
        let mut err = _mm256_setzero_ps();
        for row in super::lanes(x) {
            let v = load(row);
            let q = codes(v, o, i, n);
            let e = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(s, q), o), v);
            err = _mm256_add_ps(err, _mm256_mul_ps(e, e));
        }
        store(err)
    }
}

#[inline(always)]
fn quantize_with<K: GroupPasses>(x: &[f32; 256], nmax: u8) -> AffineSuperBlock {
    let nmax_f = nmax as f32;
    let mut scales = [0f32; 8];
    let mut mins = [0f32; 8];
    for g in 0..8 {
        (scales[g], mins[g]) = fit_group::<K>(group(x, g), nmax_f);
    }
    let (d, ls) = quantize_group_scales(&scales, 63);
    let (dmin, lm) = quantize_group_scales(&mins, 63);
    let (df, dminf) = (d.to_f32(), dmin.to_f32());
    let (mut ls, mut lm) = (ls, lm);
    let mut codes = [0u8; 256];
    for g in 0..8 {
        let xg = group(x, g);
        // Rounding scale and min to 6 bits independently is rarely the best
        // pair: try both neighbours of each and keep the smallest error.
        let mut best = (f32::MAX, ls[g], lm[g]);
        for sl in ls[g].saturating_sub(1)..=(ls[g] + 1).min(63) {
            for ml in lm[g].saturating_sub(1)..=(lm[g] + 1).min(63) {
                let err = group_error::<K>(xg, df * sl as f32, -(dminf * ml as f32), nmax_f);
                if err < best.0 {
                    best = (err, sl, ml);
                }
            }
        }
        (ls[g], lm[g]) = (best.1, best.2);
        let scale = df * ls[g] as f32;
        let offset = -(dminf * lm[g] as f32);
        let inv = if scale != 0.0 { 1.0 / scale } else { 0.0 };
        for (q, &v) in codes[32 * g..32 * g + 32].iter_mut().zip(xg) {
            *q = round_code((v - offset) * inv, nmax_f) as u8;
        }
    }
    AffineSuperBlock {
        d,
        dmin,
        scales: ls,
        mins: lm,
        codes,
    }
}

#[inline(always)]
fn group(x: &[f32; 256], g: usize) -> &[f32; 32] {
    x[32 * g..32 * g + 32]
        .try_into()
        .expect("a group is 32 values")
}

/// The nearest code in `0..=nmax` to `t`, as a float.
#[inline(always)]
fn round_code(t: f32, nmax: f32) -> f32 {
    (t.max(0.0).min(nmax) + ROUND_MAGIC) - ROUND_MAGIC
}

/// Squared error of the nearest codes for `x ≈ scale * q + offset`.
#[inline(always)]
fn group_error<K: GroupPasses>(x: &[f32; 32], scale: f32, offset: f32, nmax: f32) -> f32 {
    let inv = if scale != 0.0 { 1.0 / scale } else { 0.0 };
    reduce(K::code_error(x, scale, offset, inv, nmax))
}

/// A group as rows of `LANES` values: the loops below run over the lanes
/// of a row so that the compiler keeps each lane in one vector slot.
#[inline(always)]
fn lanes(x: &[f32; 32]) -> &[[f32; LANES]] {
    x.as_chunks::<LANES>().0
}

/// Sums eight lanes in a fixed order.
#[inline(always)]
fn reduce(v: [f32; LANES]) -> f32 {
    ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]))
}

/// Fits `x ≈ scale * q - m` with `q` in `0..=nmax`, `m >= 0`; returns
/// `(scale, m)`. Each step (nearest codes for the current fit, then the
/// least-squares fit for those codes) cannot increase the squared error.
#[inline(always)]
fn fit_group<K: GroupPasses>(x: &[f32; 32], nmax: f32) -> (f32, f32) {
    let mut lo = [f32::MAX; LANES];
    let mut hi = [-f32::MAX; LANES];
    let (mut sx, mut sx2) = ([0f32; LANES], [0f32; LANES]);
    for c in lanes(x) {
        for l in 0..LANES {
            lo[l] = lo[l].min(c[l]);
            hi[l] = hi[l].max(c[l]);
            sx[l] += c[l];
            sx2[l] += c[l] * c[l];
        }
    }
    let min = lo.iter().fold(f32::MAX, |a, &b| a.min(b)).min(0.0);
    let max = hi.iter().fold(-f32::MAX, |a, &b| a.max(b));
    if max <= min {
        return (0.0, -min);
    }
    let (sx, sx2) = (reduce(sx), reduce(sx2));
    let n = x.len() as f32;
    let mut best = (f32::MAX, (max - min) / nmax, min);
    for stretch in STARTS {
        let (mut scale, mut offset) = ((max - min) / (nmax + stretch), min);
        for _ in 0..REFITS {
            let inv = 1.0 / scale;
            let [sl, sl2, sxl] = K::code_sums(x, offset, inv, nmax);
            let (sl, sl2, sxl) = (reduce(sl), reduce(sl2), reduce(sxl));
            let det = n * sl2 - sl * sl;
            if det <= 0.0 {
                break;
            }
            let s = (n * sxl - sx * sl) / det;
            let m = (sl2 * sx - sl * sxl) / det;
            let (s, m) = if m > 0.0 { (sxl / sl2, 0.0) } else { (s, m) };
            // A non-positive or non-finite scale would not come from a sane
            // fit; keep the previous one.
            if !(s > 0.0 && s.is_finite()) {
                break;
            }
            (scale, offset) = (s, m);
            // Squared error of these codes under the refitted (s, m), from the sums.
            let err =
                sx2 - 2.0 * s * sxl - 2.0 * m * sx + s * s * sl2 + 2.0 * s * m * sl + n * m * m;
            if err < best.0 {
                best = (err, s, m);
            }
        }
    }
    let (_, scale, offset) = best;
    (scale, -offset)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(seed: u32) -> [f32; 256] {
        let mut s = seed;
        std::array::from_fn(|i| {
            s = s.wrapping_mul(1664525).wrapping_add(1013904223);
            let v = (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5;
            // Some groups all positive, some with an outlier.
            match i / 32 {
                2 => v.abs() + 0.3,
                5 if i % 32 == 7 => 9.0,
                _ => v,
            }
        })
    }

    fn decode(sb: &AffineSuperBlock, out: &mut [f32; 256]) {
        let (d, dmin) = (sb.d.to_f32(), sb.dmin.to_f32());
        for (i, o) in out.iter_mut().enumerate() {
            let g = i / 32;
            *o = d * sb.scales[g] as f32 * sb.codes[i] as f32 - dmin * sb.mins[g] as f32;
        }
    }

    #[test]
    fn every_simd_level_gives_the_portable_bytes() {
        for seed in 0..32 {
            let x = data(seed);
            for nmax in [7, 15] {
                let a = quantize_superblock(&x, nmax);
                let b = quantize_portable(&x, nmax);
                assert_eq!(
                    (a.d, a.dmin, a.scales, a.mins),
                    (b.d, b.dmin, b.scales, b.mins)
                );
                assert_eq!(a.codes, b.codes);
            }
        }
    }

    #[test]
    fn codes_stay_in_range_and_error_is_small() {
        let x = data(7);
        for (nmax, bound) in [(7u8, 0.2f32), (15, 0.1)] {
            let sb = quantize_portable(&x, nmax);
            assert!(sb.codes.iter().all(|&q| q <= nmax));
            let mut y = [0f32; 256];
            decode(&sb, &mut y);
            // Group 5 holds an outlier; the others are uniform in [-0.5, 0.5].
            let (mut err, mut energy) = (0f32, 0f32);
            for i in (0..256).filter(|i| i / 32 != 5) {
                err += (x[i] - y[i]) * (x[i] - y[i]);
                energy += x[i] * x[i];
            }
            let rel = (err / energy).sqrt();
            assert!(rel < bound, "nmax {nmax}: {rel}");
        }
    }

    #[test]
    fn constant_and_zero_groups_decode_exactly() {
        let mut x = [0f32; 256];
        x[32..64].fill(-0.25);
        let sb = quantize_portable(&x, 15);
        let mut y = [0f32; 256];
        decode(&sb, &mut y);
        assert_eq!(y[..32], [0.0; 32]);
        // -0.25 is the min alone, held as 6 bits under an f16 dmin.
        assert!(
            y[32..64].iter().all(|&v| (v + 0.25).abs() < 1e-3),
            "{:?}",
            &y[32..64]
        );
    }
}
