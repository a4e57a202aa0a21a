//! From the fitted per-group `(scale, min)` to 6-bit scales and mins under
//! f16 `d` and `dmin`, every choice ranked by the weighted error: a few
//! super-scales, then two scale levels by three min levels per group, then
//! the 3 x 3 neighbours of the pair for the final codes.

use super::search::GroupFits;
use super::sums::{PassOf, WeightedStats};
use crate::bits::F16Bits;
use crate::requant::lanes::{inverse, zip, CodeSums, ErrorForm, Lanes};
use crate::requant::lattice::{
    f16_magnitude, group_scales_6bit, neighbour, scaled, Lattice, Levels,
};
use crate::requant::vector::{round_levels, Vector};

/// Super-scales tried, as f16 steps above `max / 63` (as the plain fit).
const SUPER_SCALE_STEPS: [u16; 4] = [0, 8, 16, 32];

/// `dmin` from the fitted mins and the super-scale `d` (see
/// [`super_scale`]) with the 6-bit levels to start the neighbour search
/// from (lane-only work).
#[inline(always)]
pub(super) fn lattice<V: Vector>(stats: &WeightedStats, fits: &GroupFits) -> Lattice {
    let (dmin, _) = group_scales_6bit(&fits.min);
    let dminf = dmin.to_f32();
    let (d, unrounded, ls, lm) = super_scale::<V>(stats, &fits.sums, &fits.scale, dminf);
    Lattice {
        d,
        dmin,
        ls,
        lm,
        unrounded,
    }
}

/// The `d` of [`SUPER_SCALE_STEPS`] whose rounded scales, with the min
/// level nearest the best offset for each (codes fixed), give the smallest
/// weighted error over the super-block; returns it with the unrounded and
/// rounded scale levels and the min levels.
#[inline(always)]
fn super_scale<V: Vector>(
    stats: &WeightedStats,
    sums: &CodeSums,
    scales: &Lanes,
    dminf: f32,
) -> (F16Bits, Lanes, Levels, Levels) {
    let inv_dmin = if dminf > 0.0 { 1.0 / dminf } else { 0.0 };
    let max = scales.iter().fold(0.0f32, |m, &v| m.max(v));
    let first = u16::from_le_bytes(F16Bits::from_f32(max / 63.0).0) & 0x7fff;
    let form = ErrorForm::<V>::new(stats.moments(), sums);
    let inv_sw = V::splat(1.0).div(V::load(&stats.sw));
    let zero = V::splat(0.0);
    const N: usize = SUPER_SCALE_STEPS.len();
    let (mut bits, mut err) = ([0u16; N], [zero; N]);
    let (mut unrounded, mut ls, mut lm) = ([zero; N], [zero; N], [zero; N]);
    for (i, step) in SUPER_SCALE_STEPS.into_iter().enumerate() {
        bits[i] = first.saturating_add(step).min(0x7bff);
        let df = f16_magnitude(bits[i]);
        let inv = if df > 0.0 { 1.0 / df } else { 0.0 };
        unrounded[i] = V::load(scales).mul(V::splat(inv));
        ls[i] = round_levels(unrounded[i], 63.0);
        let s = ls[i].mul(V::splat(df));
        // The best offset for these codes under scale s, clamped to <= 0.
        let (sx, sl) = (V::load(&stats.swx), V::load(&sums[0]));
        let offset = sx.sub(s.mul(sl)).mul(inv_sw).min(zero);
        lm[i] = round_levels(zero.sub(offset).mul(V::splat(inv_dmin)), 63.0);
        err[i] = form.error_of(s, zero.sub(lm[i].mul(V::splat(dminf))));
    }
    // The first step of least error over the super-block wins (none when
    // every error is NaN or huge: then `d` stays the first and the levels 0).
    let totals = V::sums_of_four(err);
    let mut best = (f32::MAX, first, [0.0; 8], [0.0; 8], [0.0; 8]);
    for i in 0..N {
        if totals[i] < best.0 {
            best = (
                totals[i],
                bits[i],
                unrounded[i].store(),
                ls[i].store(),
                lm[i].store(),
            );
        }
    }
    (F16Bits(best.1.to_le_bytes()), best.2, best.3, best.4)
}

