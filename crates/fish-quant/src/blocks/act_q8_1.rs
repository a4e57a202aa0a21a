//! Q8_1: the activation format of Q4_1 and Q5_1 weights. Like Q8_0 plus
//! `s = d * sum(q)`, which carries the weights' offset term.

use super::q8_0::quantize_act_block;
use super::ActFormat;
use crate::bits::F16Bits;
use bytemuck::{Pod, Zeroable};
use fish_gguf::GgmlType;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ8_1 {
    pub d: F16Bits,
    /// `d * sum(qs)`, with the unrounded f32 `d`.
    pub s: F16Bits,
    pub qs: [i8; 32],
}
const _: () = assert!(size_of::<BlockQ8_1>() == 36);

impl BlockQ8_1 {
    pub fn to_float(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        for (o, &q) in out.iter_mut().zip(&self.qs) {
            *o = q as f32 * d;
        }
    }
}

impl ActFormat for BlockQ8_1 {
    const TYPE: GgmlType = GgmlType::Q8_1;
    const VALUES: usize = 32;

    fn quantize_acts(x: &[f32], out: &mut [Self]) {
        for (b, x) in out.iter_mut().zip(x.chunks_exact(32)) {
            let d = quantize_act_block(x, &mut b.qs);
            let sum: i32 = b.qs.iter().map(|&q| q as i32).sum();
            b.d = F16Bits::from_f32(d);
            b.s = F16Bits::from_f32(d * sum as f32);
        }
    }

    crate::acts::act_storage!(Q8_1);
}
