//! From fitted per-group `(scale, min)` to the formats' 6-bit scales and
//! mins under f16 super-scales `d` and `dmin`, and the codes under them.
//! Errors of candidate pairs come from code sums (a quadratic form), so
//! ranking candidates costs no pass over the values once codes are fixed.

use super::lanes::{
    code_sums, each, inverse, quadratic_errors, round_code, zip, CodeSums, ErrorForm, GroupStats,
    Lanes, Rows, ROUND_MAGIC,
};
use super::vector::{round_levels, Vector};
use crate::bits::F16Bits;

/// Super-scales tried, as f16 steps (about 0.05-0.1% each) above
/// `max / 63`: a slightly larger `d` often rounds the other groups' scales
/// better than the one that makes the largest exactly 63.
const SUPER_SCALE_STEPS: [u16; 4] = [0, 8, 16, 32];

/// 6-bit levels per group, held as floats (small integers, exact) so every
/// comparison and blend stays a vector operation of the same width.
pub(super) type Levels = Lanes;

/// `quantize_group_scales(values, 63)` with the rounding of [`round_code`]
/// (the same integers for every input, NaN included), inlined into the
/// fit's SIMD context instead of a libm call per value.
#[inline(always)]
pub(super) fn group_scales_6bit(values: &Lanes) -> (F16Bits, [u8; 8]) {
    let max = values.iter().fold(0.0f32, |m, &v| m.max(v));
    if max <= 0.0 {
        return (F16Bits::from_f32(0.0), [0; 8]);
    }
    let inv = 63.0 / max;
    let ints = each(values, |v| round_code(inv * v, 63.0) as u8);
    (F16Bits::from_f32(max / 63.0), ints)
}

/// The value of non-negative f16 bits (inlined, unlike the `half` crate's
/// run-time dispatched conversion).
#[inline(always)]
pub(super) fn f16_magnitude(bits: u16) -> f32 {
    let (exp, man) = ((bits >> 10) & 0x1f, (bits & 0x3ff) as u32);
    match exp {
        0 => man as f32 * (1.0 / 16_777_216.0),
        31 => f32::INFINITY,
        _ => f32::from_bits(((exp as u32 + 112) << 23) | (man << 13)),
    }
}

/// Super-scales and the 6-bit levels to start the neighbour search from.
#[derive(Clone, Copy, Default)]
pub(super) struct Lattice {
    pub d: F16Bits,
    pub dmin: F16Bits,
    pub ls: Levels,
    pub lm: Levels,
    /// Each group's scale in units of `d`, before rounding.
    pub unrounded: Lanes,
}

impl Lattice {
    /// `(d, dmin)` as floats.
    #[inline(always)]
    pub fn supers(&self) -> (f32, f32) {
        (self.d.to_f32(), self.dmin.to_f32())
    }
}

/// The super-scales and 6-bit levels to start the neighbour search from:
/// `dmin` as `max(mins) / 63`; for each `d` of [`SUPER_SCALE_STEPS`], every
/// group's nearest 6-bit scale and the 6-bit min nearest the best offset
/// for it (codes fixed), ranked by the closed-form error summed over the
/// super-block.
#[inline(always)]
pub(super) fn super_scales<V: Vector>(
    stats: &GroupStats,
    sums: &CodeSums,
    scales: &Lanes,
    mins: &Lanes,
) -> Lattice {
    let (dmin, _) = group_scales_6bit(mins);
    let dminf = dmin.to_f32();
    let inv_dmin = if dminf > 0.0 { 1.0 / dminf } else { 0.0 };
    let inv_n = 1.0 / stats.n;
    let max = scales.iter().fold(0.0f32, |m, &v| m.max(v));
    let first = u16::from_le_bytes(F16Bits::from_f32(max / 63.0).0) & 0x7fff;
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
        let (sx, sl) = (V::load(&stats.sx), V::load(&sums[0]));
        let offset = sx.sub(s.mul(sl)).mul(V::splat(inv_n)).min(zero);
        lm[i] = round_levels(zero.sub(offset).mul(V::splat(inv_dmin)), 63.0);
        err[i] = quadratic_errors(stats, sums, s, zero.sub(lm[i].mul(V::splat(dminf))));
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
                ls[i].store(),
                unrounded[i].store(),
                lm[i].store(),
            );
        }
    }
    Lattice {
        d: F16Bits(best.1.to_le_bytes()),
        dmin,
        ls: best.2,
        lm: best.4,
        unrounded: best.3,
    }
}

/// Keeps, per group, the candidate levels `(sl, ml)` where `err` beats
/// `best`.
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

/// `levels + step - 1` (step 0, 1, 2: one below, the same, one above),
/// kept within 6 bits: at the ends the neighbour is the level itself, a
/// candidate already tried with the same error, so it changes nothing.
#[inline(always)]
pub(super) fn neighbour(levels: &Levels, step: usize) -> Levels {
    each(levels, |l| clamp_6bit(l + (step as f32 - 1.0)))
}

#[inline(always)]
fn clamp_6bit(l: f32) -> f32 {
    let l = if l > 0.0 { l } else { 0.0 };
    if l < 63.0 {
        l
    } else {
        63.0
    }
}

/// `d * level` per group.
#[inline(always)]
pub(super) fn scaled(d: f32, levels: &Levels) -> Lanes {
    each(levels, |l| d * l)
}

