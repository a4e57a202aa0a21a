//! Per-group weighted `(scale, offset)` fits: a few starts from the group's
//! min and max, each alternating nearest codes with the closed-form
//! weighted least squares ([`super::sums`]); the best fit seen is kept.

use super::sums::{weighted_code_sums, WeightedStats};
use crate::requant::lanes::{
    clamps_from_min, each, least_squares, zip, Clamp, CodeSums, ErrorForm, Lanes, Rows,
};
use crate::requant::vector::Vector;

/// Initial scales `(max - min) / (nmax + stretch)`.
const NS: usize = 5;
const STARTS: [f32; NS] = [-1.0, -0.5, 0.0, 0.5, 1.0];

/// Rounds of nearest codes and refit per start.
const REFITS: usize = 2;

/// The best weighted fit per group: `(scale, m)` of `x ≈ scale * q - m` and
/// the weighted code sums of its codes.
pub(super) struct GroupFits {
    pub scale: Lanes,
    pub min: Lanes,
    pub sums: CodeSums,
}

#[inline(always)]
pub(super) fn fit_groups<V: Vector>(
    x: &Rows,
    w: &Rows,
    stats: &WeightedStats,
    nmax: f32,
) -> GroupFits {
    let min = each(&stats.lo, |v| v.min(0.0));
    let range = zip(stats.hi, min, |h, m| h - m);
    let mut scale: [Lanes; NS] = std::array::from_fn(|k| each(&range, |r| r / (nmax + STARTS[k])));
    let mut offset = [min; NS];
    let mut best_err = V::splat(f32::MAX);
    let mut best_scale = V::load(&each(&range, |r| r / nmax));
    let mut best_offset = V::load(&min);
    let mut best_sums = [V::splat(0.0); 3];
    for round in 0..REFITS {
        let inv: [Lanes; NS] = std::array::from_fn(|k| each(&scale[k], |v| 1.0 / v));
        // The first round starts from the min, where some clamps cannot bite.
        let clamps = if round == 0 {
            clamps_from_min(&STARTS)
        } else {
            [Clamp::Both; NS]
        };
        let sums = weighted_code_sums::<V, NS>(x, w, &offset, &inv, &clamps, nmax);
        for k in 0..NS {
            let (s, m, usable) = least_squares::<V>(stats.moments(), &sums[k]);
            let err = ErrorForm::new(stats.moments(), &sums[k]).error_of(s, m);
            // A start that fails for a group keeps its last fit there.
            scale[k] = usable.select(s, V::load(&scale[k])).store();
            offset[k] = usable.select(m, V::load(&offset[k])).store();
            let better = usable.and(err.lt(best_err));
            best_err = better.select(err, best_err);
            best_scale = better.select(s, best_scale);
            best_offset = better.select(m, best_offset);
            for i in 0..3 {
                best_sums[i] = better.select(V::load(&sums[k][i]), best_sums[i]);
            }
        }
    }
    // Groups whose values are all equal: scale 0, the value as the min.
    let (best_scale, best_offset) = (best_scale.store(), best_offset.store());
    let flat: [bool; 8] = std::array::from_fn(|g| stats.hi[g] <= min[g]);
    GroupFits {
        scale: std::array::from_fn(|g| if flat[g] { 0.0 } else { best_scale[g] }),
        min: std::array::from_fn(|g| if flat[g] { -min[g] } else { -best_offset[g] }),
        sums: [
            best_sums[0].store(),
            best_sums[1].store(),
            best_sums[2].store(),
        ],
    }
}
