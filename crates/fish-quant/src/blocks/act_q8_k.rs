//! Q8_K: the activation format of the k-quants. 256 signed bytes under an
//! f32 scale, with the sums of each 16-value group precomputed so the
//! weights' min terms cost one multiply per group.

use super::{ActFormat, QK_K};
use crate::round::nearest_int;
use bytemuck::{Pod, Zeroable};
use fish_gguf::GgmlType;

#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ8K {
    pub d: f32,
    pub qs: [i8; QK_K],
    /// Sum of `qs[16 * j .. 16 * j + 16]`.
    pub bsums: [i16; QK_K / 16],
}
const _: () = assert!(size_of::<BlockQ8K>() == 292);

impl BlockQ8K {
    pub fn to_float(&self, out: &mut [f32]) {
        for (o, &q) in out.iter_mut().zip(&self.qs) {
            *o = q as f32 * self.d;
        }
    }

    /// The scheme of ggml's reference quantiser: the scale comes from the
    /// signed value of largest magnitude, `iscale = -127 / max`, codes are
    /// rounded to nearest-even and capped at 127, and `d = 1 / iscale`.
    pub fn quantize(x: &[f32]) -> Self {
        let mut max = 0.0f32;
        let mut amax = 0.0f32;
        for &v in x {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        let mut b = Self::zeroed();
        if amax == 0.0 {
            return b;
        }
        let iscale = -127.0 / max;
        for (q, &v) in b.qs.iter_mut().zip(x) {
            *q = nearest_int(iscale * v).min(127) as i8;
        }
        for (j, s) in b.bsums.iter_mut().enumerate() {
            *s = b.qs[16 * j..16 * j + 16].iter().map(|&q| q as i16).sum();
        }
        b.d = 1.0 / iscale;
        b
    }
}

impl ActFormat for BlockQ8K {
    const TYPE: GgmlType = GgmlType::Q8_K;
    const VALUES: usize = QK_K;

    fn quantize_acts(x: &[f32], out: &mut [Self]) {
        for (b, x) in out.iter_mut().zip(x.chunks_exact(QK_K)) {
            *b = Self::quantize(x);
        }
    }

    crate::acts::act_storage!(Q8K);
}
