//! Q2_K: 256 values, value = d * (sc & 15) * q - dmin * (sc >> 4) with a
//! 4-bit scale and min per 16 values and 2-bit codes. In each half n
//! (128 values), bits `2j..2j+2` of `qs[32n + l]` hold value
//! `128n + 32j + l`.

use super::kfit::{fit_scale_min, quantize_group_scales, FitSearch};
use super::{BlockFormat, BlockQ8K, VecDot, QK_K};
use crate::bits::F16Bits;
use crate::round::nearest_int;
use bytemuck::{Pod, Zeroable};
use fish_gguf::GgmlType;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ2K {
    pub scales: [u8; QK_K / 16],
    pub qs: [u8; QK_K / 4],
    pub d: F16Bits,
    pub dmin: F16Bits,
}
const _: () = assert!(size_of::<BlockQ2K>() == 84);

/// Position of value `i` in a 2-bit-per-value, 32-byte-per-half layout:
/// (byte, shift).
#[inline(always)]
pub(crate) fn crumb_position(i: usize) -> (usize, usize) {
    let (n, r) = (i / 128, i % 128);
    (32 * n + r % 32, 2 * (r / 32))
}

impl BlockQ2K {
    /// For each 128-value half: `sum_g (sc[g] & 15) * sum(q * a)` and
    /// `sum_g (sc[g] >> 4) * bsums[g]`, exact.
    fn half_sums(&self, a: &BlockQ8K) -> [(i32, i32); 2] {
        let q = self.codes();
        std::array::from_fn(|h| {
            let (mut sumi, mut summ) = (0i32, 0i32);
            for g in 8 * h..8 * h + 8 {
                let s: i32 = (0..16)
                    .map(|l| q[16 * g + l] as i32 * a.qs[16 * g + l] as i32)
                    .sum();
                sumi += (self.scales[g] & 0x0f) as i32 * s;
                summ += (self.scales[g] >> 4) as i32 * a.bsums[g] as i32;
            }
            (sumi, summ)
        })
    }

    /// The 256 codes (0..4) in value order.
    pub fn codes(&self) -> [u8; QK_K] {
        std::array::from_fn(|i| {
            let (byte, shift) = crumb_position(i);
            (self.qs[byte] >> shift) & 3
        })
    }
}

impl BlockFormat for BlockQ2K {
    const TYPE: GgmlType = GgmlType::Q2_K;
    const VALUES: usize = QK_K;
    type Act = BlockQ8K;

    fn to_float(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        let dmin = self.dmin.to_f32();
        let q = self.codes();
        for g in 0..16 {
            let sc = self.scales[g];
            let dl = d * (sc & 0x0f) as f32;
            let ml = dmin * (sc >> 4) as f32;
            for l in 0..16 {
                out[16 * g + l] = dl * q[16 * g + l] as f32 - ml;
            }
        }
    }

    fn from_float(x: &[f32]) -> Self {
        let mut codes = [0u8; QK_K];
        let mut scales = [0f32; 16];
        let mut mins = [0f32; 16];
        let search = FitSearch::Grid {
            offset: -0.5,
            steps: 15,
        };
        for g in 0..16 {
            let xg = &x[16 * g..16 * g + 16];
            let w: [f32; 16] = std::array::from_fn(|l| xg[l].abs());
            (scales[g], mins[g]) =
                fit_scale_min(xg, &w, 3, search, &mut codes[16 * g..16 * g + 16]);
        }
        let (d, ls) = quantize_group_scales(&scales, 15);
        let (dmin, lm) = quantize_group_scales(&mins, 15);
        let mut b = Self::zeroed();
        b.d = d;
        b.dmin = dmin;
        for g in 0..16 {
            b.scales[g] = ls[g] | (lm[g] << 4);
            let dd = d.to_f32() * ls[g] as f32;
            let dm = dmin.to_f32() * lm[g] as f32;
            for l in 0..16 {
                let i = 16 * g + l;
                let q = if dd == 0.0 {
                    0
                } else {
                    nearest_int((x[i] + dm) / dd).clamp(0, 3) as u8
                };
                let (byte, shift) = crumb_position(i);
                b.qs[byte] |= q << shift;
            }
        }
        b
    }

    /// Per block, the code sum and the min sum are exact integers; each is
    /// scaled and accumulated with one fused multiply-add into its own f32
    /// sum, and the two sums are subtracted once at the end. This is the
    /// rounding of ggml's interleaved Q2_K kernels, which llama.cpp runs on
    /// AVX-512 CPUs (rows in multiples of 8), one token at a time.
    fn vec_dot(w: &[Self], a: &[BlockQ8K]) -> f32 {
        let (mut sum, mut mins) = (0.0f32, 0.0f32);
        for (w, a) in w.iter().zip(a) {
            let [(s0, m0), (s1, m1)] = w.half_sums(a);
            sum = ((s0 + s1) as f32).mul_add(w.d.to_f32() * a.d, sum);
            mins = ((m0 + m1) as f32).mul_add(w.dmin.to_f32() * a.d, mins);
        }
        sum - mins
    }

    /// Tokens taken four at a time by those kernels are scaled and
    /// accumulated per 128-value half block.
    fn grouped_vec_dot() -> VecDot<Self> {
        |w, a| {
            let (mut sum, mut mins) = (0.0f32, 0.0f32);
            for (w, a) in w.iter().zip(a) {
                let (d, dmin) = (w.d.to_f32() * a.d, w.dmin.to_f32() * a.d);
                for (s, m) in w.half_sums(a) {
                    sum = (s as f32).mul_add(d, sum);
                    mins = (m as f32).mul_add(dmin, mins);
                }
            }
            sum - mins
        }
    }
}
