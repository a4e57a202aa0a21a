//! fish-quant: the CPU side of every number the engine computes.
//!
//! * [`blocks`]: one `#[repr(C)]` struct per ggml block format and the
//!   [`blocks::BlockFormat`] trait they implement (decode, encode, dot).
//! * [`dequant_row`] / [`quantize_row`]: row conversions for any supported type.
//! * [`matmul_batch`] / [`matmul_quantized`]: `y = W x` with activations
//!   quantised the way ggml's CPU backend does (Q8_0, Q8_1, Q8_K, f16, bf16),
//!   integer sums per block, SIMD where the CPU has it, rows split across the
//!   current rayon pool.
//!
//! Numerics follow ggml's CPU path so the engine reproduces llama.cpp's
//! greedy tokens: block layouts are bit-exact, dot products use the same
//! activation quantisation and integer-sum-then-scale structure.

// Block codecs index several arrays with one position (codes, scales,
// activations); index loops say that more plainly than zipped iterators.
#![allow(clippy::needless_range_loop)]

mod acts;
mod bits;
pub mod blocks;
mod dispatch;
mod error;
pub mod fq3;
mod matmul;
pub mod requant;
mod round;
mod rows;
mod simd;

pub use acts::{dot_type, quantize_acts, quantize_acts_into, QuantizedActs};
pub use bits::{Bf16Bits, F16Bits, F32Bits};
pub use error::QuantError;
pub use fish_gguf::GgmlType;
pub use matmul::{matmul_batch, matmul_quantized, Weights};
pub use rows::{dequant_row, is_supported, quantize_row, row_bytes, WEIGHT_TYPES};
pub use simd::{simd_level, SimdLevel};
