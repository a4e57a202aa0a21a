//! Packing of a [`LaneFit`] (codes row by row, one lane per group) into the
//! target formats' bytes without first reordering the codes: every shift
//! below depends on the row only, so one row is one 8-lane operation.

use super::fast_fit::{LaneFit, LanePacked};
use super::vector::Vector;
use crate::blocks::{kscales, BlockQ4K};
use crate::fq3::BlockFq3;

impl LanePacked for BlockFq3 {
    const NMAX: u8 = 7;

    /// Value `4s + k` of a group is byte `k` of
    /// `((s < 4 ? A : B) >> 2(s & 3)) & 3 | ((C >> s) & 1) << 2`.
    #[inline(always)]
    fn pack<V: Vector>(fit: &LaneFit) -> Self {
        // [A, B] and C per group.
        let mut low = [[0u32; 8]; 2];
        let mut high = [0u32; 8];
        for s in 0..8 {
            // The four codes 4s..4s+3 as the bytes of one word.
            let mut four = [0u32; 8];
            for k in 0..4 {
                for g in 0..8 {
                    four[g] |= fit.codes[4 * s + k][g] << (8 * k);
                }
            }
            for g in 0..8 {
                low[s / 4][g] |= (four[g] & 0x0303_0303) << (2 * (s % 4));
                high[g] |= ((four[g] >> 2) & 0x0101_0101) << s;
            }
        }
        let mut words = [0u8; 96];
        for g in 0..8 {
            for (i, w) in [low[0][g], low[1][g], high[g]].into_iter().enumerate() {
                words[12 * g + 4 * i..12 * g + 4 * i + 4].copy_from_slice(&w.to_le_bytes());
            }
        }
        BlockFq3 {
            d: fit.d,
            dmin: fit.dmin,
            scales: kscales::pack(&fit.scales, &fit.mins),
            words,
        }
    }
}

impl LanePacked for BlockQ4K {
    const NMAX: u8 = 15;

    /// Byte `32 * j + l` holds value `64 * j + l` (low nibble, group `2j`)
    /// and `64 * j + 32 + l` (high nibble, group `2j + 1`): the codes go
    /// back to value order eight rows at a time (an 8 x 8 transpose), then
    /// each byte pairs two groups' codes.
    #[inline(always)]
    fn pack<V: Vector>(fit: &LaneFit) -> Self {
        let mut qs = [0u8; 128];
        for b in 0..4 {
            let rows: &[[u32; 8]; 8] = fit.codes[8 * b..8 * b + 8].try_into().expect("eight rows");
            // by_group[g][i]: the code of value 32g + 8b + i.
            let by_group = V::transpose(rows);
            for j in 0..4 {
                let (low, high) = (&by_group[2 * j], &by_group[2 * j + 1]);
                for i in 0..8 {
                    qs[32 * j + 8 * b + i] = (low[i] | (high[i] << 4)) as u8;
                }
            }
        }
        BlockQ4K {
            d: fit.d,
            dmin: fit.dmin,
            scales: kscales::pack(&fit.scales, &fit.mins),
            qs,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blocks::BlockFormat;
    use crate::requant::fast_fit::quantize_superblock;
    use crate::requant::q4k_from_superblock;

    fn data(seed: u32) -> [f32; 256] {
        let mut s = seed;
        std::array::from_fn(|_| {
            s = s.wrapping_mul(1664525).wrapping_add(1013904223);
            (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        })
    }

    #[test]
    fn lane_packing_gives_the_value_order_packing() {
        for seed in 0..8 {
            let x = data(seed);
            let fit = quantize_superblock(&x, 7);
            let sb = fit.in_value_order();
            assert_eq!(
                bytemuck::bytes_of(&BlockFq3::pack::<[f32; 8]>(&fit)),
                bytemuck::bytes_of(&BlockFq3::from_superblock(&sb))
            );
            let fit = quantize_superblock(&x, 15);
            let sb = fit.in_value_order();
            assert_eq!(
                bytemuck::bytes_of(&BlockQ4K::pack::<[f32; 8]>(&fit)),
                bytemuck::bytes_of(&q4k_from_superblock(&sb))
            );
        }
    }

    #[test]
    fn reported_error_is_the_decoded_error() {
        let x = data(11);
        for nmax in [7, 15] {
            let fit = quantize_superblock(&x, nmax);
            let mut y = [0f32; 256];
            if nmax == 7 {
                BlockFq3::pack::<[f32; 8]>(&fit).to_float(&mut y);
            } else {
                BlockQ4K::pack::<[f32; 8]>(&fit).to_float(&mut y);
            }
            let err: f32 = x.iter().zip(&y).map(|(a, b)| (a - b) * (a - b)).sum();
            let energy: f32 = x.iter().map(|a| a * a).sum();
            assert!((fit.err - err).abs() <= 1e-4 * err, "{} vs {err}", fit.err);
            assert!((fit.energy - energy).abs() <= 1e-4 * energy);
        }
    }
}
