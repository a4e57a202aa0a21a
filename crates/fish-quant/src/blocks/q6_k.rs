//! Q6_K: 256 values, value = d * sc * (q - 32) with a signed 8-bit scale per
//! 16 values and 6-bit codes: four low bits in `ql`, two high bits in `qh`.
//! In each half n (128 values), `ql[64n + l]` holds values l (low nibble)
//! and 64 + l (high), `ql[64n + 32 + l]` values 32 + l and 96 + l, and
//! `qh[32n + l]` the high bits of l, 32 + l, 64 + l, 96 + l (2 bits each).

use super::kfit::fit_signed;
use super::{BlockFormat, BlockQ8K, QK_K};
use crate::bits::F16Bits;
use crate::round::nearest_int;
use bytemuck::{Pod, Zeroable};
use fish_gguf::GgmlType;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ6K {
    pub ql: [u8; QK_K / 2],
    pub qh: [u8; QK_K / 4],
    pub scales: [i8; QK_K / 16],
    pub d: F16Bits,
}
const _: () = assert!(size_of::<BlockQ6K>() == 210);

impl BlockQ6K {
    /// The 256 codes (0..64) in value order.
    pub fn codes(&self) -> [u8; QK_K] {
        let mut q = [0u8; QK_K];
        for n in 0..2 {
            let (ql, qh) = (&self.ql[64 * n..], &self.qh[32 * n..]);
            let out = &mut q[128 * n..];
            for l in 0..32 {
                out[l] = (ql[l] & 0x0f) | ((qh[l] & 3) << 4);
                out[l + 32] = (ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4);
                out[l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
                out[l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
            }
        }
        q
    }

    fn pack(q: &[u8; QK_K]) -> ([u8; QK_K / 2], [u8; QK_K / 4]) {
        let mut ql = [0u8; QK_K / 2];
        let mut qh = [0u8; QK_K / 4];
        for n in 0..2 {
            let c = &q[128 * n..];
            for l in 0..32 {
                ql[64 * n + l] = (c[l] & 0x0f) | ((c[l + 64] & 0x0f) << 4);
                ql[64 * n + 32 + l] = (c[l + 32] & 0x0f) | ((c[l + 96] & 0x0f) << 4);
                qh[32 * n + l] = (c[l] >> 4)
                    | ((c[l + 32] >> 4) << 2)
                    | ((c[l + 64] >> 4) << 4)
                    | ((c[l + 96] >> 4) << 6);
            }
        }
        (ql, qh)
    }
}

impl BlockFormat for BlockQ6K {
    const TYPE: GgmlType = GgmlType::Q6_K;
    const VALUES: usize = QK_K;
    type Act = BlockQ8K;

    fn to_float(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        let q = self.codes();
        for (i, (o, &q)) in out.iter_mut().zip(&q).enumerate() {
            *o = d * self.scales[i / 16] as f32 * (q as i32 - 32) as f32;
        }
    }

    /// Signed scale per 16 values (19-point search, weights x²), then the
    /// scales as i8 under `d = max_scale / -128`.
    fn from_float(x: &[f32]) -> Self {
        let mut codes = [0u8; QK_K];
        let mut scales = [0f32; 16];
        for g in 0..16 {
            scales[g] = fit_signed(&x[16 * g..16 * g + 16], 32, &mut codes[16 * g..16 * g + 16]);
        }
        let max_scale = super::q4_0::signed_abs_max(&scales);
        let mut b = Self::zeroed();
        if max_scale == 0.0 {
            codes.fill(32);
            (b.ql, b.qh) = Self::pack(&codes);
            return b;
        }
        let iscale = -128.0 / max_scale;
        b.d = F16Bits::from_f32(1.0 / iscale);
        let d = b.d.to_f32();
        for g in 0..16 {
            let sc = nearest_int(iscale * scales[g]).min(127) as i8;
            b.scales[g] = sc;
            let dd = d * sc as f32;
            for l in 0..16 {
                let i = 16 * g + l;
                codes[i] = if dd == 0.0 {
                    32
                } else {
                    (nearest_int(x[i] / dd).clamp(-32, 31) + 32) as u8
                };
            }
        }
        (b.ql, b.qh) = Self::pack(&codes);
        b
    }

    fn vec_dot(w: &[Self], a: &[BlockQ8K]) -> f32 {
        let mut sum = 0.0f32;
        for (w, a) in w.iter().zip(a) {
            let q = w.codes();
            let mut sumi = 0i32;
            for g in 0..16 {
                let s: i32 = (0..16)
                    .map(|l| (q[16 * g + l] as i32 - 32) * a.qs[16 * g + l] as i32)
                    .sum();
                sumi += w.scales[g] as i32 * s;
            }
            sum += a.d * w.d.to_f32() * sumi as f32;
        }
        sum
    }

    fn best_vec_dot() -> super::VecDot<Self> {
        crate::simd::best_q6_k_dot()
    }
}
