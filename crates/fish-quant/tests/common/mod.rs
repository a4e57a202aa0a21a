//! Deterministic test data shared by the integration tests.
#![allow(dead_code)]

use fish_quant::GgmlType;

/// A small deterministic generator (64-bit LCG, high bits), so tests need no RNG crate.
pub struct Lcg(pub u64);

impl Lcg {
    pub fn next_u32(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) as u32
    }

    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f32 {
        (self.next_u32() as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
    }

    /// Roughly Gaussian (sum of four uniforms), like trained weights.
    pub fn gaussian(&mut self) -> f32 {
        (0..4).map(|_| self.uniform()).sum::<f32>() * 0.87
    }

    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.gaussian() * scale).collect()
    }
}

/// Weight types with a quantiser: all of them.
pub const QUANTISABLE: [GgmlType; 13] = fish_quant::WEIGHT_TYPES;

pub fn quantize(ty: GgmlType, x: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; fish_quant::row_bytes(ty, x.len()).unwrap()];
    fish_quant::quantize_row(ty, x, &mut out).unwrap();
    out
}

pub fn dequant(ty: GgmlType, bytes: &[u8], n: usize) -> Vec<f32> {
    let mut out = vec![0f32; n];
    fish_quant::dequant_row(ty, bytes, &mut out).unwrap();
    out
}

/// sqrt(sum (a - b)²) / sqrt(sum b²).
pub fn rel_rms(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(a, b)| ((a - b) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|b| (*b as f64).powi(2)).sum();
    (num / den).sqrt()
}
