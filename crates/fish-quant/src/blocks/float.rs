//! The unquantised formats F32, F16 and BF16 as one-value "blocks".
//!
//! Their dot products follow ggml's CPU path: F16 weights meet activations
//! rounded to f16, BF16 weights activations rounded to bf16, F32 plain f32;
//! products are summed in f32.

use super::{ActFormat, BlockFormat};
use crate::bits::{Bf16Bits, F16Bits, F32Bits};
use bytemuck::{Pod, Zeroable};
use fish_gguf::GgmlType;
use half::{bf16, f16};

/// One f32 weight.
#[derive(Clone, Copy, Debug, Default, PartialEq, Pod, Zeroable)]
#[repr(C)]
pub struct F32Value(pub F32Bits);
const _: () = assert!(size_of::<F32Value>() == 4);

/// One f16 weight.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct F16Value(pub F16Bits);
const _: () = assert!(size_of::<F16Value>() == 2);

/// One bf16 weight.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct Bf16Value(pub Bf16Bits);
const _: () = assert!(size_of::<Bf16Value>() == 2);

impl BlockFormat for F32Value {
    const TYPE: GgmlType = GgmlType::F32;
    const VALUES: usize = 1;
    type Act = f32;

    fn to_float(&self, out: &mut [f32]) {
        out[0] = self.0.to_f32();
    }

    fn from_float(x: &[f32]) -> Self {
        Self(F32Bits::from_f32(x[0]))
    }

    fn vec_dot(w: &[Self], a: &[f32]) -> f32 {
        w.iter().zip(a).map(|(w, a)| w.0.to_f32() * a).sum()
    }

    fn best_vec_dot() -> super::VecDot<Self> {
        crate::simd::best_f32_dot()
    }
}

impl BlockFormat for F16Value {
    const TYPE: GgmlType = GgmlType::F16;
    const VALUES: usize = 1;
    type Act = f16;

    fn to_float(&self, out: &mut [f32]) {
        out[0] = self.0.to_f32();
    }

    fn from_float(x: &[f32]) -> Self {
        Self(F16Bits::from_f32(x[0]))
    }

    fn vec_dot(w: &[Self], a: &[f16]) -> f32 {
        w.iter()
            .zip(a)
            .map(|(w, a)| w.0.to_f32() * a.to_f32())
            .sum()
    }

    fn best_vec_dot() -> super::VecDot<Self> {
        crate::simd::best_f16_dot()
    }
}

impl BlockFormat for Bf16Value {
    const TYPE: GgmlType = GgmlType::BF16;
    const VALUES: usize = 1;
    type Act = bf16;

    fn to_float(&self, out: &mut [f32]) {
        out[0] = self.0.to_f32();
    }

    fn from_float(x: &[f32]) -> Self {
        Self(Bf16Bits::from_f32(x[0]))
    }

    fn vec_dot(w: &[Self], a: &[bf16]) -> f32 {
        w.iter()
            .zip(a)
            .map(|(w, a)| w.0.to_f32() * a.to_f32())
            .sum()
    }
}

impl ActFormat for f32 {
    const TYPE: GgmlType = GgmlType::F32;
    const VALUES: usize = 1;

    fn quantize_acts(x: &[f32], out: &mut [Self]) {
        out.copy_from_slice(x);
    }

    crate::acts::act_storage!(F32);
}

impl ActFormat for f16 {
    const TYPE: GgmlType = GgmlType::F16;
    const VALUES: usize = 1;

    fn quantize_acts(x: &[f32], out: &mut [Self]) {
        for (o, &v) in out.iter_mut().zip(x) {
            *o = f16::from_f32(v);
        }
    }

    crate::acts::act_storage!(F16);
}

impl ActFormat for bf16 {
    const TYPE: GgmlType = GgmlType::BF16;
    const VALUES: usize = 1;

    fn quantize_acts(x: &[f32], out: &mut [Self]) {
        for (o, &v) in out.iter_mut().zip(x) {
            *o = bf16::from_f32(v);
        }
    }

    crate::acts::act_storage!(Bf16);
}
