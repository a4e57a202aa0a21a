//! The eight groups of 32 values of a super-block side by side: every
//! `Lanes` holds one number per group, row `i` of a super-block holds value
//! `i` of each group, so each step of the fit is one 8-wide vector operation
//! with no horizontal sums and no per-group branches. Every lane follows the
//! same IEEE operations in the same order whatever the vector width, so the
//! AVX2 build and the portable build give the same bytes.

use super::vector::Vector;

/// One number per group.
pub(super) type Lanes = [f32; 8];
/// A super-block as 32 rows of [`Lanes`].
pub(super) type Rows = [Lanes; 32];

/// Adding then subtracting 1.5 * 2^23 rounds a float in [0, 2^22) to the
/// nearest integer, ties to even, without a libm call; in between, the
/// integer sits in the low mantissa bits of the sum.
pub(super) const ROUND_MAGIC: f32 = 12_582_912.0;

/// `t` clamped to `[0, nmax]` (NaN becomes 0) and biased by
/// [`ROUND_MAGIC`], which rounds it.
#[inline(always)]
pub(super) fn biased_code(t: f32, nmax: f32) -> f32 {
    // Written as comparisons (not f32::max/min, whose NaN rule costs extra
    // instructions) so each maps to one vector max/min.
    let t = if t > 0.0 { t } else { 0.0 };
    let t = if t < nmax { t } else { nmax };
    t + ROUND_MAGIC
}

/// The nearest code in `0..=nmax` to `t`, as a float.
#[inline(always)]
pub(super) fn round_code(t: f32, nmax: f32) -> f32 {
    biased_code(t, nmax) - ROUND_MAGIC
}

/// `f` applied lane by lane.
#[inline(always)]
pub(super) fn zip(a: Lanes, b: Lanes, f: impl Fn(f32, f32) -> f32) -> Lanes {
    let mut out = [0f32; 8];
    for g in 0..8 {
        out[g] = f(a[g], b[g]);
    }
    out
}

/// `f` applied lane by lane (a plain loop: `<[T; N]>::map` is not always
/// inlined, and a call leaves the fit's SIMD context).
#[inline(always)]
pub(super) fn each<T: Copy, U: Copy + Default>(a: &[T; 8], f: impl Fn(T) -> U) -> [U; 8] {
    let mut out = [U::default(); 8];
    for g in 0..8 {
        out[g] = f(a[g]);
    }
    out
}

/// `1 / v` per lane, 0 for 0.
#[inline(always)]
pub(super) fn inverse(v: &Lanes) -> Lanes {
    each(v, |s| if s != 0.0 { 1.0 / s } else { 0.0 })
}

/// Row `i` lane `g` is value `32 * g + i`.
#[inline(always)]
pub(super) fn transpose_portable(x: &[f32; 256]) -> Rows {
    std::array::from_fn(|i| std::array::from_fn(|g| x[32 * g + i]))
}

/// [`transpose_portable`] as four 8 x 8 register transposes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
pub(super) unsafe fn transpose_avx2(x: &[f32; 256]) -> Rows {
    use std::arch::x86_64::*;
    let mut rows = [[0f32; 8]; 32];
    for b in 0..4 {
        let mut v = [_mm256_setzero_ps(); 8];
        for (g, v) in v.iter_mut().enumerate() {
            // SAFETY: 32 * g + 8 * b + 8 <= 256 for g < 8, b < 4.
            *v = unsafe { _mm256_loadu_ps(x.as_ptr().add(32 * g + 8 * b)) };
        }
        // SAFETY: AVX2 is enabled in this function's context.
        let t = unsafe { super::vector::transpose8(v) };
        for (i, t) in t.into_iter().enumerate() {
            // SAFETY: rows[8b + i] is 8 floats.
            unsafe { _mm256_storeu_ps(rows[8 * b + i].as_mut_ptr(), t) };
        }
    }
    rows
}

/// Per-group count, sum and sum of squares, min and max of the values.
#[derive(Clone, Copy, Default)]
pub(super) struct GroupStats {
    pub n: f32,
    pub lo: Lanes,
    pub hi: Lanes,
    pub sx: Lanes,
    pub sx2: Lanes,
}

impl GroupStats {
    #[inline(always)]
    pub fn moments<V: Vector>(&self) -> Moments<V> {
        Moments {
            count: V::splat(self.n),
            sx: V::load(&self.sx),
            sx2: V::load(&self.sx2),
        }
    }
}

/// What the closed forms ([`least_squares`], [`ErrorForm`]) need of a
/// group's values: their count, Σx and Σx², or, for the weighted fit, Σw,
/// Σwx and Σwx² (the same formulas with every value weighted).
#[derive(Clone, Copy)]
pub(super) struct Moments<V> {
    pub count: V,
    pub sx: V,
    pub sx2: V,
}

