//! The affine super-block fit used by re-quantisation: start each group of
//! 32 from its min/max and alternate nearest-code assignment with a
//! closed-form least-squares refit, instead of the file quantiser's
//! 21-point scale search (which `quantize_row` keeps for byte-exactness).
//!
//! The eight groups of a super-block are fitted side by side: every value
//! below of type `Lanes` holds one number per group, so each step is one
//! 8-wide vector operation with no horizontal sums and no per-group
//! branches. Every lane follows the same IEEE operations in the same order
//! whatever the vector width, so the AVX2 build and the portable build give
//! the same bytes.

use crate::bits::F16Bits;
use crate::blocks::kfit::AffineSuperBlock;

/// One number per group of the super-block.
type Lanes = [f32; 8];
/// Alternations of assignment and least-squares refit per start.
const REFITS: usize = 2;
/// Initial scales `(max - min) / (nmax + stretch)`: each start refits to
/// its own local optimum; the best is kept.
const STARTS: [f32; 3] = [-0.5, 0.0, 0.5];
/// Adding then subtracting 1.5 * 2^23 rounds a float in [0, 2^22) to the
/// nearest integer, ties to even, without a libm call.
const ROUND_MAGIC: f32 = 12_582_912.0;

/// Quantises 256 values to codes in `0..=nmax` (8 groups of 32 under 6-bit
/// scales and mins), using AVX2 where the CPU has it.
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
    quantize_portable(x, nmax)
}

/// The nearest code in `0..=nmax` to `t`, as a float.
#[inline(always)]
fn round_code(t: f32, nmax: f32) -> f32 {
    // Written as comparisons (not f32::max/min, whose NaN rule costs extra
    // instructions) so each maps to one vector max/min; NaN becomes 0.
    let t = if t > 0.0 { t } else { 0.0 };
    let t = if t < nmax { t } else { nmax };
    (t + ROUND_MAGIC) - ROUND_MAGIC
}

/// `f` applied lane by lane.
#[inline(always)]
fn zip(a: Lanes, b: Lanes, f: impl Fn(f32, f32) -> f32) -> Lanes {
    let mut out = [0f32; 8];
    for g in 0..8 {
        out[g] = f(a[g], b[g]);
    }
    out
}

/// Per-group sums of q, q² and q·x for the nearest codes
/// `q = round(clamp((x - offset) * inv, 0, nmax))`, for `K` fits at once
/// (independent accumulators, so the adds do not wait on each other).
#[inline(always)]
fn code_sums<const K: usize>(
    rows: &[Lanes; 32],
    offset: &[Lanes; K],
    inv: &[Lanes; K],
    nmax: f32,
) -> [[Lanes; 3]; K] {
    let mut sums = [[[0f32; 8]; 3]; K];
    for row in rows {
        for k in 0..K {
            let [sl, sl2, sxl] = &mut sums[k];
            for g in 0..8 {
                let q = round_code((row[g] - offset[k][g]) * inv[k][g], nmax);
                sl[g] += q;
                sl2[g] += q * q;
                sxl[g] += q * row[g];
            }
        }
    }
    sums
}

/// Per-group squared error of the nearest codes for
/// `x ≈ scale * q + offset`, for `K` candidates at once.
#[inline(always)]
fn code_errors<const K: usize>(
    rows: &[Lanes; 32],
    scale: &[Lanes; K],
    offset: &[Lanes; K],
    nmax: f32,
) -> [Lanes; K] {
    let inv: [Lanes; K] = std::array::from_fn(|k| {
        zip(
            scale[k],
            scale[k],
            |s, _| if s != 0.0 { 1.0 / s } else { 0.0 },
        )
    });
    let mut err = [[0f32; 8]; K];
    for row in rows {
        for k in 0..K {
            for g in 0..8 {
                let q = round_code((row[g] - offset[k][g]) * inv[k][g], nmax);
                let e = scale[k][g] * q + offset[k][g] - row[g];
                err[k][g] += e * e;
            }
        }
    }
    err
}

