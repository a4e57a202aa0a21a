//! Q4_K: 256 values in eight groups of 32; value = d * sc * q - dmin * m
//! with 6-bit (sc, m) per group ([`super::kscales`]) and 4-bit codes.
//! Byte `32 * j + l` holds value `64 * j + l` (low nibble) and value
//! `64 * j + 32 + l` (high nibble).

use super::kfit::{quantize_affine_superblock, FitSearch, Importance};
use super::{kscales, BlockFormat, BlockQ8K, QK_K};
use crate::bits::F16Bits;
use bytemuck::{Pod, Zeroable};
use fish_gguf::GgmlType;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ4K {
    pub d: F16Bits,
    pub dmin: F16Bits,
    pub scales: [u8; 12],
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(size_of::<BlockQ4K>() == 144);

impl BlockQ4K {
    /// Encodes with the given fit effort (the trait's `from_float` uses the grid search).
    pub fn quantize(x: &[f32], search: FitSearch, importance: Importance) -> Self {
        let sb = quantize_affine_superblock(x, 15, search, importance);
        let mut qs = [0u8; QK_K / 2];
        for j in 0..4 {
            for l in 0..32 {
                qs[32 * j + l] = sb.codes[64 * j + l] | (sb.codes[64 * j + 32 + l] << 4);
            }
        }
        Self {
            d: sb.d,
            dmin: sb.dmin,
            scales: kscales::pack(&sb.scales, &sb.mins),
            qs,
        }
    }
}

impl BlockFormat for BlockQ4K {
    const TYPE: GgmlType = GgmlType::Q4_K;
    const VALUES: usize = QK_K;
    type Act = BlockQ8K;

    fn to_float(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        let dmin = self.dmin.to_f32();
        let (sc, m) = kscales::unpack(&self.scales);
        for j in 0..4 {
            let (d1, m1) = (d * sc[2 * j] as f32, dmin * m[2 * j] as f32);
            let (d2, m2) = (d * sc[2 * j + 1] as f32, dmin * m[2 * j + 1] as f32);
            for l in 0..32 {
                let b = self.qs[32 * j + l];
                out[64 * j + l] = d1 * (b & 0x0f) as f32 - m1;
                out[64 * j + 32 + l] = d2 * (b >> 4) as f32 - m2;
            }
        }
    }

    fn from_float(x: &[f32]) -> Self {
        let grid = FitSearch::Grid {
            offset: -1.0,
            steps: 20,
        };
        Self::quantize(x, grid, Importance::MagnitudePlusRms)
    }

    fn vec_dot(w: &[Self], a: &[BlockQ8K]) -> f32 {
        let mut sum = 0.0f32;
        for (w, a) in w.iter().zip(a) {
            let (sc, m) = kscales::unpack(&w.scales);
            let mut sumi = 0i32;
            for j in 0..4 {
                let (mut lo, mut hi) = (0i32, 0i32);
                for l in 0..32 {
                    let b = w.qs[32 * j + l];
                    lo += (b & 0x0f) as i32 * a.qs[64 * j + l] as i32;
                    hi += (b >> 4) as i32 * a.qs[64 * j + 32 + l] as i32;
                }
                sumi += sc[2 * j] as i32 * lo + sc[2 * j + 1] as i32 * hi;
            }
            let summ: i32 = (0..8)
                .map(|g| m[g] as i32 * (a.bsums[2 * g] as i32 + a.bsums[2 * g + 1] as i32))
                .sum();
            sum += a.d * w.d.to_f32() * sumi as f32 - a.d * w.dmin.to_f32() * summ as f32;
        }
        sum
    }

    fn best_vec_dot() -> super::VecDot<Self> {
        crate::simd::best_q4_k_dot()
    }
}
