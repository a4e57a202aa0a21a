//! Q8_0: 32 signed bytes under one f16 scale. Both a weight format and the
//! activation format of Q4_0, Q5_0 and Q8_0 weights.

use super::{ActFormat, BlockFormat};
use crate::bits::F16Bits;
use crate::round::round_half_away;
use bytemuck::{Pod, Zeroable};
use fish_gguf::GgmlType;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ8_0 {
    pub d: F16Bits,
    pub qs: [i8; 32],
}
const _: () = assert!(size_of::<BlockQ8_0>() == 34);

/// Largest magnitude in `x`.
#[inline(always)]
pub(crate) fn abs_max(x: &[f32]) -> f32 {
    x.iter().fold(0.0f32, |m, v| m.max(v.abs()))
}

/// Activation scheme of the x86 CPU path: `d = amax / 127` is stored, the
/// values are multiplied by `127 / amax` and rounded to nearest-even.
#[inline(always)]
pub(crate) fn quantize_act_block(x: &[f32], qs: &mut [i8; 32]) -> f32 {
    let amax = abs_max(x);
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    for (q, &v) in qs.iter_mut().zip(x) {
        *q = (v * id).round_ties_even() as i8;
    }
    d
}

/// Integer dot product of two 32-byte blocks.
#[inline(always)]
pub(crate) fn dot_i8(a: &[i8; 32], b: &[i8; 32]) -> i32 {
    a.iter().zip(b).map(|(&a, &b)| a as i32 * b as i32).sum()
}

impl BlockFormat for BlockQ8_0 {
    const TYPE: GgmlType = GgmlType::Q8_0;
    const VALUES: usize = 32;
    type Act = BlockQ8_0;

    fn to_float(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        for (o, &q) in out.iter_mut().zip(&self.qs) {
            *o = q as f32 * d;
        }
    }

    /// The file-format quantiser: `d = amax / 127`, `q = round(x / d)` with
    /// ties away from zero.
    fn from_float(x: &[f32]) -> Self {
        let d = abs_max(x) / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut qs = [0i8; 32];
        for (q, &v) in qs.iter_mut().zip(x) {
            *q = round_half_away(v * id) as i8;
        }
        Self {
            d: F16Bits::from_f32(d),
            qs,
        }
    }

    fn vec_dot(w: &[Self], a: &[Self]) -> f32 {
        let mut sum = 0.0f32;
        for (w, a) in w.iter().zip(a) {
            sum += dot_i8(&w.qs, &a.qs) as f32 * (w.d.to_f32() * a.d.to_f32());
        }
        sum
    }

    fn best_vec_dot() -> super::VecDot<Self> {
        crate::simd::best_q8_0_dot()
    }
}

impl ActFormat for BlockQ8_0 {
    const TYPE: GgmlType = GgmlType::Q8_0;
    const VALUES: usize = 32;

    fn quantize_acts(x: &[f32], out: &mut [Self]) {
        for (b, x) in out.iter_mut().zip(x.chunks_exact(32)) {
            let d = quantize_act_block(x, &mut b.qs);
            b.d = F16Bits::from_f32(d);
        }
    }

    crate::acts::act_storage!(Q8_0);
}
