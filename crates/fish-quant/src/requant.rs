//! Re-quantisation of weight rows from any supported type to Q4_K or FQ3
//! (decode, then encode) on the current rayon pool, with the error it costs.

mod fast_fit;
mod lane_pack;
mod lanes;
mod lattice;
mod source;
mod vector;
mod weighted_fit;

#[cfg(test)]
use crate::blocks::kfit::AffineSuperBlock;
#[cfg(test)]
use crate::blocks::kscales;
use crate::blocks::BlockQ4K;
use crate::error::QuantError;
use crate::fq3::{BlockFq3, FQ3_BLOCK_BYTES};
use crate::rows::row_bytes;
use fish_gguf::GgmlType;
use rayon::prelude::*;

/// The format rows are re-quantised to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequantTarget {
    Q4K,
    Fq3,
}

impl RequantTarget {
    /// Bytes per 256 values.
    pub fn block_bytes(self) -> usize {
        match self {
            Self::Q4K => size_of::<BlockQ4K>(),
            Self::Fq3 => FQ3_BLOCK_BYTES,
        }
    }
}

/// Re-quantised rows and what the conversion cost.
#[derive(Clone, Debug)]
pub struct Requantized {
    pub bytes: Vec<u8>,
    /// sqrt(sum (new - source)²) / sqrt(sum source²) over all rows.
    pub rel_rms: f64,
}

/// Re-quantises `n_rows` rows of `n_in` values of type `src_ty` (`n_in` a
/// multiple of 256).
pub fn requantize(
    src_ty: GgmlType,
    src: &[u8],
    n_in: usize,
    n_rows: usize,
    target: RequantTarget,
) -> Result<Requantized, QuantError> {
    let dst_row = n_in / 256 * target.block_bytes();
    requantize_rows(src_ty, src, n_in, n_rows, dst_row, |x, dst| {
        encode_row(target, x, dst)
    })
}

/// [`requantize`] with an importance-weighted fit: `column_weights` (one
/// finite, non-negative weight per input column, e.g. the mean square of
/// the activations it multiplies) weighs each value's squared error, in the
/// per-group fit and in the choice of 6-bit scales and mins. `rel_rms`
/// stays the unweighted error.
pub fn requantize_weighted(
    src_ty: GgmlType,
    src: &[u8],
    n_in: usize,
    n_rows: usize,
    target: RequantTarget,
    column_weights: &[f32],
) -> Result<Requantized, QuantError> {
    if column_weights.len() != n_in {
        return Err(QuantError::BadLength {
            what: "column weights (one per input)",
            expected: n_in,
            got: column_weights.len(),
        });
    }
    let dst_row = n_in / 256 * target.block_bytes();
    let weights = weighted_fit::weight_rows(&sanitized(column_weights));
    requantize_rows(src_ty, src, n_in, n_rows, dst_row, |x, dst| {
        encode_row_weighted(target, x, &weights, dst)
    })
}

/// Weights with non-finite or negative entries set to zero, then a floor of
/// a small share of the mean so no column is ignored altogether.
fn sanitized(w: &[f32]) -> Vec<f32> {
    let clean: Vec<f32> = w
        .iter()
        .map(|&v| if v.is_finite() && v > 0.0 { v } else { 0.0 })
        .collect();
    let mean = clean.iter().map(|&v| v as f64).sum::<f64>() / clean.len().max(1) as f64;
    let floor = (WEIGHT_FLOOR * mean) as f32;
    clean.into_iter().map(|v| v + floor).collect()
}

/// Share of the mean weight added to every column's weight.
const WEIGHT_FLOOR: f64 = 1e-3;

fn requantize_rows(
    src_ty: GgmlType,
    src: &[u8],
    n_in: usize,
    n_rows: usize,
    dst_row: usize,
    encode: impl Fn(&[f32], &mut [u8]) -> (f64, f64) + Sync,
) -> Result<Requantized, QuantError> {
    let src_row = row_bytes(src_ty, n_in)?;
    if !n_in.is_multiple_of(256) {
        return Err(QuantError::PartialBlock {
            ty: GgmlType::Q4_K,
            n_values: n_in,
            block: 256,
        });
    }
    let expected = src_row
        .checked_mul(n_rows)
        .ok_or(QuantError::Overflow("source bytes"))?;
    if src.len() != expected {
        return Err(QuantError::BadLength {
            what: "source bytes (n_rows rows)",
            expected,
            got: src.len(),
        });
    }
    let mut bytes = vec![0u8; dst_row * n_rows];
    if n_rows == 0 || n_in == 0 {
        return Ok(Requantized {
            bytes,
            rel_rms: 0.0,
        });
    }
    let (err, energy) = bytes
        .par_chunks_mut(dst_row)
        .zip(src.par_chunks(src_row))
        .map_init(
            || vec![0f32; n_in],
            |x, (dst, src)| -> Result<(f64, f64), QuantError> {
                source::decode_row(src_ty, src, x)?;
                Ok(encode(x, dst))
            },
        )
        .try_reduce(|| (0.0, 0.0), |a, b| Ok((a.0 + b.0, a.1 + b.1)))?;
    let rel_rms = if energy > 0.0 {
        (err / energy).sqrt()
    } else {
        0.0
    };
    Ok(Requantized { bytes, rel_rms })
}

