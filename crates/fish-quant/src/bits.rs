//! Byte-array wrappers for the scalar fields of block formats.
//!
//! Every weight block struct has alignment 1, so a tensor borrowed from a
//! mapped file can be viewed as blocks whatever its offset; the wrappers
//! decode their little-endian bytes on use.

use bytemuck::{Pod, Zeroable};
use half::{bf16, f16};

/// An IEEE half-precision value stored as little-endian bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
#[repr(transparent)]
pub struct F16Bits(pub [u8; 2]);

impl F16Bits {
    #[inline(always)]
    pub fn to_f32(self) -> f32 {
        f16::from_bits(u16::from_le_bytes(self.0)).to_f32()
    }

    /// Rounds to nearest-even, as ggml's conversion does.
    #[inline(always)]
    pub fn from_f32(x: f32) -> Self {
        Self(f16::from_f32(x).to_bits().to_le_bytes())
    }
}

/// A bfloat16 value stored as little-endian bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
#[repr(transparent)]
pub struct Bf16Bits(pub [u8; 2]);

impl Bf16Bits {
    #[inline(always)]
    pub fn to_f32(self) -> f32 {
        f32::from_bits((u16::from_le_bytes(self.0) as u32) << 16)
    }

    /// Rounds to nearest-even and keeps NaNs quiet, as ggml's conversion does.
    #[inline(always)]
    pub fn from_f32(x: f32) -> Self {
        Self(bf16::from_f32(x).to_bits().to_le_bytes())
    }
}

/// An f32 stored as little-endian bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Pod, Zeroable)]
#[repr(transparent)]
pub struct F32Bits(pub [u8; 4]);

impl F32Bits {
    #[inline(always)]
    pub fn to_f32(self) -> f32 {
        f32::from_le_bytes(self.0)
    }

    #[inline(always)]
    pub fn from_f32(x: f32) -> Self {
        Self(x.to_le_bytes())
    }
}
