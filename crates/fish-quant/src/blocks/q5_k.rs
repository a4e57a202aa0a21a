//! Q5_K: as Q4_K with 5-bit codes. The low nibbles are laid out as in Q4_K;
//! bit `2j` of `qh[l]` is the fifth bit of value `64j + l`, bit `2j + 1`
//! that of value `64j + 32 + l`.

use super::kfit::{quantize_affine_superblock, FitSearch, Importance};
use super::{kscales, BlockFormat, BlockQ8K, QK_K};
use crate::bits::F16Bits;
use bytemuck::{Pod, Zeroable};
use fish_gguf::GgmlType;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ5K {
    pub d: F16Bits,
    pub dmin: F16Bits,
    pub scales: [u8; 12],
    pub qh: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(size_of::<BlockQ5K>() == 176);

impl BlockQ5K {
    /// The 256 codes (0..32) in value order.
    pub fn codes(&self) -> [u8; QK_K] {
        let mut q = [0u8; QK_K];
        for j in 0..4 {
            for l in 0..32 {
                let b = self.qs[32 * j + l];
                let h = self.qh[l];
                q[64 * j + l] = (b & 0x0f) | (((h >> (2 * j)) & 1) << 4);
                q[64 * j + 32 + l] = (b >> 4) | (((h >> (2 * j + 1)) & 1) << 4);
            }
        }
        q
    }
}

impl BlockFormat for BlockQ5K {
    const TYPE: GgmlType = GgmlType::Q5_K;
    const VALUES: usize = QK_K;
    type Act = BlockQ8K;

    fn to_float(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        let dmin = self.dmin.to_f32();
        let (sc, m) = kscales::unpack(&self.scales);
        let q = self.codes();
        for g in 0..8 {
            let (dg, mg) = (d * sc[g] as f32, dmin * m[g] as f32);
            for l in 0..32 {
                out[32 * g + l] = dg * q[32 * g + l] as f32 - mg;
            }
        }
    }

    fn from_float(x: &[f32]) -> Self {
        let grid = FitSearch::Grid {
            offset: -0.5,
            steps: 15,
        };
        let sb = quantize_affine_superblock(x, 31, grid, Importance::MagnitudePlusRms);
        let mut qs = [0u8; QK_K / 2];
        let mut qh = [0u8; QK_K / 8];
        for j in 0..4 {
            for l in 0..32 {
                let (lo, hi) = (sb.codes[64 * j + l], sb.codes[64 * j + 32 + l]);
                qs[32 * j + l] = (lo & 0x0f) | ((hi & 0x0f) << 4);
                qh[l] |= ((lo >> 4) << (2 * j)) | ((hi >> 4) << (2 * j + 1));
            }
        }
        Self {
            d: sb.d,
            dmin: sb.dmin,
            scales: kscales::pack(&sb.scales, &sb.mins),
            qh,
            qs,
        }
    }

    /// The rounding of ggml's AVX2 kernel, which the SIMD kernels share:
    /// eight i32 lanes (lane `k` sums bytes `4k..4k + 4` of every 32-value
    /// group, times its scale), each scaled per block into an f32 lane with
    /// a fused multiply-add and summed pairwise at the end; the min terms
    /// accumulated apart with a fused multiply-add.
    fn vec_dot(w: &[Self], a: &[BlockQ8K]) -> f32 {
        let mut acc = [0.0f32; 8];
        let mut mins = 0.0f32;
        for (w, a) in w.iter().zip(a) {
            let (sc, m) = kscales::unpack(&w.scales);
            let q = w.codes();
            let mut lanes = [0i32; 8];
            for g in 0..8 {
                for (k, lane) in lanes.iter_mut().enumerate() {
                    let s: i32 = (4 * k..4 * k + 4)
                        .map(|l| q[32 * g + l] as i32 * a.qs[32 * g + l] as i32)
                        .sum();
                    *lane += sc[g] as i32 * s;
                }
            }
            let summ: i32 = (0..8)
                .map(|g| m[g] as i32 * (a.bsums[2 * g] as i32 + a.bsums[2 * g + 1] as i32))
                .sum();
            let d = a.d * w.d.to_f32();
            for (acc, &lane) in acc.iter_mut().zip(&lanes) {
                *acc = d.mul_add(lane as f32, *acc);
            }
            mins = (a.d * w.dmin.to_f32()).mul_add(summ as f32, mins);
        }
        let quads: [f32; 4] = std::array::from_fn(|k| acc[k] + acc[k + 4]);
        let pairs = [quads[0] + quads[2], quads[1] + quads[3]];
        (pairs[0] + pairs[1]) - mins
    }

    fn best_vec_dot() -> super::VecDot<Self> {
        crate::simd::best_q5_k_dot()
    }
}
