//! Q4_1: 32 values as 4-bit codes `q` in 0..16, value = d * q + m.
//! Byte j holds value j (low nibble) and value j + 16 (high nibble).

use super::{BlockFormat, BlockQ8_1};
use crate::bits::F16Bits;
use bytemuck::{Pod, Zeroable};
use fish_gguf::GgmlType;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ4_1 {
    pub d: F16Bits,
    pub m: F16Bits,
    pub qs: [u8; 16],
}
const _: () = assert!(size_of::<BlockQ4_1>() == 20);

/// Smallest and largest value of `x`.
#[inline(always)]
pub(crate) fn min_max(x: &[f32]) -> (f32, f32) {
    x.iter()
        .fold((f32::MAX, -f32::MAX), |(lo, hi), &v| (lo.min(v), hi.max(v)))
}

impl BlockFormat for BlockQ4_1 {
    const TYPE: GgmlType = GgmlType::Q4_1;
    const VALUES: usize = 32;
    type Act = BlockQ8_1;

    fn to_float(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        let m = self.m.to_f32();
        for (j, &b) in self.qs.iter().enumerate() {
            out[j] = (b & 0x0f) as f32 * d + m;
            out[j + 16] = (b >> 4) as f32 * d + m;
        }
    }

    /// `d = (max - min) / 15`, `m = min`, codes truncated after `+ 0.5`.
    fn from_float(x: &[f32]) -> Self {
        let (min, max) = min_max(x);
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut qs = [0u8; 16];
        for (j, q) in qs.iter_mut().enumerate() {
            let lo = (((x[j] - min) * id + 0.5) as i8).min(15) as u8;
            let hi = (((x[j + 16] - min) * id + 0.5) as i8).min(15) as u8;
            *q = lo | (hi << 4);
        }
        Self {
            d: F16Bits::from_f32(d),
            m: F16Bits::from_f32(min),
            qs,
        }
    }

    fn vec_dot(w: &[Self], a: &[BlockQ8_1]) -> f32 {
        let mut sum = 0.0f32;
        for (w, a) in w.iter().zip(a) {
            let mut sumi = 0i32;
            for j in 0..16 {
                sumi += (w.qs[j] & 0x0f) as i32 * a.qs[j] as i32
                    + (w.qs[j] >> 4) as i32 * a.qs[j + 16] as i32;
            }
            sum += sumi as f32 * (w.d.to_f32() * a.d.to_f32()) + w.m.to_f32() * a.s.to_f32();
        }
        sum
    }

    fn best_vec_dot() -> super::VecDot<Self> {
        crate::simd::best_q4_1_dot()
    }
}