/// Scales at or above this are treated as failed fits (infinity and NaN
/// fail too).
const SCALE_LIMIT: f32 = 1.0e30;

/// The closed-form least-squares `(scale, offset)` for fixed codes, with
/// the offset clamped to `<= 0` (a positive one would need a negative min,
/// which the formats cannot hold), and the mask of groups where it is
/// usable: a degenerate system or a non-positive or non-finite scale is
/// not.
#[inline(always)]
pub(super) fn least_squares<V: Vector>(moments: Moments<V>, sums: &CodeSums) -> (V, V, V) {
    let (sl, sl2, sxl) = (V::load(&sums[0]), V::load(&sums[1]), V::load(&sums[2]));
    let (n, sx, zero) = (moments.count, moments.sx, V::splat(0.0));
    let det = n.mul(sl2).sub(sl.mul(sl));
    let inv_det = V::splat(1.0).div(det);
    let s_free = n.mul(sxl).sub(sx.mul(sl)).mul(inv_det);
    let m = sl2.mul(sx).sub(sl.mul(sxl)).mul(inv_det);
    let s_through_zero = sxl.div(sl2);
    let clamp_min = m.gt(zero);
    let scale = clamp_min.select(s_through_zero, s_free);
    let offset = clamp_min.select(zero, m);
    let usable = det
        .gt(zero)
        .and(scale.gt(zero))
        .and(scale.lt(V::splat(SCALE_LIMIT)));
    (scale, offset, usable)
}

#[inline(always)]
pub(super) fn group_stats<V: Vector>(rows: &Rows) -> GroupStats {
    let zero = V::splat(0.0);
    let (mut lo, mut hi) = (V::splat(f32::MAX), V::splat(-f32::MAX));
    let (mut sx, mut sx2) = (zero, zero);
    for row in rows {
        let x = V::load(row);
        // NaN values leave the min and max as they are.
        lo = x.min(lo);
        hi = x.max(hi);
        sx = sx.add(x);
        sx2 = x.mul_add(x, sx2);
    }
    GroupStats {
        n: rows.len() as f32,
        lo: lo.store(),
        hi: hi.store(),
        sx: sx.store(),
        sx2: sx2.store(),
    }
}

/// Per-group `[sum q, sum q², sum q·x]`.
pub(super) type CodeSums = [Lanes; 3];

/// How a pass of nearest codes bounds `t = (x - offset) * inv` before
/// rounding it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Clamp {
    /// To `[0, nmax]`.
    Both,
    /// To `<= nmax` only: `t` is known to be at least 0 (up to rounding far
    /// below one half).
    Ceiling,
    /// Not at all: `t` is known to lie in `[0, nmax]` (as above).
    Neither,
}

/// The clamps a pass of nearest codes needs for fits whose offset is the
/// group's min (clamped to `<= 0`) and whose scale is
/// `range / (nmax + stretch[k])`: `t` is then at least 0 (up to rounding
/// far below one half), and at most `nmax` (plus as little) where the
/// stretch is not positive.
#[inline(always)]
pub(super) fn clamps_from_min<const K: usize>(stretch: &[f32; K]) -> [Clamp; K] {
    std::array::from_fn(|k| {
        if stretch[k] > 0.0 {
            Clamp::Ceiling
        } else {
            Clamp::Neither
        }
    })
}

/// [`code_sums`] for fits whose offset is the group's min (clamped to
/// `<= 0`) and whose scale is `range / (nmax + stretch[k])`: every `t` is
/// then at least 0 (up to rounding far below one half), and at most `nmax`
/// (plus as little) where the stretch is not positive, so those clamps are
/// skipped; the codes are the same.
#[inline(always)]
pub(super) fn code_sums_from_min<V: Vector, const K: usize>(
    rows: &Rows,
    min: &Lanes,
    inv: &[Lanes; K],
    stretch: &[f32; K],
    nmax: f32,
) -> [CodeSums; K] {
    sums_of_nearest_codes::<V, K>(rows, &[*min; K], inv, &clamps_from_min(stretch), nmax)
}

/// Code sums of the nearest codes
/// `q = round(clamp((x - offset) * inv, 0, nmax))`, for `K` fits at once
/// (independent accumulators, so the adds do not wait on each other).
#[inline(always)]
pub(super) fn code_sums<V: Vector, const K: usize>(
    rows: &Rows,
    offset: &[Lanes; K],
    inv: &[Lanes; K],
    nmax: f32,
) -> [CodeSums; K] {
    sums_of_nearest_codes::<V, K>(rows, offset, inv, &[Clamp::Both; K], nmax)
}

