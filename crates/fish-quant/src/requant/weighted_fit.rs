//! The importance-weighted affine super-block fit: the same layout as the
//! fast fit (eight groups of 32 under 6-bit scales and mins), but every step
//! minimises `sum_i w_i (x_i - q_i)²` with per-value weights — the activation
//! energy of each input column from a calibration run — so the columns the
//! model actually drives get the smaller error.
//!
//! Scalar and slower than the fast fit (a grid of starts per group), which
//! is acceptable: it only runs when calibration importance is supplied.

use crate::blocks::kfit::{fit_scale_min, quantize_group_scales, AffineSuperBlock, FitSearch};
use crate::round::nearest_int;

/// Starts `(nmax + OFFSET + 0.1 k) / (max - min)` for k in `0..=STEPS`, each
/// refined by a weighted least-squares refit; the best is kept.
const SEARCH: FitSearch = FitSearch::Grid {
    offset: -1.0,
    steps: 20,
};

/// Quantises 256 values to codes in `0..=nmax` minimising the `w`-weighted
/// squared error (weights must be finite and non-negative; all-zero weights
/// in a group fall back to the plain error for that group).
pub fn quantize_superblock_weighted(x: &[f32; 256], w: &[f32; 256], nmax: u8) -> AffineSuperBlock {
    let mut weights = [0f32; 256];
    for g in 0..8 {
        let src = &w[32 * g..32 * g + 32];
        let dst = &mut weights[32 * g..32 * g + 32];
        // A group without weight would make every fit degenerate.
        if src.iter().sum::<f32>() > 0.0 {
            dst.copy_from_slice(src);
        } else {
            dst.fill(1.0);
        }
    }
    let mut scales = [0f32; 8];
    let mut mins = [0f32; 8];
    let mut codes = [0u8; 256];
    for g in 0..8 {
        let r = 32 * g..32 * g + 32;
        (scales[g], mins[g]) = fit_scale_min(
            &x[r.clone()],
            &weights[r.clone()],
            nmax,
            SEARCH,
            &mut codes[r],
        );
    }
    let (d, mut ls) = quantize_group_scales(&scales, 63);
    let (dmin, mut lm) = quantize_group_scales(&mins, 63);
    let (df, dminf) = (d.to_f32(), dmin.to_f32());
    for g in 0..8 {
        let r = 32 * g..32 * g + 32;
        let (xg, wg) = (&x[r.clone()], &weights[r.clone()]);
        // The 6-bit neighbours of the fitted scale and min, judged by the
        // weighted error of their nearest codes.
        let mut best = (f32::MAX, ls[g], lm[g]);
        let mut trial = [0u8; 32];
        for sl in ls[g].saturating_sub(1)..=(ls[g] + 1).min(63) {
            for ml in lm[g].saturating_sub(1)..=(lm[g] + 1).min(63) {
                let (scale, offset) = (df * sl as f32, -(dminf * ml as f32));
                let err = assign_and_error(xg, wg, nmax, scale, offset, &mut trial);
                if err < best.0 {
                    best = (err, sl, ml);
                    codes[r.clone()].copy_from_slice(&trial);
                }
            }
        }
        (ls[g], lm[g]) = (best.1, best.2);
    }
    AffineSuperBlock {
        d,
        dmin,
        scales: ls,
        mins: lm,
        codes,
    }
}

/// Nearest codes for `x ≈ scale * q + offset` and their weighted squared error.
fn assign_and_error(
    x: &[f32],
    w: &[f32],
    nmax: u8,
    scale: f32,
    offset: f32,
    codes: &mut [u8; 32],
) -> f32 {
    let inv = if scale != 0.0 { 1.0 / scale } else { 0.0 };
    let mut err = 0.0;
    for ((q, &v), &w) in codes.iter_mut().zip(x).zip(w) {
        *q = nearest_int((v - offset) * inv).clamp(0, nmax as i32) as u8;
        let e = scale * *q as f32 + offset - v;
        err += w * e * e;
    }
    err
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::requant::fast_fit::quantize_superblock;

    fn data(seed: u32) -> [f32; 256] {
        let mut s = seed;
        std::array::from_fn(|_| {
            s = s.wrapping_mul(1664525).wrapping_add(1013904223);
            (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        })
    }

    fn decode(sb: &AffineSuperBlock) -> [f32; 256] {
        let (d, dmin) = (sb.d.to_f32(), sb.dmin.to_f32());
        std::array::from_fn(|i| {
            let g = i / 32;
            d * sb.scales[g] as f32 * sb.codes[i] as f32 - dmin * sb.mins[g] as f32
        })
    }

    fn weighted_error(x: &[f32; 256], y: &[f32; 256], w: &[f32; 256]) -> f32 {
        (0..256).map(|i| w[i] * (x[i] - y[i]) * (x[i] - y[i])).sum()
    }

    /// Weights with a few heavy columns, as activation energy has.
    fn skewed_weights(seed: u32) -> [f32; 256] {
        let mut s = seed.wrapping_add(99);
        std::array::from_fn(|i| {
            s = s.wrapping_mul(1664525).wrapping_add(1013904223);
            let base = (s >> 8) as f32 / (1u32 << 24) as f32 + 0.01;
            if i % 37 == 3 {
                100.0 * base
            } else {
                base
            }
        })
    }

    #[test]
    fn weighting_lowers_the_weighted_error_against_the_plain_fit() {
        let (mut plain, mut weighted) = (0f32, 0f32);
        for seed in 0..16 {
            let x = data(seed);
            let w = skewed_weights(seed);
            let a = decode(&quantize_superblock(&x, 7).in_value_order());
            let b = decode(&quantize_superblock_weighted(&x, &w, 7));
            plain += weighted_error(&x, &a, &w);
            weighted += weighted_error(&x, &b, &w);
        }
        assert!(
            weighted < 0.8 * plain,
            "weighted {weighted} vs plain {plain}"
        );
    }

    #[test]
    fn codes_stay_in_range_and_zero_weight_groups_still_fit() {
        let x = data(3);
        let mut w = skewed_weights(3);
        w[64..96].fill(0.0);
        let sb = quantize_superblock_weighted(&x, &w, 7);
        assert!(sb.codes.iter().all(|&q| q <= 7));
        let y = decode(&sb);
        let ones = [1.0; 256];
        let (mut err, mut energy) = (0f32, 0f32);
        for i in 64..96 {
            err += ones[i] * (x[i] - y[i]) * (x[i] - y[i]);
            energy += x[i] * x[i];
        }
        assert!((err / energy).sqrt() < 0.2, "{}", (err / energy).sqrt());
    }
}
