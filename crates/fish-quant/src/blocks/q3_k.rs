//! Q3_K: 256 values, value = d * (sc - 32) * (q - 4) with a 6-bit scale per
//! 16 values and 3-bit codes: two low bits laid out as in Q2_K, the third
//! bit of value `128n + 32j + l` is bit `4n + j` of `hmask[l]`. The sixteen
//! 6-bit scales are packed in 12 bytes: low nibbles of scales 0..8 in bytes
//! 0..8, of scales 8..16 in the high nibbles of bytes 0..8, and the top two
//! bits of scale j at bit `2 * (j / 4)` of byte `8 + j % 4`.

use super::kfit::fit_signed;
use super::q2_k::crumb_position;
use super::{BlockFormat, BlockQ8K, VecDot, QK_K};
use crate::bits::F16Bits;
use crate::round::nearest_int;
use bytemuck::{Pod, Zeroable};
use fish_gguf::GgmlType;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ3K {
    pub hmask: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 4],
    pub scales: [u8; 12],
    pub d: F16Bits,
}
const _: () = assert!(size_of::<BlockQ3K>() == 110);

impl BlockQ3K {
    /// The sixteen signed scales (-32..32).
    pub fn signed_scales(&self) -> [i8; 16] {
        std::array::from_fn(|j| {
            let low = if j < 8 {
                self.scales[j] & 0x0f
            } else {
                self.scales[j - 8] >> 4
            };
            let high = (self.scales[8 + j % 4] >> (2 * (j / 4))) & 3;
            (low | (high << 4)) as i8 - 32
        })
    }

    fn pack_scales(stored: &[u8; 16]) -> [u8; 12] {
        let mut p = [0u8; 12];
        for (j, &v) in stored.iter().enumerate() {
            if j < 8 {
                p[j] |= v & 0x0f;
            } else {
                p[j - 8] |= (v & 0x0f) << 4;
            }
            p[8 + j % 4] |= (v >> 4) << (2 * (j / 4));
        }
        p
    }

    /// The 256 codes (0..8, value `q - 4`) in value order.
    pub fn codes(&self) -> [u8; QK_K] {
        std::array::from_fn(|i| {
            let (byte, shift) = crumb_position(i);
            let (n, r) = (i / 128, i % 128);
            let high = (self.hmask[r % 32] >> (4 * n + r / 32)) & 1;
            ((self.qs[byte] >> shift) & 3) | (high << 2)
        })
    }
}

impl BlockFormat for BlockQ3K {
    const TYPE: GgmlType = GgmlType::Q3_K;
    const VALUES: usize = QK_K;
    type Act = BlockQ8K;

    fn to_float(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        let sc = self.signed_scales();
        let q = self.codes();
        for (i, o) in out.iter_mut().enumerate() {
            *o = d * sc[i / 16] as f32 * (q[i] as i32 - 4) as f32;
        }
    }

    fn from_float(x: &[f32]) -> Self {
        let mut codes = [0u8; QK_K];
        let mut scales = [0f32; 16];
        for g in 0..16 {
            scales[g] = fit_signed(&x[16 * g..16 * g + 16], 4, &mut codes[16 * g..16 * g + 16]);
        }
        let max_scale = super::q4_0::signed_abs_max(&scales);
        let mut b = Self::zeroed();
        let mut stored = [32u8; 16];
        if max_scale != 0.0 {
            let iscale = -32.0 / max_scale;
            b.d = F16Bits::from_f32(1.0 / iscale);
            for g in 0..16 {
                stored[g] = (nearest_int(iscale * scales[g]).clamp(-32, 31) + 32) as u8;
            }
        }
        b.scales = Self::pack_scales(&stored);
        let d = b.d.to_f32();
        for i in 0..QK_K {
            let dd = d * (stored[i / 16] as i32 - 32) as f32;
            let q = if dd == 0.0 {
                4
            } else {
                (nearest_int(x[i] / dd).clamp(-4, 3) + 4) as u8
            };
            let (byte, shift) = crumb_position(i);
            b.qs[byte] |= (q & 3) << shift;
            let (n, r) = (i / 128, i % 128);
            b.hmask[r % 32] |= (q >> 2) << (4 * n + r / 32);
        }
        b
    }

