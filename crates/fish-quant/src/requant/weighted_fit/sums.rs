//! Weighted sums of a super-block in the lane layout ([`super::super::lanes`]):
//! per group `Σw`, `Σwx`, `Σwx²` of the values and `Σwq`, `Σwq²`, `Σwqx` of
//! a set of codes. From them the weighted least-squares `(scale, offset)`
//! for fixed codes and its weighted error `Σ w (scale·q + offset − x)²` are
//! closed form, so ranking fits costs no pass over the values.

use crate::requant::lanes::{zip, Clamp, CodeSums, Lanes, Moments, Rows, ROUND_MAGIC};
use crate::requant::lattice::LaneCodes;
use crate::requant::vector::Vector;

/// Per-group min and max of the values and their weighted moments.
#[derive(Clone, Copy, Default)]
pub(super) struct WeightedStats {
    pub lo: Lanes,
    pub hi: Lanes,
    /// `Σ w`.
    pub sw: Lanes,
    /// `Σ w x`.
    pub swx: Lanes,
    /// `Σ w x²`.
    pub swx2: Lanes,
    /// `Σ x` and `Σ x²` (unweighted: the plain error of the result).
    pub sx: Lanes,
    pub sx2: Lanes,
}

#[inline(always)]
pub(super) fn weighted_stats<V: Vector>(x: &Rows, w: &Rows) -> WeightedStats {
    let zero = V::splat(0.0);
    let (mut lo, mut hi) = (V::splat(f32::MAX), V::splat(-f32::MAX));
    let (mut sw, mut swx, mut swx2) = (zero, zero, zero);
    let (mut sx, mut sx2) = (zero, zero);
    for (row, wr) in x.iter().zip(w) {
        let (x, w) = (V::load(row), V::load(wr));
        // NaN values leave the min and max as they are.
        lo = x.min(lo);
        hi = x.max(hi);
        let wx = w.mul(x);
        sw = sw.add(w);
        swx = swx.add(wx);
        swx2 = wx.mul_add(x, swx2);
        sx = sx.add(x);
        sx2 = x.mul_add(x, sx2);
    }
    WeightedStats {
        lo: lo.store(),
        hi: hi.store(),
        sw: sw.store(),
        swx: swx.store(),
        swx2: swx2.store(),
        sx: sx.store(),
        sx2: sx2.store(),
    }
}

/// What a pass of nearest codes needs of each of `K` fits: its offset and
/// inverse scale per group.
#[derive(Clone, Copy)]
pub(super) struct PassOf<const K: usize> {
    pub offset: [Lanes; K],
    pub inv: [Lanes; K],
}

/// How the passes over the values of `P` super-blocks run (the fit's
/// lane-only steps stay per block).
pub(super) trait Passes {
    /// Per block, the weighted code sums of its `K` fits
    /// ([`weighted_code_sums`]).
    fn code_sums<const K: usize, const P: usize>(
        x: [&Rows; P],
        w: [&Rows; P],
        pass: &[PassOf<K>; P],
        clamps: &[Clamp; K],
        nmax: f32,
    ) -> [[CodeSums; K]; P];

    /// Per block, the codes of one fit (written into `codes`) and their
    /// weighted and plain sums ([`weighted_codes`]).
    fn codes<const P: usize>(
        x: [&Rows; P],
        w: [&Rows; P],
        pass: &[PassOf<1>; P],
        nmax: f32,
        codes: [&mut LaneCodes; P],
    ) -> [SumsOfCodes; P];
}

/// The weighted and the plain `[Σq, Σq², Σqx]` of a set of codes.
pub(super) type SumsOfCodes = (CodeSums, CodeSums);

/// Each block on its own in `V`'s eight lanes.
pub(super) struct Lanewise<V>(std::marker::PhantomData<V>);

