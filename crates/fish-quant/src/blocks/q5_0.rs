//! Q5_0: 32 values as 5-bit codes `q` in 0..32, value = d * (q - 16).
//! Low nibbles as in Q4_0; bit j of the little-endian `qh` word is the
//! fifth bit of value j.

use super::q4_0::signed_abs_max;
use super::{BlockFormat, BlockQ8_0};
use crate::bits::F16Bits;
use bytemuck::{Pod, Zeroable};
use fish_gguf::GgmlType;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ5_0 {
    pub d: F16Bits,
    pub qh: [u8; 4],
    pub qs: [u8; 16],
}
const _: () = assert!(size_of::<BlockQ5_0>() == 22);

/// The 32 five-bit codes of a Q5_0/Q5_1 block.
#[inline(always)]
pub(crate) fn codes5(qh: [u8; 4], qs: &[u8; 16]) -> [u8; 32] {
    let h = u32::from_le_bytes(qh);
    let mut q = [0u8; 32];
    for j in 0..16 {
        q[j] = (qs[j] & 0x0f) | ((((h >> j) & 1) as u8) << 4);
        q[j + 16] = (qs[j] >> 4) | ((((h >> (j + 16)) & 1) as u8) << 4);
    }
    q
}

/// Packs 32 five-bit codes.
#[inline(always)]
pub(crate) fn pack5(q: &[u8; 32]) -> ([u8; 4], [u8; 16]) {
    let mut qs = [0u8; 16];
    let mut h = 0u32;
    for j in 0..16 {
        qs[j] = (q[j] & 0x0f) | ((q[j + 16] & 0x0f) << 4);
        h |= (((q[j] >> 4) & 1) as u32) << j;
        h |= (((q[j + 16] >> 4) & 1) as u32) << (j + 16);
    }
    (h.to_le_bytes(), qs)
}

impl BlockFormat for BlockQ5_0 {
    const TYPE: GgmlType = GgmlType::Q5_0;
    const VALUES: usize = 32;
    type Act = BlockQ8_0;

    fn to_float(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        for (o, &q) in out.iter_mut().zip(&codes5(self.qh, &self.qs)) {
            *o = (q as i32 - 16) as f32 * d;
        }
    }

    /// `d = max / -16` from the signed extreme, codes truncated after `+ 16.5`.
    fn from_float(x: &[f32]) -> Self {
        let d = signed_abs_max(x) / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let q: [u8; 32] = std::array::from_fn(|j| ((x[j] * id + 16.5) as i8).min(31) as u8);
        let (qh, qs) = pack5(&q);
        Self {
            d: F16Bits::from_f32(d),
            qh,
            qs,
        }
    }

    fn vec_dot(w: &[Self], a: &[BlockQ8_0]) -> f32 {
        let mut sum = 0.0f32;
        for (w, a) in w.iter().zip(a) {
            let q = codes5(w.qh, &w.qs);
            let sumi: i32 = q
                .iter()
                .zip(&a.qs)
                .map(|(&q, &a)| (q as i32 - 16) * a as i32)
                .sum();
            sum += sumi as f32 * (w.d.to_f32() * a.d.to_f32());
        }
        sum
    }

    fn best_vec_dot() -> super::VecDot<Self> {
        crate::simd::best_q5_0_dot()
    }
}
