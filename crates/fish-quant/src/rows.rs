//! Row-level dequantisation and quantisation over any supported type.

use crate::blocks::{BlockQ8K, BlockQ8_1};
use crate::dispatch::with_block_type;
use crate::error::QuantError;
use bytemuck::Zeroable;
use fish_gguf::GgmlType;

/// True for the weight types this crate can dequantise and matmul.
/// Every weight type this crate dequantises, quantises and multiplies.
pub const WEIGHT_TYPES: [GgmlType; 13] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

pub fn is_supported(ty: GgmlType) -> bool {
    with_block_type!(ty, B => { let _ = <B as BlockFormat>::VALUES; true }, _ => false)
}

/// Bytes of `n_values` values of `ty`, checking that they fill whole blocks.
pub fn row_bytes(ty: GgmlType, n_values: usize) -> Result<usize, QuantError> {
    let block = ty.block_size();
    if !n_values.is_multiple_of(block) {
        return Err(QuantError::PartialBlock {
            ty,
            n_values,
            block,
        });
    }
    (n_values / block)
        .checked_mul(ty.block_bytes())
        .ok_or(QuantError::Overflow("row bytes"))
}

fn check_len(what: &'static str, expected: usize, got: usize) -> Result<(), QuantError> {
    if expected == got {
        Ok(())
    } else {
        Err(QuantError::BadLength {
            what,
            expected,
            got,
        })
    }
}

/// Decodes `dst.len()` values from `src`, which must hold exactly their bytes.
pub fn dequant_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    with_block_type!(ty, B => {
        check_len("source bytes", row_bytes(ty, dst.len())?, src.len())?;
        let blocks: &[B] = bytemuck::cast_slice(src);
        for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(<B as BlockFormat>::VALUES)) {
            b.to_float(out);
        }
        Ok(())
    }, _ => dequant_activation_row(ty, src, dst))
}

/// The activation formats decode too (useful for tests and tools).
fn dequant_activation_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    check_len("source bytes", row_bytes(ty, dst.len())?, src.len())?;
    match ty {
        GgmlType::Q8_1 => {
            let blocks: &[BlockQ8_1] = bytemuck::cast_slice(src);
            for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(32)) {
                b.to_float(out);
            }
            Ok(())
        }
        GgmlType::Q8_K => {
            // Q8_K holds an f32, so copy each block out of a possibly unaligned buffer.
            for (bytes, out) in src
                .chunks_exact(ty.block_bytes())
                .zip(dst.chunks_exact_mut(256))
            {
                let b: BlockQ8K = bytemuck::pod_read_unaligned(bytes);
                b.to_float(out);
            }
            Ok(())
        }
        other => Err(QuantError::Unsupported(other)),
    }
}

/// Quantises `src` into `dst`, which must be exactly the bytes of `src.len()` values.
///
/// Weight formats use the file quantisers; Q8_1 and Q8_K use the activation
/// schemes of the dot products.
pub fn quantize_row(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    check_len("destination bytes", row_bytes(ty, src.len())?, dst.len())?;
    with_block_type!(ty, B => {
        let blocks: &mut [B] = bytemuck::cast_slice_mut(dst);
        for (b, x) in blocks.iter_mut().zip(src.chunks_exact(<B as BlockFormat>::VALUES)) {
            *b = B::from_float(x);
        }
        Ok(())
    }, _ => match ty {
        GgmlType::Q8_1 => {
            let blocks: &mut [BlockQ8_1] = bytemuck::cast_slice_mut(dst);
            BlockQ8_1::quantize_acts(src, blocks);
            Ok(())
        }
        GgmlType::Q8_K => {
            let mut tmp = vec![BlockQ8K::zeroed(); src.len() / 256];
            BlockQ8K::quantize_acts(src, &mut tmp);
            dst.copy_from_slice(bytemuck::cast_slice(&tmp));
            Ok(())
        }
        other => Err(QuantError::Unsupported(other)),
    })
}

#[cfg(test)]
mod weight_types_tests {
    use super::*;

    #[test]
    fn the_weight_type_list_is_exactly_the_supported_types() {
        for ty in GgmlType::ALL {
            assert_eq!(is_supported(ty), WEIGHT_TYPES.contains(&ty), "{ty}");
        }
    }
}