impl<V: Vector> Passes for Lanewise<V> {
    #[inline(always)]
    fn code_sums<const K: usize, const P: usize>(
        x: [&Rows; P],
        w: [&Rows; P],
        pass: &[PassOf<K>; P],
        clamps: &[Clamp; K],
        nmax: f32,
    ) -> [[CodeSums; K]; P] {
        let mut out = [[[[0.0; 8]; 3]; K]; P];
        for p in 0..P {
            out[p] =
                weighted_code_sums::<V, K>(x[p], w[p], &pass[p].offset, &pass[p].inv, clamps, nmax);
        }
        out
    }

    #[inline(always)]
    fn codes<const P: usize>(
        x: [&Rows; P],
        w: [&Rows; P],
        pass: &[PassOf<1>; P],
        nmax: f32,
        codes: [&mut LaneCodes; P],
    ) -> [SumsOfCodes; P] {
        let mut out = [([[0.0; 8]; 3], [[0.0; 8]; 3]); P];
        for (p, codes) in codes.into_iter().enumerate() {
            let (offset, inv) = (&pass[p].offset[0], &pass[p].inv[0]);
            out[p] = weighted_codes::<V>(x[p], w[p], offset, inv, nmax, codes);
        }
        out
    }
}

/// Weighted code sums `[Σwq, Σwq², Σwqx]` of the nearest codes
/// `q = round(clamp((x - offset) * inv, 0, nmax))`, for `K` fits in one
/// pass (independent accumulators), in explicit vector operations; a clamp
/// the caller knows cannot bite is skipped (`clamps`, see [`Clamp`]).
#[inline(always)]
pub(super) fn weighted_code_sums<V: Vector, const K: usize>(
    x: &Rows,
    w: &Rows,
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
    for (row, wr) in x.iter().zip(w) {
        let (x, w) = (V::load(row), V::load(wr));
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
            let wq = w.mul(q);
            let [sl, sl2, sxl] = &mut acc[k];
            *sl = sl.add(wq);
            *sl2 = wq.mul_add(q, *sl2);
            *sxl = wq.mul_add(x, *sxl);
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

/// [`weighted_code_sums`] of one fit, also writing the codes into `codes`
/// (the code sits in the low mantissa bits of the biased value) and
/// returning their plain (unweighted) sums.
#[inline(always)]
pub(super) fn weighted_codes<V: Vector>(
    x: &Rows,
    w: &Rows,
    offset: &Lanes,
    inv: &Lanes,
    nmax: f32,
    codes: &mut LaneCodes,
) -> SumsOfCodes {
    let shift = V::load(&zip(*offset, *inv, |o, i| -(o * i)));
    let inv = V::load(inv);
    let (zero, ceiling, magic) = (V::splat(0.0), V::splat(nmax), V::splat(ROUND_MAGIC));
    let (mut sl, mut sl2, mut sxl) = (zero, zero, zero);
    let (mut pl, mut pl2, mut pxl) = (zero, zero, zero);
    for ((row, wr), out) in x.iter().zip(w).zip(codes.iter_mut()) {
        let (x, w) = (V::load(row), V::load(wr));
        let biased = x.mul_add(inv, shift).max(zero).min(ceiling).add(magic);
        *out = biased.low_byte();
        let q = biased.sub(magic);
        let wq = w.mul(q);
        sl = sl.add(wq);
        sl2 = wq.mul_add(q, sl2);
        sxl = wq.mul_add(x, sxl);
        pl = pl.add(q);
        pl2 = q.mul_add(q, pl2);
        pxl = q.mul_add(x, pxl);
    }
    (
        [sl.store(), sl2.store(), sxl.store()],
        [pl.store(), pl2.store(), pxl.store()],
    )
}

impl WeightedStats {
    /// The weighted moments, for the shared closed forms
    /// ([`least_squares`](crate::requant::lanes::least_squares),
    /// [`ErrorForm`](crate::requant::lanes::ErrorForm)).
    #[inline(always)]
    pub fn moments<V: Vector>(&self) -> Moments<V> {
        Moments {
            count: V::load(&self.sw),
            sx: V::load(&self.swx),
            sx2: V::load(&self.swx2),
        }
    }
}
