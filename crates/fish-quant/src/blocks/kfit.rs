//! Fitting per-group scales (and mins) for the k-quant quantisers and FQ3.

use crate::bits::F16Bits;
use crate::round::nearest_int;

/// How hard the affine (scale, min) fit searches.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum FitSearch {
    /// Start from (max - min) / nmax and alternate rounding with a
    /// least-squares refit twice: cheap, used for re-quantisation.
    Refine,
    /// Also try `steps + 1` stretched initial scales
    /// `(nmax + offset + k * 0.1) / (max - min)` and keep the best fit.
    Grid { offset: f32, steps: u8 },
}

/// Weighted least-squares fit of `x ≈ scale * q - m` with integer codes
/// `q` in `0..=nmax` and `m >= 0`. Writes the codes and returns `(scale, m)`.
pub fn fit_scale_min(
    x: &[f32],
    w: &[f32],
    nmax: u8,
    search: FitSearch,
    codes: &mut [u8],
) -> (f32, f32) {
    let (mut min, max) = x
        .iter()
        .fold((f32::MAX, -f32::MAX), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    // A positive offset would need a negative m; ggml's formats clamp it.
    if min > 0.0 {
        min = 0.0;
    }
    if max <= min {
        codes.iter_mut().for_each(|q| *q = 0);
        return (0.0, -min);
    }
    let nmax_f = nmax as f32;
    let scale0 = (max - min) / nmax_f;
    let err0 = assign_and_error(x, w, nmax, scale0, min, codes);
    let mut trial = [0u8; 32];
    let trial = &mut trial[..x.len()];

    let mut try_fit = |scale: f32, min: f32, best: &mut (f32, f32, f32), codes: &mut [u8]| {
        assign(x, nmax, scale, min, trial);
        if let Some((s, m)) = least_squares(x, w, trial) {
            let err = error(x, w, trial, s, m);
            if err < best.2 {
                *best = (s, m, err);
                codes.copy_from_slice(trial);
            }
        }
    };
    let mut best = (scale0, min, err0);
    match search {
        FitSearch::Refine => {
            for _ in 0..2 {
                try_fit(best.0, best.1, &mut best, codes);
            }
        }
        FitSearch::Grid { offset, steps } => {
            try_fit(best.0, best.1, &mut best, codes);
            for k in 0..=steps {
                let iscale = (nmax_f + offset + 0.1 * k as f32) / (max - min);
                try_fit(1.0 / iscale, min, &mut best, codes);
            }
        }
    }
    (best.0, -best.1)
}

/// Codes for `x ≈ scale * q + min`.
#[inline(always)]
fn assign(x: &[f32], nmax: u8, scale: f32, min: f32, codes: &mut [u8]) {
    let inv = if scale != 0.0 { 1.0 / scale } else { 0.0 };
    for (q, &v) in codes.iter_mut().zip(x) {
        *q = nearest_int((v - min) * inv).clamp(0, nmax as i32) as u8;
    }
}

fn assign_and_error(x: &[f32], w: &[f32], nmax: u8, scale: f32, min: f32, codes: &mut [u8]) -> f32 {
    assign(x, nmax, scale, min, codes);
    error(x, w, codes, scale, min)
}

#[inline(always)]
fn error(x: &[f32], w: &[f32], codes: &[u8], scale: f32, min: f32) -> f32 {
    x.iter()
        .zip(w)
        .zip(codes)
        .map(|((&v, &w), &q)| {
            let e = scale * q as f32 + min - v;
            w * e * e
        })
        .sum()
}

/// The (scale, min) minimising the weighted squared error for fixed codes,
/// with min clamped to `<= 0`.
#[inline(always)]
fn least_squares(x: &[f32], w: &[f32], codes: &[u8]) -> Option<(f32, f32)> {
    let (mut sw, mut sx, mut sl, mut sl2, mut sxl) = (0.0f32, 0.0f32, 0.0f32, 0.0f32, 0.0f32);
    for ((&v, &w), &q) in x.iter().zip(w).zip(codes) {
        let l = q as f32;
        sw += w;
        sx += w * v;
        sl += w * l;
        sl2 += w * l * l;
        sxl += w * l * v;
    }
    let det = sw * sl2 - sl * sl;
    if det <= 0.0 {
        return None;
    }
    let scale = (sw * sxl - sx * sl) / det;
    let min = (sl2 * sx - sl * sxl) / det;
    if min > 0.0 {
        (sl2 > 0.0).then(|| (sxl / sl2, 0.0))
    } else {
        Some((scale, min))
    }
}

/// Weighted fit of `x ≈ scale * q` with signed codes `q` in `-nmax..nmax`,
/// trying 19 scales around `-nmax / max` (max: the signed extreme), with
/// weights `x²`. Writes `q + nmax` and returns the scale.
pub fn fit_signed(x: &[f32], nmax: i32, codes: &mut [u8]) -> f32 {
    let mut amax = 0.0f32;
    let mut max = 0.0f32;
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < 1e-15 {
        codes.iter_mut().for_each(|q| *q = nmax as u8);
        return 0.0;
    }
    let mut best_metric = -1.0f32;
    let mut best_scale = 0.0f32;
    let mut trial = [0u8; 32];
    for k in -9..=9 {
        let iscale = -(nmax as f32 + 0.1 * k as f32) / max;
        let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
        for (q, &v) in trial.iter_mut().zip(x) {
            let l = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
            *q = (l + nmax) as u8;
            let w = v * v;
            sumlx += w * v * l as f32;
            suml2 += w * (l * l) as f32;
        }
        if suml2 > 0.0 && sumlx * sumlx > best_metric * suml2 {
            best_metric = sumlx * sumlx / suml2;
            best_scale = sumlx / suml2;
            codes.copy_from_slice(&trial[..x.len()]);
        }
    }
    best_scale
}

/// Quantises non-negative per-group values to `bits`-bit integers under
/// one f16 super-scale: returns (super-scale, integers).
pub fn quantize_group_scales<const N: usize>(values: &[f32; N], levels: u8) -> (F16Bits, [u8; N]) {
    let max = values.iter().fold(0.0f32, |m, &v| m.max(v));
    let mut ints = [0u8; N];
    if max <= 0.0 {
        return (F16Bits::from_f32(0.0), ints);
    }
    let inv = levels as f32 / max;
    for (i, &v) in ints.iter_mut().zip(values) {
        *i = nearest_int(inv * v).clamp(0, levels as i32) as u8;
    }
    (F16Bits::from_f32(max / levels as f32), ints)
}

/// The affine super-block shared by Q4_K, Q5_K and FQ3: eight groups of 32
/// with 6-bit scales and mins under f16 `d` and `dmin`.
pub struct AffineSuperBlock {
    pub d: F16Bits,
    pub dmin: F16Bits,
    pub scales: [u8; 8],
    pub mins: [u8; 8],
    pub codes: [u8; 256],
}

/// Fits and quantises 256 values to codes in `0..=nmax`.
pub fn quantize_affine_superblock(
    x: &[f32],
    nmax: u8,
    search: FitSearch,
    importance: Importance,
) -> AffineSuperBlock {
    let mut scales = [0f32; 8];
    let mut mins = [0f32; 8];
    let mut codes = [0u8; 256];
    for g in 0..8 {
        let xg = &x[32 * g..32 * g + 32];
        let w = importance_weights(xg, importance);
        (scales[g], mins[g]) = fit_scale_min(xg, &w, nmax, search, &mut codes[32 * g..32 * g + 32]);
    }
    let (d, mut ls) = quantize_group_scales(&scales, 63);
    let (dmin, mut lm) = quantize_group_scales(&mins, 63);
    let (df, dminf) = (d.to_f32(), dmin.to_f32());
    for g in 0..8 {
        let xg = &x[32 * g..32 * g + 32];
        let wg = importance_weights(xg, importance);
        let codes_g = &mut codes[32 * g..32 * g + 32];
        // Rounding the scale and min to 6 bits independently is rarely the
        // best pair: try the neighbours of both and keep the smallest error.
        let mut best = (f32::MAX, ls[g], lm[g]);
        let mut trial = [0u8; 32];
        for sl in ls[g].saturating_sub(1)..=(ls[g] + 1).min(63) {
            for ml in lm[g].saturating_sub(1)..=(lm[g] + 1).min(63) {
                let (dd, dm) = (df * sl as f32, dminf * ml as f32);
                let err = assign_and_error(xg, &wg, nmax, dd, -dm, &mut trial);
                if err < best.0 {
                    best = (err, sl, ml);
                    codes_g.copy_from_slice(&trial);
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

fn importance_weights(xg: &[f32], importance: Importance) -> [f32; 32] {
    match importance {
        Importance::Uniform => [1.0; 32],
        Importance::MagnitudePlusRms => {
            let rms = (xg.iter().map(|v| v * v).sum::<f32>() / 32.0).sqrt();
            std::array::from_fn(|l| rms + xg[l].abs())
        }
    }
}

/// Per-value weights of the affine fit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Importance {
    /// Every value counts the same: minimises the plain squared error.
    Uniform,
    /// `rms(group) + |x|`: larger values count more, as ggml's file quantiser does.
    MagnitudePlusRms,
}