/// Fits `x ≈ scale * q - m` per group with `q` in `0..=nmax`, `m >= 0`;
/// returns `(scale, m)` per group. Each step (nearest codes for the current
/// fit, then the least-squares fit for those codes) cannot increase the
/// squared error; the best fit seen over all starts is kept.
#[inline(always)]
fn fit_groups(rows: &[Lanes; 32], nmax: f32) -> (Lanes, Lanes) {
    let (mut lo, mut hi) = ([f32::MAX; 8], [-f32::MAX; 8]);
    let (mut sx, mut sx2) = ([0f32; 8], [0f32; 8]);
    for row in rows {
        for g in 0..8 {
            lo[g] = lo[g].min(row[g]);
            hi[g] = hi[g].max(row[g]);
            sx[g] += row[g];
            sx2[g] += row[g] * row[g];
        }
    }
    // A positive offset would need a negative m; the formats clamp it.
    let min = zip(lo, lo, |v, _| v.min(0.0));
    let flat: [bool; 8] = std::array::from_fn(|g| hi[g] <= min[g]);
    let range = zip(hi, min, |h, m| h - m);
    let n = rows.len() as f32;
    let mut best_err = [f32::MAX; 8];
    let mut best_scale = zip(range, range, |r, _| r / nmax);
    let mut best_offset = min;
    // The starts run in lockstep; their order in the best-fit comparison
    // is refit by refit, start by start.
    let mut scale: [Lanes; 3] =
        std::array::from_fn(|k| zip(range, range, |r, _| r / (nmax + STARTS[k])));
    let mut offset = [min; 3];
    let mut alive = [flat.map(|f| !f); 3];
    for _ in 0..REFITS {
        let inv: [Lanes; 3] = std::array::from_fn(|k| zip(scale[k], scale[k], |s, _| 1.0 / s));
        let sums = code_sums(rows, &offset, &inv, nmax);
        for k in 0..3 {
            let [sl, sl2, sxl] = sums[k];
            for g in 0..8 {
                let det = n * sl2[g] - sl[g] * sl[g];
                let s = (n * sxl[g] - sx[g] * sl[g]) / det;
                let m = (sl2[g] * sx[g] - sl[g] * sxl[g]) / det;
                let clamp_min = m > 0.0;
                let s = if clamp_min { sxl[g] / sl2[g] } else { s };
                let m = if clamp_min { 0.0 } else { m };
                // A degenerate system or a non-positive or non-finite scale
                // ends this start for the group; it keeps its best so far.
                alive[k][g] = alive[k][g] && det > 0.0 && s > 0.0 && s.is_finite();
                // Squared error of these codes under (s, m), from the sums.
                let err = sx2[g] - 2.0 * s * sxl[g] - 2.0 * m * sx[g]
                    + s * s * sl2[g]
                    + 2.0 * s * m * sl[g]
                    + n * m * m;
                scale[k][g] = if alive[k][g] { s } else { scale[k][g] };
                offset[k][g] = if alive[k][g] { m } else { offset[k][g] };
                let better = alive[k][g] && err < best_err[g];
                best_err[g] = if better { err } else { best_err[g] };
                best_scale[g] = if better { s } else { best_scale[g] };
                best_offset[g] = if better { m } else { best_offset[g] };
            }
        }
    }
    let scales = std::array::from_fn(|g| if flat[g] { 0.0 } else { best_scale[g] });
    let mins = std::array::from_fn(|g| if flat[g] { -min[g] } else { -best_offset[g] });
    (scales, mins)
}

/// `quantize_group_scales(values, 63)` with the rounding of [`round_code`]
/// (the same integers for every input, NaN included), inlined into the
/// fit's SIMD context instead of a libm call per value.
#[inline(always)]
fn group_scales_6bit(values: &Lanes) -> (F16Bits, [u8; 8]) {
    let max = values.iter().fold(0.0f32, |m, &v| m.max(v));
    if max <= 0.0 {
        return (F16Bits::from_f32(0.0), [0; 8]);
    }
    let inv = 63.0 / max;
    let ints = values.map(|v| round_code(inv * v, 63.0) as u8);
    (F16Bits::from_f32(max / 63.0), ints)
}

