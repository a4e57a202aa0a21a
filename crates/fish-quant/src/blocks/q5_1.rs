//! Q5_1: 32 values as 5-bit codes `q` in 0..32, value = d * q + m; bits
//! packed as in Q5_0.

use super::q4_1::min_max;
use super::q5_0::{codes5, pack5};
use super::{BlockFormat, BlockQ8_1};
use crate::bits::F16Bits;
use bytemuck::{Pod, Zeroable};
use fish_gguf::GgmlType;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ5_1 {
    pub d: F16Bits,
    pub m: F16Bits,
    pub qh: [u8; 4],
    pub qs: [u8; 16],
}
const _: () = assert!(size_of::<BlockQ5_1>() == 24);

impl BlockFormat for BlockQ5_1 {
    const TYPE: GgmlType = GgmlType::Q5_1;
    const VALUES: usize = 32;
    type Act = BlockQ8_1;

    fn to_float(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        let m = self.m.to_f32();
        for (o, &q) in out.iter_mut().zip(&codes5(self.qh, &self.qs)) {
            *o = q as f32 * d + m;
        }
    }

    /// `d = (max - min) / 31`, `m = min`, codes truncated after `+ 0.5`.
    fn from_float(x: &[f32]) -> Self {
        let (min, max) = min_max(x);
        let d = (max - min) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let q: [u8; 32] = std::array::from_fn(|j| (((x[j] - min) * id + 0.5) as u8).min(31));
        let (qh, qs) = pack5(&q);
        Self {
            d: F16Bits::from_f32(d),
            m: F16Bits::from_f32(min),
            qh,
            qs,
        }
    }

    fn vec_dot(w: &[Self], a: &[BlockQ8_1]) -> f32 {
        let mut sum = 0.0f32;
        for (w, a) in w.iter().zip(a) {
            let q = codes5(w.qh, &w.qs);
            let sumi: i32 = q
                .iter()
                .zip(&a.qs)
                .map(|(&q, &a)| q as i32 * a as i32)
                .sum();
            sum += sumi as f32 * (w.d.to_f32() * a.d.to_f32()) + w.m.to_f32() * a.s.to_f32();
        }
        sum
    }

    fn best_vec_dot() -> super::VecDot<Self> {
        crate::simd::best_q5_1_dot()
    }
}
