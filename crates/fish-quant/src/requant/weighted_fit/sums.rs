//! Weighted sums of a super-block in the lane layout ([`super::super::lanes`]):
//! per group `Σw`, `Σwx`, `Σwx²` of the values and `Σwq`, `Σwq²`, `Σwqx` of
//! a set of codes. From them the weighted least-squares `(scale, offset)`
//! for fixed codes and its weighted error `Σ w (scale·q + offset − x)²` are
//! closed form, so ranking fits costs no pass over the values.

use crate::requant::lanes::{biased_code, round_code, zip, CodeSums, Lanes, Rows};
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
}

#[inline(always)]
pub(super) fn weighted_stats(x: &Rows, w: &Rows) -> WeightedStats {
    let (mut lo, mut hi) = ([f32::MAX; 8], [-f32::MAX; 8]);
    let (mut sw, mut swx, mut swx2) = ([0f32; 8], [0f32; 8], [0f32; 8]);
    for (row, wr) in x.iter().zip(w) {
        for g in 0..8 {
            lo[g] = lo[g].min(row[g]);
            hi[g] = hi[g].max(row[g]);
            let wx = wr[g] * row[g];
            sw[g] += wr[g];
            swx[g] += wx;
            swx2[g] = wx.mul_add(row[g], swx2[g]);
        }
    }
    WeightedStats {
        lo,
        hi,
        sw,
        swx,
        swx2,
    }
}

/// Weighted code sums `[Σwq, Σwq², Σwqx]` of the nearest codes
/// `q = round(clamp((x - offset) * inv, 0, nmax))`, for `K` fits in one
/// pass (independent accumulators).
#[inline(always)]
pub(super) fn weighted_code_sums<const K: usize>(
    x: &Rows,
    w: &Rows,
    offset: &[Lanes; K],
    inv: &[Lanes; K],
    nmax: f32,
) -> [CodeSums; K] {
    let shift: [Lanes; K] = std::array::from_fn(|k| zip(offset[k], inv[k], |o, i| -(o * i)));
    let mut sums = [[[0f32; 8]; 3]; K];
    for (row, wr) in x.iter().zip(w) {
        for k in 0..K {
            let [sl, sl2, sxl] = &mut sums[k];
            for g in 0..8 {
                let q = round_code(row[g].mul_add(inv[k][g], shift[k][g]), nmax);
                let wq = wr[g] * q;
                sl[g] += wq;
                sl2[g] = wq.mul_add(q, sl2[g]);
                sxl[g] = wq.mul_add(row[g], sxl[g]);
            }
        }
    }
    sums
}

/// [`weighted_code_sums`] of one fit, also returning the codes.
#[inline(always)]
pub(super) fn weighted_codes(
    x: &Rows,
    w: &Rows,
    offset: &Lanes,
    inv: &Lanes,
    nmax: f32,
) -> (LaneCodes, CodeSums) {
    let [sums] = weighted_code_sums(x, w, &[*offset], &[*inv], nmax);
    // The codes again in a loop of their own: fused with the sums above the
    // compiler splits the lanes into scalar pieces. The code sits in the low
    // mantissa bits of the biased value.
    let shift = zip(*offset, *inv, |o, i| -(o * i));
    let mut codes = [[0u32; 8]; 32];
    for (out, row) in codes.iter_mut().zip(x) {
        for g in 0..8 {
            out[g] = biased_code(row[g].mul_add(inv[g], shift[g]), nmax).to_bits() & 0xff;
        }
    }
    (codes, sums)
}

/// Scales at or above this are treated as failed fits (infinity and NaN
/// fail too).
const SCALE_LIMIT: f32 = 1.0e30;

/// The weighted least-squares `(scale, offset)` for fixed codes, the offset
/// clamped to `<= 0` (a positive one would need a negative min), and the
/// mask of groups where it is usable (a degenerate system or a
/// non-positive or non-finite scale is not).
#[inline(always)]
pub(super) fn weighted_least_squares<V: Vector>(
    stats: &WeightedStats,
    sums: &CodeSums,
) -> (V, V, V) {
    let (sl, sl2, sxl) = (V::load(&sums[0]), V::load(&sums[1]), V::load(&sums[2]));
    let (sw, sx, zero) = (V::load(&stats.sw), V::load(&stats.swx), V::splat(0.0));
    let det = sw.mul(sl2).sub(sl.mul(sl));
    let inv_det = V::splat(1.0).div(det);
    let s_free = sw.mul(sxl).sub(sx.mul(sl)).mul(inv_det);
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

/// The weighted error of fixed codes under many `(scale, offset)` pairs,
/// `Σwx² + s·(s·Σwq² − 2Σwqx) + m·(Σw·m − 2Σwx) + (2s·Σwq)·m`: the parts of
/// one scale or one offset are computed once.
pub(super) struct WeightedForm<V> {
    sx2: V,
    sl2: V,
    two_sxl: V,
    two_sx: V,
    two_sl: V,
    sw: V,
}

/// The parts of [`WeightedForm`] that depend on the scale only.
#[derive(Clone, Copy)]
pub(super) struct ScalePart<V> {
    square: V,
    cross: V,
}

impl<V: Vector> WeightedForm<V> {
    #[inline(always)]
    pub fn new(stats: &WeightedStats, sums: &CodeSums) -> Self {
        let two = V::splat(2.0);
        Self {
            sx2: V::load(&stats.swx2),
            sl2: V::load(&sums[1]),
            two_sxl: two.mul(V::load(&sums[2])),
            two_sx: two.mul(V::load(&stats.swx)),
            two_sl: two.mul(V::load(&sums[0])),
            sw: V::load(&stats.sw),
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
        m.mul(self.sw.mul(m).sub(self.two_sx))
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