/// Rounding scale and min to 6 bits independently is rarely the best pair.
/// Two scale levels are tried, the rounded one and its neighbour on the
/// side of the unrounded value, each with one pass of nearest codes under
/// the rounded min; three mins each (the rounded one and both neighbours)
/// are ranked by the closed-form error of those codes.
#[inline(always)]
pub(super) fn nearest_pair<V: Vector>(
    rows: &Rows,
    stats: &GroupStats,
    (df, dminf): (f32, f32),
    (ls0, lm0): (Levels, Levels),
    unrounded: &Lanes,
    nmax: f32,
) -> (Levels, Levels) {
    let toward: Levels = zip(
        *unrounded,
        ls0,
        |u, l| if u > l { l + 1.0 } else { l - 1.0 },
    );
    let candidates = [ls0, toward];
    let scale = [scaled(df, &ls0), scaled(df, &toward)];
    let offset: [Lanes; 3] = std::array::from_fn(|c| scaled(-dminf, &neighbour(&lm0, c)));
    let inv = [inverse(&scale[0]), inverse(&scale[1])];
    let sums = code_sums::<V, 2>(rows, &[offset[1]; 2], &inv, nmax);
    let (mut ls, mut lm) = (ls0, lm0);
    let mut best = V::splat(f32::MAX);
    let offset = [
        V::load(&offset[0]),
        V::load(&offset[1]),
        V::load(&offset[2]),
    ];
    for j in 0..2 {
        let form = ErrorForm::new(stats.moments(), &sums[j]);
        let part = form.scale_part(V::load(&scale[j]));
        for c in 0..3 {
            let err = form.error(&part, form.offset_part(offset[c]), offset[c]);
            let cand = (&candidates[j], &neighbour(&lm0, c));
            take_better(&mut best, (&mut ls, &mut lm), err, cand);
        }
    }
    (ls, lm)
}

/// Codes in the fit's layout: `codes[i][g]` is the code of value `32g + i`.
pub(super) type LaneCodes = [[u32; 8]; 32];

/// The nearest codes `round(clamp((x - offset) * inv, 0, nmax))` and
/// their sums, in explicit vector operations (as plain loops over the
/// lanes, the compiler split this pass into scalar pieces).
#[inline(always)]
pub(super) fn nearest_codes<V: Vector>(
    rows: &Rows,
    offset: &Lanes,
    inv: &Lanes,
    nmax: f32,
) -> (LaneCodes, CodeSums) {
    let shift = V::load(&zip(*offset, *inv, |o, i| -(o * i)));
    let inv = V::load(inv);
    let (zero, ceiling, magic) = (V::splat(0.0), V::splat(nmax), V::splat(ROUND_MAGIC));
    let mut codes = [[0u32; 8]; 32];
    let (mut sl, mut sl2, mut sxl) = (zero, zero, zero);
    for (row, out) in rows.iter().zip(codes.iter_mut()) {
        let x = V::load(row);
        let biased = x.mul_add(inv, shift).max(zero).min(ceiling).add(magic);
        *out = biased.low_byte();
        let q = biased.sub(magic);
        sl = sl.add(q);
        sl2 = q.mul_add(q, sl2);
        sxl = q.mul_add(x, sxl);
    }
    (codes, [sl.store(), sl2.store(), sxl.store()])
}

/// The final step: nearest codes for `(ls0, lm0)`, then the pair among its
/// 3 x 3 neighbours with the smallest error for those same codes (the
/// middle one first, so ties keep it). The codes are kept as they are, so
/// the returned per-group errors are exact for what is stored.
#[inline(always)]
pub(super) fn settle<V: Vector>(
    rows: &Rows,
    stats: &GroupStats,
    (df, dminf): (f32, f32),
    (ls0, lm0): (Levels, Levels),
    nmax: f32,
) -> (Levels, Levels, LaneCodes, Lanes) {
    let scale: [Lanes; 3] = std::array::from_fn(|j| scaled(df, &neighbour(&ls0, j)));
    let offset: [Lanes; 3] = std::array::from_fn(|c| scaled(-dminf, &neighbour(&lm0, c)));
    let (codes, sums) = nearest_codes::<V>(rows, &offset[1], &inverse(&scale[1]), nmax);
    let (mut ls, mut lm) = (ls0, lm0);
    let mut best = V::splat(f32::MAX);
    let form = ErrorForm::new(stats.moments(), &sums);
    // Plain arrays, not `map` closures (see `lanes::each`).
    let parts = [
        form.scale_part(V::load(&scale[0])),
        form.scale_part(V::load(&scale[1])),
        form.scale_part(V::load(&scale[2])),
    ];
    let offset = [
        V::load(&offset[0]),
        V::load(&offset[1]),
        V::load(&offset[2]),
    ];
    let offset_parts = [
        form.offset_part(offset[0]),
        form.offset_part(offset[1]),
        form.offset_part(offset[2]),
    ];
    for c in [4, 0, 1, 2, 3, 5, 6, 7, 8] {
        let (j, c) = (c / 3, c % 3);
        let err = form.error(&parts[j], offset_parts[c], offset[c]);
        let cand = (&neighbour(&ls0, j), &neighbour(&lm0, c));
        take_better(&mut best, (&mut ls, &mut lm), err, cand);
    }
    // Rounding can leave a perfect fit a hair below zero.
    (ls, lm, codes, each(&best.store(), |e| e.max(0.0)))
}
