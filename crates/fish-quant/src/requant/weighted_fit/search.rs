//! Per-group weighted `(scale, offset)` fits: a few starts from the group's
//! min and max, each alternating nearest codes with the closed-form
//! weighted least squares ([`super::sums`]); the best fit seen is kept.

use super::sums::{PassOf, WeightedStats};
use crate::requant::lanes::{
    clamps_from_min, each, least_squares, zip, Clamp, CodeSums, ErrorForm, Lanes,
};
use crate::requant::vector::Vector;

/// Initial scales `(max - min) / (nmax + stretch)`.
pub(super) const NS: usize = 5;
const STARTS: [f32; NS] = [-1.0, -0.5, 0.0, 0.5, 1.0];

/// Rounds of nearest codes and refit per start.
pub(super) const REFITS: usize = 2;

/// The best weighted fit per group: `(scale, m)` of `x ≈ scale * q - m` and
/// the weighted code sums of its codes.
pub(super) struct GroupFits {
    pub scale: Lanes,
    pub min: Lanes,
    pub sums: CodeSums,
}

/// The starts of every group while they are refined (lane-only state
/// between passes, so two super-blocks' steps can alternate).
#[derive(Clone, Copy, Default)]
pub(super) struct Search {
    /// The groups' mins, clamped to `<= 0`.
    min: Lanes,
    scale: [Lanes; NS],
    offset: [Lanes; NS],
    best_err: Lanes,
    best_scale: Lanes,
    best_offset: Lanes,
    best_sums: CodeSums,
}

impl Search {
    #[inline(always)]
    pub fn new(stats: &WeightedStats, nmax: f32) -> Self {
        let min = each(&stats.lo, |v| v.min(0.0));
        let range = zip(stats.hi, min, |h, m| h - m);
        Self {
            min,
            scale: std::array::from_fn(|k| each(&range, |r| r / (nmax + STARTS[k]))),
            offset: [min; NS],
            best_err: [f32::MAX; 8],
            best_scale: each(&range, |r| r / nmax),
            best_offset: min,
            best_sums: [[0.0; 8]; 3],
        }
    }

    /// What a round's pass needs: every start's offset and inverse scale.
    #[inline(always)]
    pub fn pass(&self) -> PassOf<NS> {
        PassOf {
            offset: self.offset,
            inv: std::array::from_fn(|k| each(&self.scale[k], |v| 1.0 / v)),
        }
    }

    /// The clamps of a round's pass: the first round starts from the min,
    /// where some clamps cannot bite.
    #[inline(always)]
    pub fn clamps(round: usize) -> [Clamp; NS] {
        if round == 0 {
            clamps_from_min(&STARTS)
        } else {
            [Clamp::Both; NS]
        }
    }

    /// The weighted least squares of every start for the codes of its pass
    /// (lane-only work); the best fit is kept.
    #[inline(always)]
    pub fn refit<V: Vector>(&mut self, stats: &WeightedStats, sums: &[CodeSums; NS]) {
        let mut best_err = V::load(&self.best_err);
        let mut best_scale = V::load(&self.best_scale);
        let mut best_offset = V::load(&self.best_offset);
        let mut best_sums = [
            V::load(&self.best_sums[0]),
            V::load(&self.best_sums[1]),
            V::load(&self.best_sums[2]),
        ];
        for k in 0..NS {
            let (s, m, usable) = least_squares::<V>(stats.moments(), &sums[k]);
            let err = ErrorForm::new(stats.moments(), &sums[k]).error_of(s, m);
            // A start that fails for a group keeps its last fit there.
            self.scale[k] = usable.select(s, V::load(&self.scale[k])).store();
            self.offset[k] = usable.select(m, V::load(&self.offset[k])).store();
            let better = usable.and(err.lt(best_err));
            best_err = better.select(err, best_err);
            best_scale = better.select(s, best_scale);
            best_offset = better.select(m, best_offset);
            for i in 0..3 {
                best_sums[i] = better.select(V::load(&sums[k][i]), best_sums[i]);
            }
        }
        self.best_err = best_err.store();
        self.best_scale = best_scale.store();
        self.best_offset = best_offset.store();
        for i in 0..3 {
            self.best_sums[i] = best_sums[i].store();
        }
    }

    /// The best fit per group after the rounds.
    #[inline(always)]
    pub fn result(&self, stats: &WeightedStats) -> GroupFits {
        // Groups whose values are all equal: scale 0, the value as the min.
        let (min, best_scale, best_offset) = (self.min, self.best_scale, self.best_offset);
        let flat: [bool; 8] = std::array::from_fn(|g| stats.hi[g] <= min[g]);
        GroupFits {
            scale: std::array::from_fn(|g| if flat[g] { 0.0 } else { best_scale[g] }),
            min: std::array::from_fn(|g| if flat[g] { -min[g] } else { -best_offset[g] }),
            sums: self.best_sums,
        }
    }
}