/// Keeps, per group, the candidate levels where `err` beats `best`.
#[inline(always)]
fn take_better<V: Vector>(
    best: &mut V,
    (ls, lm): (&mut Levels, &mut Levels),
    err: V,
    (sl, ml): (&Levels, &Levels),
) {
    let better = err.lt(*best);
    *best = better.select(err, *best);
    *ls = better.select(V::load(sl), V::load(ls)).store();
    *lm = better.select(V::load(ml), V::load(lm)).store();
}

/// Two scale levels (the rounded one and its neighbour toward the
/// unrounded value), each with one pass of nearest codes under the rounded
/// min ([`PairSearch::pass`]); three min levels each, ranked by the
/// closed-form weighted error ([`PairSearch::best`]).
#[derive(Clone, Copy, Default)]
pub(super) struct PairSearch {
    start: (Levels, Levels),
    candidates: [Levels; 2],
    scale: [Lanes; 2],
    offset: [Lanes; 3],
}

impl PairSearch {
    #[inline(always)]
    pub fn new(l: &Lattice) -> Self {
        let (df, dminf) = l.supers();
        let (ls0, lm0) = (l.ls, l.lm);
        let toward = zip(
            l.unrounded,
            ls0,
            |u, l| if u > l { l + 1.0 } else { l - 1.0 },
        );
        let toward = neighbour(&toward, 1);
        Self {
            start: (ls0, lm0),
            candidates: [ls0, toward],
            scale: [scaled(df, &ls0), scaled(df, &toward)],
            offset: std::array::from_fn(|c| scaled(-dminf, &neighbour(&lm0, c))),
        }
    }

    /// The offsets and inverse scales of the two passes (every clamp
    /// applies).
    #[inline(always)]
    pub fn pass(&self) -> PassOf<2> {
        PassOf {
            offset: [self.offset[1]; 2],
            inv: [inverse(&self.scale[0]), inverse(&self.scale[1])],
        }
    }

    /// The best pair for the codes of [`Self::pass`].
    #[inline(always)]
    pub fn best<V: Vector>(&self, stats: &WeightedStats, sums: &[CodeSums; 2]) -> (Levels, Levels) {
        let (ls0, lm0) = self.start;
        let (mut ls, mut lm) = (ls0, lm0);
        let mut best = V::splat(f32::MAX);
        for j in 0..2 {
            let form = ErrorForm::new(stats.moments(), &sums[j]);
            let part = form.scale_part(V::load(&self.scale[j]));
            for (c, offset) in self.offset.iter().enumerate() {
                let m = V::load(offset);
                let err = form.error(&part, form.offset_part(m), m);
                let cand = (&self.candidates[j], &neighbour(&lm0, c));
                take_better(&mut best, (&mut ls, &mut lm), err, cand);
            }
        }
        (ls, lm)
    }
}

/// The final step: nearest codes for a pair ([`Settle::pass`]), then the
/// pair among its 3 x 3 neighbours with the smallest weighted error for
/// those codes (the middle one first, so ties keep it; [`Settle::best`]).
#[derive(Clone, Copy, Default)]
pub(super) struct Settle {
    start: (Levels, Levels),
    scale: [Lanes; 3],
    offset: [Lanes; 3],
}

impl Settle {
    #[inline(always)]
    pub fn new((df, dminf): (f32, f32), (ls0, lm0): (Levels, Levels)) -> Self {
        Self {
            start: (ls0, lm0),
            scale: std::array::from_fn(|j| scaled(df, &neighbour(&ls0, j))),
            offset: std::array::from_fn(|c| scaled(-dminf, &neighbour(&lm0, c))),
        }
    }

    /// The offset and inverse scale of the nearest codes.
    #[inline(always)]
    pub fn pass(&self) -> (Lanes, Lanes) {
        (self.offset[1], inverse(&self.scale[1]))
    }

    #[inline(always)]
    pub fn best<V: Vector>(&self, stats: &WeightedStats, sums: &CodeSums) -> (Levels, Levels) {
        let (ls0, lm0) = self.start;
        let form = ErrorForm::new(stats.moments(), sums);
        let (mut ls, mut lm) = (ls0, lm0);
        let mut best = V::splat(f32::MAX);
        for c in [4, 0, 1, 2, 3, 5, 6, 7, 8] {
            let (j, c) = (c / 3, c % 3);
            let err = form.error_of(V::load(&self.scale[j]), V::load(&self.offset[c]));
            let cand = (&neighbour(&ls0, j), &neighbour(&lm0, c));
            take_better(&mut best, (&mut ls, &mut lm), err, cand);
        }
        (ls, lm)
    }
}