    /// Rounded as ggml's x86 kernel: 8 lanes of exact integer sums (lane
    /// `l` takes values `i` with `(i % 32) / 4 == l`, each product times its
    /// group scale), each scaled by `d_a * d_w` with one fused multiply-add
    /// per block into its own f32 lane, and the lanes summed pairwise at the
    /// end.
    fn vec_dot(w: &[Self], a: &[BlockQ8K]) -> f32 {
        let mut acc = [0f32; 8];
        for (w, a) in w.iter().zip(a) {
            let q = w.codes();
            let sc = w.signed_scales();
            let mut lanes = [0i32; 8];
            for i in 0..QK_K {
                let p = (q[i] as i32 - 4) * a.qs[i] as i32;
                lanes[(i % 32) / 4] += sc[i / 16] as i32 * p;
            }
            let d = a.d * w.d.to_f32();
            for (acc, lane) in acc.iter_mut().zip(lanes) {
                *acc = (lane as f32).mul_add(d, *acc);
            }
        }
        ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))
    }

    fn tiled_batch_vec_dot() -> Option<VecDot<Self>> {
        Some(tiled_batch_dot)
    }
}

/// Rounded as ggml's tiled K-quant matmul, which takes batches of 8 or more
/// tokens: per block the whole integer sum `sum_i sc[i / 16] * (q[i] - 4) *
/// a[i]`, converted to f32 and multiplied by `d_w`, then added to one
/// accumulator with a fused multiply-add by `d_a`, blocks in order.
fn tiled_batch_dot(w: &[BlockQ3K], a: &[BlockQ8K]) -> f32 {
    let mut acc = 0f32;
    for (w, a) in w.iter().zip(a) {
        let q = w.codes();
        let sc = w.signed_scales();
        let sum: i32 = (0..QK_K)
            .map(|i| sc[i / 16] as i32 * (q[i] as i32 - 4) * a.qs[i] as i32)
            .sum();
        acc = (sum as f32 * w.d.to_f32()).mul_add(a.d, acc);
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::acts::quantize_acts;
    use crate::blocks::{ActFormat, TILED_BATCH};

    fn wave(n: usize, seed: f32) -> Vec<f32> {
        (0..n)
            .map(|i| ((i as f32 * 0.37 + seed).sin() * 2.0).powi(3))
            .collect()
    }

    /// The rounding of ggml's tiled matmul, written group by group: exact
    /// integer sum per super-block, times `d_w`, fused-multiply-added by
    /// `d_a` into one accumulator.
    fn tiled_reference(w: &[BlockQ3K], a: &[BlockQ8K]) -> f32 {
        w.iter().zip(a).fold(0f32, |acc, (w, a)| {
            let (q, sc) = (w.codes(), w.signed_scales());
            let sum: i32 = (0..16)
                .map(|g| {
                    let group: i32 = (16 * g..16 * g + 16)
                        .map(|i| (q[i] as i32 - 4) * a.qs[i] as i32)
                        .sum();
                    sc[g] as i32 * group
                })
                .sum();
            (sum as f32 * w.d.to_f32()).mul_add(a.d, acc)
        })
    }

    /// Batches of `TILED_BATCH` tokens or more round as the tiled matmul,
    /// smaller ones as the row dot product, and the two differ somewhere.
    #[test]
    fn batches_round_as_the_tiled_matmul_from_eight_tokens() {
        let (n_in, n_out) = (256 * 6, 24);
        let w: Vec<BlockQ3K> = wave(n_in * n_out, 0.5)
            .chunks(QK_K)
            .map(BlockQ3K::from_float)
            .collect();
        let bpr = n_in / QK_K;
        let mut roundings_differ = false;
        for n_tok in [TILED_BATCH - 1, TILED_BATCH, 2 * TILED_BATCH + 3] {
            let x = wave(n_in * n_tok, 1.25);
            let acts = quantize_acts(GgmlType::Q8_K, &x, n_tok, n_in).unwrap();
            let a: &[BlockQ8K] = <BlockQ8K as ActFormat>::view(&acts.data).unwrap();
            let weights =
                crate::Weights::new(GgmlType::Q3_K, bytemuck::cast_slice(&w), n_in, n_out).unwrap();
            let mut y = vec![f32::NAN; n_out * n_tok];
            crate::matmul_quantized(weights, &acts, &mut y).unwrap();
            for t in 0..n_tok {
                for r in 0..n_out {
                    let (row, at) = (&w[r * bpr..(r + 1) * bpr], &a[t * bpr..(t + 1) * bpr]);
                    let tiled = tiled_reference(row, at);
                    let single = BlockQ3K::vec_dot(row, at);
                    let want = if n_tok >= TILED_BATCH { tiled } else { single };
                    let got = y[t * n_out + r];
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "{n_tok} tokens, token {t} row {r}"
                    );
                    roundings_differ |= tiled.to_bits() != single.to_bits();
                }
            }
        }
        assert!(roundings_differ, "the test cannot tell the roundings apart");
    }
}
