//! Activations converted once to a weight type's dot-product format.

use crate::bits::F16Bits;
use crate::blocks::{ActFormat, BlockQ8K, BlockQ8_0, BlockQ8_1};
use crate::error::QuantError;
use crate::simd::{quantize_q8_block, quantize_q8_k_block, ActScale, CodeOffset, LaneOffsets};
use fish_gguf::GgmlType;
use half::{bf16, f16};
use rayon::prelude::*;
use std::sync::OnceLock;

/// Storage for activations in one of the dot-product formats.
#[derive(Clone, Debug, Default)]
pub enum ActsData {
    #[default]
    Empty,
    F32(Vec<f32>),
    F16(Vec<f16>),
    Bf16(Vec<bf16>),
    Q8_0(Vec<BlockQ8_0>),
    Q8_1(Vec<BlockQ8_1>),
    Q8K(Vec<BlockQ8K>),
}

/// Implements [`ActFormat::view`] and [`ActFormat::storage`] for the
/// `ActsData` variant that holds `Self`.
macro_rules! act_storage {
    ($variant:ident) => {
        fn view(data: &$crate::acts::ActsData) -> Option<&[Self]> {
            match data {
                $crate::acts::ActsData::$variant(v) => Some(v),
                _ => None,
            }
        }

        fn storage(data: &mut $crate::acts::ActsData, n: usize) -> &mut [Self] {
            if !matches!(data, $crate::acts::ActsData::$variant(_)) {
                *data = $crate::acts::ActsData::$variant(Vec::new());
            }
            match data {
                $crate::acts::ActsData::$variant(v) => {
                    v.resize(n, bytemuck::Zeroable::zeroed());
                    v
                }
                _ => unreachable!("storage was just set to this variant"),
            }
        }
    };
}
pub(crate) use act_storage;

/// Activations quantised once for several weights that share an input
/// (q/k/v, gate/up): `n_tok` rows of `n_in` values in format `dot_type`.
#[derive(Clone, Debug, Default)]
pub struct QuantizedActs {
    pub(crate) data: ActsData,
    pub(crate) dot_type: Option<GgmlType>,
    pub(crate) n_tok: usize,
    pub(crate) n_in: usize,
    pub(crate) tiles: TileCache,
}

impl QuantizedActs {
    /// The dot-product format, `None` for an empty value.
    pub fn dot_type(&self) -> Option<GgmlType> {
        self.dot_type
    }

    pub fn n_tok(&self) -> usize {
        self.n_tok
    }

    pub fn n_in(&self) -> usize {
        self.n_in
    }

    /// The activation blocks as `A`, if they are stored in that format.
    pub fn blocks<A: ActFormat>(&self) -> Option<&[A]> {
        A::view(&self.data)
    }
}

/// The activation format ggml's CPU backend dots a weight type with.
pub fn dot_type(weight: GgmlType) -> GgmlType {
    use GgmlType::*;
    match weight {
        Q4_0 | Q5_0 | Q8_0 => Q8_0,
        Q4_1 | Q5_1 => Q8_1,
        Q2_K | Q3_K | Q4_K | Q5_K | Q6_K => Q8_K,
        F16 => F16,
        BF16 => BF16,
        _ => F32,
    }
}

/// Quantises `x` (`n_tok` rows of `n_in`) to `dot_type`.
pub fn quantize_acts(
    dot_type: GgmlType,
    x: &[f32],
    n_tok: usize,
    n_in: usize,
) -> Result<QuantizedActs, QuantError> {
    let mut acts = QuantizedActs::default();
    quantize_acts_into(&mut acts, dot_type, x, n_tok, n_in)?;
    Ok(acts)
}

/// Like [`quantize_acts`], reusing the storage of `acts`.
pub fn quantize_acts_into(
    acts: &mut QuantizedActs,
    dot_type: GgmlType,
    x: &[f32],
    n_tok: usize,
    n_in: usize,
) -> Result<(), QuantError> {
    let expected = n_tok
        .checked_mul(n_in)
        .ok_or(QuantError::Overflow("activations"))?;
    if x.len() != expected {
        return Err(QuantError::BadLength {
            what: "activations (n_tok * n_in)",
            expected,
            got: x.len(),
        });
    }
    match dot_type {
        GgmlType::F32 => fill::<f32>(acts, x, n_in)?,
        GgmlType::F16 => fill::<f16>(acts, x, n_in)?,
        GgmlType::BF16 => fill::<bf16>(acts, x, n_in)?,
        GgmlType::Q8_0 => fill_with::<BlockQ8_0>(acts, x, n_in, q8_0_rows)?,
        GgmlType::Q8_1 => fill_with::<BlockQ8_1>(acts, x, n_in, q8_1_rows)?,
        GgmlType::Q8_K => fill_with::<BlockQ8K>(acts, x, n_in, q8_k_rows)?,
        other => return Err(QuantError::Unsupported(other)),
    }
    acts.dot_type = Some(dot_type);
    acts.tiles = TileCache::default();
    acts.n_tok = n_tok;
    acts.n_in = n_in;
    Ok(())
}

/// Below this many values, quantising on one thread beats waking the pool.
const PARALLEL_ACTS_MIN: usize = 1 << 16;

fn fill<A: ActFormat>(acts: &mut QuantizedActs, x: &[f32], n_in: usize) -> Result<(), QuantError> {
    fill_with(acts, x, n_in, A::quantize_acts)
}

