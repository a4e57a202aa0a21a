//! FQ3: the project's own 3-bit layout for re-quantised GPU weights.
//!
//! 112 bytes per 256 values: f16 `d`, f16 `dmin`, the 12-byte 6-bit
//! scale/min packing of Q4_K, then for each group of 32 values three
//! little-endian u32 words A, B, C. Values `4s .. 4s + 3` of a group
//! (s in 0..8) are the four bytes of
//! `((s < 4 ? A : B) >> 2 * (s & 3)) & 0x03030303 | ((C >> s) & 0x01010101) << 2`,
//! so a shader builds four codes with two masks; value = d * sc * q - dmin * m
//! with q in 0..8. See docs/QUANT.md for a worked example.

use crate::bits::F16Bits;
use crate::blocks::kfit::{quantize_affine_superblock, AffineSuperBlock, FitSearch, Importance};
use crate::blocks::{kscales, QK_K};
use crate::error::QuantError;
use bytemuck::{Pod, Zeroable};

/// Values per FQ3 block.
pub const FQ3_BLOCK_VALUES: usize = QK_K;
/// Bytes per FQ3 block.
pub const FQ3_BLOCK_BYTES: usize = 112;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockFq3 {
    pub d: F16Bits,
    pub dmin: F16Bits,
    pub scales: [u8; 12],
    /// Per group of 32 values: the words A, B, C (little-endian).
    pub words: [u8; 96],
}
const _: () = assert!(size_of::<BlockFq3>() == FQ3_BLOCK_BYTES);

/// The words (A, B, C) of group `g`.
#[inline(always)]
fn group_words(words: &[u8; 96], g: usize) -> [u32; 3] {
    std::array::from_fn(|i| {
        let o = 12 * g + 4 * i;
        u32::from_le_bytes([words[o], words[o + 1], words[o + 2], words[o + 3]])
    })
}

/// The 32 codes (0..8) of one group, from its words.
#[inline(always)]
pub fn unpack_group([a, b, c]: [u32; 3]) -> [u8; 32] {
    let mut q = [0u8; 32];
    for s in 0..8 {
        let low = if s < 4 { a } else { b };
        let four = ((low >> (2 * (s & 3))) & 0x0303_0303) | (((c >> s) & 0x0101_0101) << 2);
        q[4 * s..4 * s + 4].copy_from_slice(&four.to_le_bytes());
    }
    q
}

/// The words (A, B, C) holding 32 codes (each `< 8`).
pub fn pack_group(q: &[u8; 32]) -> [u32; 3] {
    let (mut a, mut b, mut c) = (0u32, 0u32, 0u32);
    for (v, &code) in q.iter().enumerate() {
        let (s, k) = (v / 4, v % 4);
        let low = ((code & 3) as u32) << (8 * k + 2 * (s & 3));
        if s < 4 {
            a |= low;
        } else {
            b |= low;
        }
        c |= (((code >> 2) & 1) as u32) << (8 * k + s);
    }
    [a, b, c]
}

impl BlockFq3 {
    /// Least-squares (scale, min) per group of 32, then 6-bit scales and
    /// mins under f16 super-scales, then codes against the stored scales.
    pub fn quantize(x: &[f32]) -> Self {
        let sb = quantize_affine_superblock(
            x,
            7,
            FitSearch::Grid {
                offset: -1.0,
                steps: 20,
            },
            Importance::Uniform,
        );
        Self::from_superblock(&sb)
    }

    /// Packs a fitted super-block (codes in `0..8`).
    pub(crate) fn from_superblock(sb: &AffineSuperBlock) -> Self {
        let mut words = [0u8; 96];
        for g in 0..8 {
            let codes: &[u8; 32] = sb.codes[32 * g..32 * g + 32]
                .try_into()
                .expect("a group is 32 codes");
            for (i, w) in pack_group(codes).into_iter().enumerate() {
                words[12 * g + 4 * i..12 * g + 4 * i + 4].copy_from_slice(&w.to_le_bytes());
            }
        }
        Self {
            d: sb.d,
            dmin: sb.dmin,
            scales: kscales::pack(&sb.scales, &sb.mins),
            words,
        }
    }

    /// Decodes 256 values into `out`.
    pub fn to_float(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        let dmin = self.dmin.to_f32();
        for g in 0..8 {
            let (sc, m) = kscales::get(&self.scales, g);
            let (dg, mg) = (d * sc as f32, dmin * m as f32);
            let q = unpack_group(group_words(&self.words, g));
            for (o, &q) in out[32 * g..32 * g + 32].iter_mut().zip(&q) {
                *o = dg * q as f32 - mg;
            }
        }
    }
}

fn check_row(n_values: usize, bytes: usize) -> Result<(), QuantError> {
    if !n_values.is_multiple_of(FQ3_BLOCK_VALUES) {
        return Err(QuantError::BadLength {
            what: "FQ3 values (multiple of 256)",
            expected: n_values.next_multiple_of(FQ3_BLOCK_VALUES),
            got: n_values,
        });
    }
    let expected = n_values / FQ3_BLOCK_VALUES * FQ3_BLOCK_BYTES;
    if bytes != expected {
        return Err(QuantError::BadLength {
            what: "FQ3 bytes",
            expected,
            got: bytes,
        });
    }
    Ok(())
}

