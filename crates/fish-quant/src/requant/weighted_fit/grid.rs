//! The weighted fit as it first ran (scalar: a grid of 21 starts per group,
//! then the 3 x 3 6-bit neighbours each judged by a pass of nearest codes),
//! kept as the reference the lane fit's weighted error is measured against.

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
pub(super) fn quantize_superblock_weighted_grid(
    x: &[f32; 256],
    w: &[f32; 256],
    nmax: u8,
) -> AffineSuperBlock {
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