/// The pass behind [`code_sums`] in explicit vector operations.
#[inline(always)]
fn sums_of_nearest_codes<V: Vector, const K: usize>(
    rows: &Rows,
    offset: &[Lanes; K],
    inv: &[Lanes; K],
    clamps: &[Clamp; K],
    nmax: f32,
) -> [CodeSums; K] {
    // Plain loops, not `array::from_fn` closures: a closure that is not
    // inlined is compiled without the caller's target features.
    let (mut shift, mut inv_v) = ([V::splat(0.0); K], [V::splat(0.0); K]);
    for k in 0..K {
        shift[k] = V::load(&zip(offset[k], inv[k], |o, i| -(o * i)));
        inv_v[k] = V::load(&inv[k]);
    }
    let inv = inv_v;
    let (zero, ceiling, magic) = (V::splat(0.0), V::splat(nmax), V::splat(ROUND_MAGIC));
    let mut acc = [[zero; 3]; K];
    for row in rows {
        let x = V::load(row);
        for k in 0..K {
            let t = x.mul_add(inv[k], shift[k]);
            let t = if clamps[k] == Clamp::Both {
                t.max(zero)
            } else {
                t
            };
            let t = if clamps[k] != Clamp::Neither {
                t.min(ceiling)
            } else {
                t
            };
            let q = t.add(magic).sub(magic);
            let [sl, sl2, sxl] = &mut acc[k];
            *sl = sl.add(q);
            *sl2 = q.mul_add(q, *sl2);
            *sxl = q.mul_add(x, *sxl);
        }
    }
    let mut sums = [[[0f32; 8]; 3]; K];
    for k in 0..K {
        for i in 0..3 {
            sums[k][i] = acc[k][i].store();
        }
    }
    sums
}

/// Squared error `sum (scale * q + offset - x)²` per group from the code
/// sums and the groups' value sums: exact for those codes, no pass over the
/// values.
#[inline(always)]
pub(super) fn quadratic_errors<V: Vector>(
    stats: &GroupStats,
    sums: &CodeSums,
    scale: V,
    offset: V,
) -> V {
    let (sl, sl2, sxl) = (V::load(&sums[0]), V::load(&sums[1]), V::load(&sums[2]));
    let (sx, sx2, n) = (V::load(&stats.sx), V::load(&stats.sx2), V::splat(stats.n));
    let (s, m, two) = (scale, offset, V::splat(2.0));
    sx2.sub(two.mul(s).mul(sxl))
        .sub(two.mul(m).mul(sx))
        .add(s.mul(s).mul(sl2))
        .add(two.mul(s).mul(m).mul(sl))
        .add(n.mul(m).mul(m))
}

/// [`quadratic_errors`] for many `(scale, offset)` pairs of the same codes,
/// as `sx2 + s·(s·Σq² − 2Σqx) + m·(n·m − 2Σx) + (2s·Σq)·m` (weighted alike
/// from weighted moments): the parts of
/// one scale or one offset are computed once, each pair then costs four
/// operations.
pub(super) struct ErrorForm<V> {
    sx2: V,
    sl2: V,
    two_sxl: V,
    two_sx: V,
    two_sl: V,
    count: V,
}

/// The parts of [`ErrorForm`] that depend on the scale only.
#[derive(Clone, Copy)]
pub(super) struct ScalePart<V> {
    square: V,
    cross: V,
}

impl<V: Vector> ErrorForm<V> {
    #[inline(always)]
    pub fn new(moments: Moments<V>, sums: &CodeSums) -> Self {
        let two = V::splat(2.0);
        Self {
            sx2: moments.sx2,
            sl2: V::load(&sums[1]),
            two_sxl: two.mul(V::load(&sums[2])),
            two_sx: two.mul(moments.sx),
            two_sl: two.mul(V::load(&sums[0])),
            count: moments.count,
        }
    }

    #[inline(always)]
    pub fn scale_part(&self, s: V) -> ScalePart<V> {
        ScalePart {
            square: s.mul(s.mul(self.sl2).sub(self.two_sxl)),
            cross: self.two_sl.mul(s),
        }
    }

    #[inline(always)]
    pub fn offset_part(&self, m: V) -> V {
        m.mul(self.count.mul(m).sub(self.two_sx))
    }

    #[inline(always)]
    pub fn error(&self, s: &ScalePart<V>, offset_part: V, m: V) -> V {
        self.sx2.add(s.square).add(offset_part).add(s.cross.mul(m))
    }

    /// The error of one pair.
    #[inline(always)]
    pub fn error_of(&self, s: V, m: V) -> V {
        self.error(&self.scale_part(s), self.offset_part(m), m)
    }
}