/// The fit itself, written for the compiler to vectorise in whatever
/// target-feature context it is inlined into.
#[inline(always)]
pub(crate) fn quantize_portable(x: &[f32; 256], nmax: u8) -> AffineSuperBlock {
    let nmax_f = nmax as f32;
    let rows: [Lanes; 32] = std::array::from_fn(|i| std::array::from_fn(|g| x[32 * g + i]));
    let (scales, mins) = fit_groups(&rows, nmax_f);
    let (d, mut ls) = group_scales_6bit(&scales);
    let (dmin, mut lm) = group_scales_6bit(&mins);
    let (df, dminf) = (d.to_f32(), dmin.to_f32());
    // Rounding scale and min to 6 bits independently is rarely the best
    // pair: try both neighbours of each and keep the smallest error.
    let (ls0, lm0) = (ls, lm);
    // Candidate c is (ls + c / 3 - 1, lm + c % 3 - 1).
    let cand: [[[i32; 8]; 2]; 9] = std::array::from_fn(|c| {
        [
            std::array::from_fn(|g| ls0[g] as i32 + c as i32 / 3 - 1),
            std::array::from_fn(|g| lm0[g] as i32 + c as i32 % 3 - 1),
        ]
    });
    let scale: [Lanes; 9] =
        std::array::from_fn(|c| std::array::from_fn(|g| df * cand[c][0][g].clamp(0, 63) as f32));
    let offset: [Lanes; 9] = std::array::from_fn(|c| {
        std::array::from_fn(|g| -(dminf * cand[c][1][g].clamp(0, 63) as f32))
    });
    let err = code_errors(&rows, &scale, &offset, nmax_f);
    let mut best = [f32::MAX; 8];
    for c in 0..9 {
        let [sl, ml] = cand[c];
        for g in 0..8 {
            let in_range = (0..=63).contains(&sl[g]) && (0..=63).contains(&ml[g]);
            if in_range && err[c][g] < best[g] {
                best[g] = err[c][g];
                (ls[g], lm[g]) = (sl[g] as u8, ml[g] as u8);
            }
        }
    }
    let scale: Lanes = std::array::from_fn(|g| df * ls[g] as f32);
    let offset: Lanes = std::array::from_fn(|g| -(dminf * lm[g] as f32));
    let inv = zip(scale, scale, |s, _| if s != 0.0 { 1.0 / s } else { 0.0 });
    let mut codes = [0u8; 256];
    for (i, row) in rows.iter().enumerate() {
        for g in 0..8 {
            codes[32 * g + i] = round_code((row[g] - offset[g]) * inv[g], nmax_f) as u8;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blocks::kfit::quantize_group_scales;

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
    fn six_bit_group_scales_match_the_shared_quantiser() {
        let mut cases: Vec<[f32; 8]> = (0..64)
            .map(|seed| {
                let x = data(seed);
                std::array::from_fn(|g| x[g].abs() * (1.0 + seed as f32))
            })
            .collect();
        // Exact halves after scaling, zeros, a negative zero, tiny and huge
        // values, and non-finite ones.
        cases.push(std::array::from_fn(|g| g as f32 * 0.5 + 0.5));
        cases.push([0.0; 8]);
        cases.push([-0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 126.0]);
        cases.push([1e-30, 3e-30, 0.0, 1.0e-38, 2.0e-30, 5e-31, 7e-30, 1e-31]);
        cases.push([3e30, 1e30, 2e30, 0.0, 5e29, 6e30, 1.0, 4e30]);
        cases.push([f32::NAN, 1.0, 2.0, 0.5, 0.25, 3.0, 0.0, 1.5]);
        cases.push([f32::INFINITY, 1.0, 2.0, 0.5, 0.25, 3.0, 0.0, 1.5]);
        for v in &cases {
            let (d, ints) = group_scales_6bit(v);
            let (d_ref, ints_ref) = quantize_group_scales(v, 63);
            assert_eq!((d, ints), (d_ref, ints_ref), "{v:?}");
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
