//! Decoding the source rows of a re-quantisation. Q4_K and Q6_K (the
//! sources the GPU modes convert) are decoded here with exactly the
//! arithmetic of their `to_float` (same values, bit for bit), in code built
//! for AVX2 where the CPU has it: the blocks' own decoders are built for the
//! baseline x86-64 target and took about a tenth of a re-quantisation.
//! Every other type goes through [`dequant_row`].

use crate::blocks::{kscales, BlockQ4K, BlockQ6K};
use crate::error::QuantError;
use crate::rows::{dequant_row, row_bytes};
use fish_gguf::GgmlType;

/// Decodes one row of `ty` into `out` (`out.len()` values).
pub(super) fn decode_row(ty: GgmlType, src: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    match ty {
        GgmlType::Q4_K => decode_blocks::<BlockQ4K>(ty, src, out),
        GgmlType::Q6_K => decode_blocks::<BlockQ6K>(ty, src, out),
        _ => dequant_row(ty, src, out),
    }
}

/// A block format decoded here.
trait Decoded: bytemuck::Pod {
    /// The block's 256 values, as its `to_float` computes them.
    fn decode(&self, out: &mut [f32; 256]);
}

fn decode_blocks<B: Decoded>(ty: GgmlType, src: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    let expected = row_bytes(ty, out.len())?;
    if src.len() != expected || !out.len().is_multiple_of(256) {
        return Err(QuantError::BadLength {
            what: "source bytes",
            expected,
            got: src.len(),
        });
    }
    let blocks: &[B] = bytemuck::try_cast_slice(src).map_err(|_| QuantError::BadLength {
        what: "source bytes (whole blocks)",
        expected,
        got: src.len(),
    })?;
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2 (checked just above).
            unsafe { decode_avx2(blocks, out) };
            return Ok(());
        }
    }
    decode_all(blocks, out);
    Ok(())
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn decode_avx2<B: Decoded>(blocks: &[B], out: &mut [f32]) {
    decode_all(blocks, out);
}

#[inline(always)]
fn decode_all<B: Decoded>(blocks: &[B], out: &mut [f32]) {
    for (b, out) in blocks.iter().zip(out.chunks_exact_mut(256)) {
        b.decode(out.try_into().expect("chunks_exact(256) yields 256 values"));
    }
}

impl Decoded for BlockQ4K {
    /// Byte `32j + l` holds value `64j + l` (low nibble) and `64j + 32 + l`
    /// (high nibble); value = `d * sc * q - dmin * m` per group of 32.
    #[inline(always)]
    fn decode(&self, out: &mut [f32; 256]) {
        let (d, dmin) = (self.d.to_f32(), self.dmin.to_f32());
        let (sc, m) = kscales::unpack(&self.scales);
        for j in 0..4 {
            let (d1, m1) = (d * sc[2 * j] as f32, dmin * m[2 * j] as f32);
            let (d2, m2) = (d * sc[2 * j + 1] as f32, dmin * m[2 * j + 1] as f32);
            let (low, high) = out[64 * j..64 * j + 64].split_at_mut(32);
            let qs = &self.qs[32 * j..32 * j + 32];
            for l in 0..32 {
                low[l] = d1 * (qs[l] & 0x0f) as f32 - m1;
                high[l] = d2 * (qs[l] >> 4) as f32 - m2;
            }
        }
    }
}

impl Decoded for BlockQ6K {
    /// In each half n, `ql[64n + l]` holds values l (low nibble) and 64 + l
    /// (high), `ql[64n + 32 + l]` values 32 + l and 96 + l, and `qh[32n + l]`
    /// the two high bits of each; value = `d * sc * (q - 32)` per 16 values.
    #[inline(always)]
    fn decode(&self, out: &mut [f32; 256]) {
        let d = self.d.to_f32();
        let scale: [f32; 16] = std::array::from_fn(|k| d * self.scales[k] as f32);
        for n in 0..2 {
            let (ql, qh) = (&self.ql[64 * n..64 * n + 64], &self.qh[32 * n..32 * n + 32]);
            let out = &mut out[128 * n..128 * n + 128];
            // Value 32i + l of the half has its scale at 2i + l / 16.
            let s = &scale[8 * n..8 * n + 8];
            for l in 0..32 {
                let half = l / 16;
                let q = [
                    (ql[l] & 0x0f) | ((qh[l] & 3) << 4),
                    (ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4),
                    (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4),
                    (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4),
                ];
                for (i, q) in q.into_iter().enumerate() {
                    out[32 * i + l] = s[2 * i + half] * (q as i32 - 32) as f32;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rows::quantize_row;

    fn data(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|i| {
                s = s.wrapping_mul(1664525).wrapping_add(1013904223);
                let v = (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5;
                // Some blocks all one sign, some with an outlier.
                match (i / 256) % 3 {
                    1 => v.abs() * 3.0,
                    2 if i % 97 == 5 => 40.0 * v,
                    _ => v,
                }
            })
            .collect()
    }

    #[test]
    fn q4_k_and_q6_k_decode_to_the_bits_of_their_block_decoders() {
        let n = 256 * 12;
        for ty in [GgmlType::Q4_K, GgmlType::Q6_K] {
            for seed in 0..4 {
                let x = data(n, seed);
                let mut q = vec![0u8; row_bytes(ty, n).unwrap()];
                quantize_row(ty, &x, &mut q).unwrap();
                let (mut a, mut b) = (vec![0f32; n], vec![0f32; n]);
                decode_row(ty, &q, &mut a).unwrap();
                dequant_row(ty, &q, &mut b).unwrap();
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&a), bits(&b), "{ty}");
                let mut c = vec![0f32; n];
                match ty {
                    GgmlType::Q4_K => decode_all::<BlockQ4K>(bytemuck::cast_slice(&q), &mut c),
                    _ => decode_all::<BlockQ6K>(bytemuck::cast_slice(&q), &mut c),
                }
                assert_eq!(bits(&c), bits(&b), "{ty} portable");
            }
        }
    }

    #[test]
    fn wrong_lengths_are_errors() {
        let mut out = vec![0f32; 256];
        assert!(decode_row(GgmlType::Q4_K, &[0u8; 143], &mut out).is_err());
        assert!(decode_row(GgmlType::Q6_K, &[0u8; 211], &mut out).is_err());
    }
}
