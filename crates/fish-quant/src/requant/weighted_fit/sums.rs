//! Weighted sums of a super-block in the lane layout ([`super::super::lanes`]):
//! per group `Σw`, `Σwx`, `Σwx²` of the values and `Σwq`, `Σwq²`, `Σwqx` of
//! a set of codes. From them the weighted least-squares `(scale, offset)`
//! for fixed codes and its weighted error `Σ w (scale·q + offset − x)²` are
//! closed form, so ranking fits costs no pass over the values.

use crate::requant::lanes::{biased_code, round_code, zip, CodeSums, Lanes, Moments, Rows};
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
