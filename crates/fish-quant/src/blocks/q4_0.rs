//! Q4_0: 32 values as 4-bit codes `q` in 0..16, value = d * (q - 8).
//! Byte j holds value j (low nibble) and value j + 16 (high nibble).

use super::{BlockFormat, BlockQ8_0};
use crate::bits::F16Bits;
use bytemuck::{Pod, Zeroable};
use fish_gguf::GgmlType;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ4_0 {
    pub d: F16Bits,
    pub qs: [u8; 16],
}
const _: () = assert!(size_of::<BlockQ4_0>() == 18);

/// The value of largest magnitude, with its sign.
#[inline(always)]
pub(crate) fn signed_abs_max(x: &[f32]) -> f32 {
    let mut amax = 0.0f32;
    let mut max = 0.0f32;
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

impl BlockQ4_0 {
    /// `sum (q - 8) * a` over the block, exact.
    fn block_sum(&self, a: &BlockQ8_0) -> i32 {
        let mut sumi = 0i32;
        for j in 0..16 {
            let lo = (self.qs[j] & 0x0f) as i32 - 8;
            let hi = (self.qs[j] >> 4) as i32 - 8;
            sumi += lo * a.qs[j] as i32 + hi * a.qs[j + 16] as i32;
        }
        sumi
    }
}

impl BlockFormat for BlockQ4_0 {
    const TYPE: GgmlType = GgmlType::Q4_0;
    const VALUES: usize = 32;
    type Act = BlockQ8_0;

    fn to_float(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        for (j, &b) in self.qs.iter().enumerate() {
            out[j] = ((b & 0x0f) as i32 - 8) as f32 * d;
            out[j + 16] = ((b >> 4) as i32 - 8) as f32 * d;
        }
    }

    /// `d = max / -8` from the signed extreme, codes truncated after `+ 8.5`.
    fn from_float(x: &[f32]) -> Self {
        let d = signed_abs_max(x) / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut qs = [0u8; 16];
        for (j, q) in qs.iter_mut().enumerate() {
            let lo = ((x[j] * id + 8.5) as i8).min(15) as u8;
            let hi = ((x[j + 16] * id + 8.5) as i8).min(15) as u8;
            *q = lo | (hi << 4);
        }
        Self {
            d: F16Bits::from_f32(d),
            qs,
        }
    }

    fn vec_dot(w: &[Self], a: &[BlockQ8_0]) -> f32 {
        let mut sum = 0.0f32;
        for (w, a) in w.iter().zip(a) {
            sum += w.block_sum(a) as f32 * (w.d.to_f32() * a.d.to_f32());
        }
        sum
    }

    /// ggml's x86 backend repacks Q4_0 matrices of 8k rows (AVX2 and up) and
    /// rounds once per block: `acc = fma(sum, d_w * d_a, acc)`.
    fn interleaved_vec_dot() -> Option<super::VecDot<Self>> {
        Some(|w, a| {
            let mut acc = 0.0f32;
            for (w, a) in w.iter().zip(a) {
                acc = (w.block_sum(a) as f32).mul_add(w.d.to_f32() * a.d.to_f32(), acc);
            }
            acc
        })
    }

    fn best_vec_dot() -> super::VecDot<Self> {
        crate::simd::best_q4_0_dot()
    }
}
