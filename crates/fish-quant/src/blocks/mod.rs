//! One `#[repr(C)]` struct per block format, and the trait they all implement.
//!
//! Weight blocks have alignment 1 (their f16 fields are byte pairs), so any
//! byte slice of the right length can be viewed as a slice of blocks.

mod act_q8_1;
mod act_q8_k;
mod float;
pub(crate) mod kfit;
pub(crate) mod kscales;
mod q2_k;
mod q3_k;
mod q4_0;
mod q4_1;
mod q4_k;
mod q5_0;
mod q5_1;
mod q5_k;
mod q6_k;
mod q8_0;

pub use act_q8_1::BlockQ8_1;
pub use act_q8_k::BlockQ8K;
pub use float::{Bf16Value, F16Value, F32Value};
pub use q2_k::BlockQ2K;
pub use q3_k::BlockQ3K;
pub use q4_0::BlockQ4_0;
pub use q4_1::BlockQ4_1;
pub use q4_k::BlockQ4K;
pub use q5_0::BlockQ5_0;
pub use q5_1::BlockQ5_1;
pub use q5_k::BlockQ5K;
pub use q6_k::BlockQ6K;
pub use q8_0::BlockQ8_0;

use crate::acts::ActsData;
use bytemuck::Pod;
use fish_gguf::GgmlType;

/// Number of values in a k-quant super-block.
pub const QK_K: usize = 256;

/// A row dot product of weight blocks with activation blocks.
pub type VecDot<B> = fn(&[B], &[<B as BlockFormat>::Act]) -> f32;

/// A weight block format: its geometry, decoding, encoding and dot product.
pub trait BlockFormat: Pod + Send + Sync {
    /// The ggml type this block encodes.
    const TYPE: GgmlType;
    /// Values per block.
    const VALUES: usize;
    /// The activation format this weight is dotted with.
    type Act: ActFormat;

    /// Decodes the block into `out` (`out.len() == VALUES`).
    fn to_float(&self, out: &mut [f32]);

    /// Encodes `x` (`x.len() == VALUES`).
    fn from_float(x: &[f32]) -> Self;

    /// Portable dot product of a row of weight blocks with activation blocks
    /// covering the same values: integer sums per block, then scaled.
    fn vec_dot(w: &[Self], a: &[Self::Act]) -> f32;

    /// The fastest dot product this CPU runs; same integer sums as
    /// [`BlockFormat::vec_dot`], float accumulation order may differ.
    fn best_vec_dot() -> VecDot<Self> {
        Self::vec_dot
    }

    /// The dot product for the tokens of a batch that ggml's interleaved
    /// kernels take four at a time (all but the last `n_tok % 4`); the same
    /// as [`BlockFormat::best_vec_dot`] for formats those kernels round alike.
    fn grouped_vec_dot() -> VecDot<Self> {
        Self::best_vec_dot()
    }

    /// The dot product for matrices whose row count is a multiple of
    /// [`INTERLEAVED_ROWS`], for formats that ggml's x86 CPU backend repacks
    /// into interleaved 8-row blocks with their own rounding: one exact
    /// integer sum per block, scaled and added by one fused multiply-add.
    /// `None` where the format rounds alike in every matrix.
    fn interleaved_vec_dot() -> Option<VecDot<Self>> {
        None
    }

    /// The dot product for batches of at least [`TILED_BATCH`] tokens, for
    /// formats that ggml's x86 CPU backend sends through its tiled K-quant
    /// matmul there: per block one exact integer sum, scaled by the weight
    /// scale, then added into a single accumulator by one fused
    /// multiply-add with the activation scale, blocks in order. `None` where
    /// batches round as single tokens do.
    fn tiled_batch_vec_dot() -> Option<VecDot<Self>> {
        None
    }
}

/// Tokens from which ggml's tiled K-quant matmul takes a batch (and it
/// rounds as [`BlockFormat::tiled_batch_vec_dot`]).
pub const TILED_BATCH: usize = 8;

/// Rows ggml's repacked kernels interleave: a matrix is repacked (and rounds
/// as [`BlockFormat::interleaved_vec_dot`]) when its row count is a multiple.
pub const INTERLEAVED_ROWS: usize = 8;

/// An activation format: what `x` is converted to before dot products.
pub trait ActFormat: Pod + Send + Sync {
    /// The ggml type of this activation format.
    const TYPE: GgmlType;
    /// Values per block.
    const VALUES: usize;

    /// Converts `x` into `out` (`x.len() == out.len() * VALUES`).
    fn quantize_acts(x: &[f32], out: &mut [Self]);

    /// The activation storage of this format, if `data` holds it.
    fn view(data: &ActsData) -> Option<&[Self]>;

    /// Storage for `n` blocks of this format, reusing `data` when it already is one.
    fn storage(data: &mut ActsData, n: usize) -> &mut [Self];
}