/// Quantises `src` (a multiple of 256 values) into `dst` (112 bytes per 256).
pub fn quantize_row_fq3(src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    check_row(src.len(), dst.len())?;
    let blocks: &mut [BlockFq3] = bytemuck::cast_slice_mut(dst);
    for (b, x) in blocks.iter_mut().zip(src.chunks_exact(FQ3_BLOCK_VALUES)) {
        *b = BlockFq3::quantize(x);
    }
    Ok(())
}

/// Decodes `dst.len()` values from FQ3 bytes.
pub fn dequant_row_fq3(src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    check_row(dst.len(), src.len())?;
    let blocks: &[BlockFq3] = bytemuck::cast_slice(src);
    for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(FQ3_BLOCK_VALUES)) {
        b.to_float(out);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A block with d = 1, dmin = 0 and every scale 1 decodes to its codes.
    fn unit_block() -> BlockFq3 {
        BlockFq3 {
            d: F16Bits::from_f32(1.0),
            dmin: F16Bits::from_f32(0.0),
            scales: kscales::pack(&[1; 8], &[0; 8]),
            words: [0; 96],
        }
    }

    fn set_words(b: &mut BlockFq3, g: usize, w: [u32; 3]) {
        for (i, w) in w.into_iter().enumerate() {
            b.words[12 * g + 4 * i..12 * g + 4 * i + 4].copy_from_slice(&w.to_le_bytes());
        }
    }

    #[test]
    fn hand_built_words_decode_as_specified() {
        let mut b = unit_block();
        // Group 0: A byte k at shift 0 gives values 0..3 their low bits 0,1,2,3;
        // at shift 2 values 4..7 get 3,2,1,0. C bit (8k + s) is the high bit of
        // value 4s + k: 0x01 -> value 0, 0x0200 -> value 5 (k=1, s=1),
        // 0x8000_0000 -> value 31 (k=3, s=7).
        let a = 0x0302_0100 | (0x0001_0203 << 2);
        let bw = 0xC0C0_C0C0; // s = 7 (shift 6): low bits 3 for values 28..31
        let c = 0x0000_0001 | 0x0000_0200 | 0x8000_0000;
        set_words(&mut b, 0, [a, bw, c]);
        let mut out = [0f32; 256];
        b.to_float(&mut out);
        let expected_first8 = [4.0, 1.0, 2.0, 3.0, 3.0, 6.0, 1.0, 0.0];
        assert_eq!(&out[..8], &expected_first8);
        assert_eq!(&out[8..28], &[0.0; 20]);
        assert_eq!(&out[28..32], &[3.0, 3.0, 3.0, 7.0]);
        assert!(out[32..].iter().all(|&v| v == 0.0));
    }

    #[test]
    fn second_group_uses_its_own_words_scale_and_min() {
        let mut b = unit_block();
        let mut sc = [1u8; 8];
        let mut m = [0u8; 8];
        sc[1] = 2;
        m[1] = 3;
        b.scales = kscales::pack(&sc, &m);
        b.dmin = F16Bits::from_f32(0.5);
        // Every code of group 1 is 5 = 0b101: low bits 01 in every slot, C all ones.
        set_words(&mut b, 1, [0x5555_5555, 0x5555_5555, 0xFFFF_FFFF]);
        let mut out = [0f32; 256];
        b.to_float(&mut out);
        // 1 * 2 * 5 - 0.5 * 3 = 8.5
        assert!(out[32..64].iter().all(|&v| v == 8.5));
        assert!(out[..32].iter().all(|&v| v == 0.0));
    }

    #[test]
    fn pack_and_unpack_are_inverse() {
        for seed in 0..64u32 {
            let q: [u8; 32] = std::array::from_fn(|i| ((i as u32 * 5 + seed * 3) % 8) as u8);
            assert_eq!(unpack_group(pack_group(&q)), q);
        }
        assert_eq!(pack_group(&[7; 32]), [0xFFFF_FFFF; 3]);
    }

    #[test]
    fn quantiser_error_on_gaussian_data() {
        let mut s = 1u32;
        let x: Vec<f32> = (0..256 * 32)
            .map(|_| {
                let mut v = 0.0;
                for _ in 0..4 {
                    s = s.wrapping_mul(1664525).wrapping_add(1013904223);
                    v += (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5;
                }
                v
            })
            .collect();
        let mut q = vec![0u8; x.len() / 256 * 112];
        quantize_row_fq3(&x, &mut q).unwrap();
        let mut y = vec![0f32; x.len()];
        dequant_row_fq3(&q, &mut y).unwrap();
        let err: f32 = x
            .iter()
            .zip(&y)
            .map(|(a, b)| (a - b) * (a - b))
            .sum::<f32>();
        let rel = (err / x.iter().map(|a| a * a).sum::<f32>()).sqrt();
        // 8 levels per group: about 0.14-0.15 on Gaussian data.
        assert!(rel < 0.16, "relative RMS {rel}");
        assert!(quantize_row_fq3(&x[..100], &mut q[..112]).is_err());
    }
}