/// Q8_0 activations, SIMD per block where possible (bit-identical to
/// `BlockQ8_0::quantize_acts`, which handles the other blocks).
fn q8_0_rows(x: &[f32], out: &mut [BlockQ8_0]) {
    for (b, x) in out.iter_mut().zip(x.chunks_exact(32)) {
        match <&[f32; 32]>::try_from(x)
            .ok()
            .and_then(|xb| quantize_q8_block(xb, &mut b.qs))
        {
            Some((d, _)) => b.d = F16Bits::from_f32(d),
            None => BlockQ8_0::quantize_acts(x, std::slice::from_mut(b)),
        }
    }
}

/// Q8_1 activations, like [`q8_0_rows`] plus `s = d * sum(qs)`.
fn q8_1_rows(x: &[f32], out: &mut [BlockQ8_1]) {
    for (b, x) in out.iter_mut().zip(x.chunks_exact(32)) {
        match <&[f32; 32]>::try_from(x)
            .ok()
            .and_then(|xb| quantize_q8_block(xb, &mut b.qs))
        {
            Some((d, sum)) => {
                b.d = F16Bits::from_f32(d);
                b.s = F16Bits::from_f32(d * sum as f32);
            }
            None => BlockQ8_1::quantize_acts(x, std::slice::from_mut(b)),
        }
    }
}

/// Q8_K activations, SIMD per block where possible (bit-identical to
/// `BlockQ8K::quantize`, which handles the other blocks).
fn q8_k_rows(x: &[f32], out: &mut [BlockQ8K]) {
    for (b, x) in out.iter_mut().zip(x.chunks_exact(256)) {
        let done = <&[f32; 256]>::try_from(x)
            .ok()
            .is_some_and(|xb| quantize_q8_k_block(xb, b));
        if !done {
            *b = BlockQ8K::quantize(x);
        }
    }
}

fn fill_with<A: ActFormat>(
    acts: &mut QuantizedActs,
    x: &[f32],
    n_in: usize,
    quantize: fn(&[f32], &mut [A]),
) -> Result<(), QuantError> {
    if !n_in.is_multiple_of(A::VALUES) {
        return Err(QuantError::PartialBlock {
            ty: A::TYPE,
            n_values: n_in,
            block: A::VALUES,
        });
    }
    let out = A::storage(&mut acts.data, x.len() / A::VALUES);
    if x.len() >= PARALLEL_ACTS_MIN && n_in > 0 {
        let per_row = n_in / A::VALUES;
        out.par_chunks_mut(per_row.max(1))
            .zip(x.par_chunks(n_in))
            .for_each(|(o, x)| quantize(x, o));
    } else {
        quantize(x, out);
    }
    Ok(())
}

/// Per-block data of the tile kernels, derived from the activations on
/// first use and shared by every matmul with the same input (q/k/v,
/// gate/up).
#[derive(Clone, Debug, Default)]
pub(crate) struct TileCache {
    scales: OnceLock<Option<Vec<ActScale>>>,
    /// One slot per code offset `K`, as indexed by [`CodeOffset::index`].
    offsets: [OnceLock<Option<Vec<LaneOffsets>>>; CodeOffset::COUNT],
}

/// Blocks below which the tile data is derived on the calling thread.
const PARALLEL_TILE_BLOCKS: usize = 1024;

/// Maps every block of `blocks` through `f`, on the pool when there are many.
fn map_blocks<A: Sync, T: Send>(blocks: &[A], f: impl Fn(&A) -> T + Sync + Send) -> Vec<T> {
    if blocks.len() >= PARALLEL_TILE_BLOCKS {
        blocks.par_iter().map(f).collect()
    } else {
        blocks.iter().map(f).collect()
    }
}

impl QuantizedActs {
    /// The per-block scales as the tile kernels read them (see
    /// [`ActScale`]; Q8_K: `d` only); `None` for formats without tiles.
    pub(crate) fn tile_scales(&self) -> Option<&[ActScale]> {
        self.tiles
            .scales
            .get_or_init(|| match &self.data {
                ActsData::Q8_0(v) => Some(map_blocks(v, |b| ActScale {
                    d: b.d.to_f32(),
                    aux: 0,
                })),
                ActsData::Q8_1(v) => Some(map_blocks(v, |b| ActScale {
                    d: b.d.to_f32(),
                    aux: b.s.to_f32().to_bits(),
                })),
                ActsData::Q8K(v) => Some(map_blocks(v, |b| ActScale { d: b.d, aux: 0 })),
                _ => None,
            })
            .as_deref()
    }

    /// The [`LaneOffsets`] of Q8_0 activations for codes stored as `q + K`,
    /// laid out as the blocks; `None` for other formats.
    pub(crate) fn lane_offsets(&self, k: CodeOffset) -> Option<&[LaneOffsets]> {
        self.tiles.offsets[k.index()]
            .get_or_init(|| {
                let ActsData::Q8_0(v) = &self.data else {
                    return None;
                };
                let k = k.value();
                Some(map_blocks(v, |b| {
                    LaneOffsets(core::array::from_fn(|l| {
                        -k * b.qs[4 * l..4 * l + 4]
                            .iter()
                            .map(|&q| q as i32)
                            .sum::<i32>()
                    }))
                }))
            })
            .as_deref()
    }
}