/// Encodes `x` into `dst`; returns the squared error of the encoded row
/// and the row's energy (the fit reports both, so nothing is decoded).
fn encode_row(target: RequantTarget, x: &[f32], dst: &mut [u8]) -> (f64, f64) {
    match target {
        RequantTarget::Q4K => encode_blocks::<BlockQ4K>(x, dst),
        RequantTarget::Fq3 => encode_blocks::<BlockFq3>(x, dst),
    }
}

/// Super-blocks fitted together (the fit interleaves their steps).
const INTERLEAVED: usize = 2;

fn encode_blocks<B: fast_fit::LanePacked>(x: &[f32], dst: &mut [u8]) -> (f64, f64) {
    let blocks: &mut [B] = bytemuck::cast_slice_mut(dst);
    let mut sums = (0.0, 0.0);
    let mut take = |slot: &mut B, (block, err, energy): (B, f32, f32)| {
        *slot = block;
        sums.0 += err as f64;
        sums.1 += energy as f64;
    };
    const G: usize = INTERLEAVED;
    let mut groups = blocks.chunks_exact_mut(G);
    let mut values = x.chunks_exact(256 * G);
    for (b, x) in (&mut groups).zip(&mut values) {
        let x: [&[f32; 256]; G] = std::array::from_fn(|p| as_block(&x[256 * p..256 * (p + 1)]));
        for (slot, out) in b.iter_mut().zip(fast_fit::encode_superblocks::<B, G>(x)) {
            take(slot, out);
        }
    }
    let rest = groups.into_remainder().iter_mut();
    for (slot, x) in rest.zip(values.remainder().chunks_exact(256)) {
        let [out] = fast_fit::encode_superblocks::<B, 1>([as_block(x)]);
        take(slot, out);
    }
    sums
}

/// [`encode_row`] with the weighted fit, `w` the row's weights from
/// [`weighted_fit::weight_rows`].
fn encode_row_weighted(
    target: RequantTarget,
    x: &[f32],
    w: &[lanes::Rows],
    dst: &mut [u8],
) -> (f64, f64) {
    match target {
        RequantTarget::Q4K => encode_blocks_weighted::<BlockQ4K>(x, w, dst),
        RequantTarget::Fq3 => encode_blocks_weighted::<BlockFq3>(x, w, dst),
    }
}

fn encode_blocks_weighted<B: fast_fit::LanePacked>(
    x: &[f32],
    w: &[lanes::Rows],
    dst: &mut [u8],
) -> (f64, f64) {
    let blocks: &mut [B] = bytemuck::cast_slice_mut(dst);
    let mut sums = (0.0, 0.0);
    let mut take = |slot: &mut B, (block, err, energy): (B, f32, f32)| {
        *slot = block;
        sums.0 += err as f64;
        sums.1 += energy as f64;
    };
    const G: usize = INTERLEAVED;
    let mut groups = blocks.chunks_exact_mut(G);
    let mut values = x.chunks_exact(256 * G);
    let mut weights = w.chunks_exact(G);
    for ((b, x), w) in (&mut groups).zip(&mut values).zip(&mut weights) {
        let x: [&[f32; 256]; G] = std::array::from_fn(|p| as_block(&x[256 * p..256 * (p + 1)]));
        let w: [&lanes::Rows; G] = std::array::from_fn(|p| &w[p]);
        let out = weighted_fit::encode_superblocks_weighted::<B, G>(x, w);
        for (slot, out) in b.iter_mut().zip(out) {
            take(slot, out);
        }
    }
    let rest = groups.into_remainder().iter_mut();
    let rest = rest
        .zip(values.remainder().chunks_exact(256))
        .zip(weights.remainder());
    for ((slot, x), w) in rest {
        let [out] = weighted_fit::encode_superblocks_weighted::<B, 1>([as_block(x)], [w]);
        take(slot, out);
    }
    sums
}

fn as_block(x: &[f32]) -> &[f32; 256] {
    x.try_into().expect("chunks_exact(256) yields 256 values")
}

/// Packs a fitted super-block (codes in `0..16`) as Q4_K (the reference
/// the lane packing is tested against): byte `32 * j + l`
/// holds value `64 * j + l` (low nibble) and `64 * j + 32 + l` (high nibble).
#[cfg(test)]
pub(crate) fn q4k_from_superblock(sb: &AffineSuperBlock) -> BlockQ4K {
    let mut qs = [0u8; 128];
    for j in 0..4 {
        for l in 0..32 {
            qs[32 * j + l] = sb.codes[64 * j + l] | (sb.codes[64 * j + 32 + l] << 4);
        }
    }
    BlockQ4K {
        d: sb.d,
        dmin: sb.dmin,
        scales: kscales::pack(&sb.scales, &sb.mins),
        qs,
    }
}
