//! Runtime selection of the SIMD dot products.
//!
//! Each `best_*` returns the fastest kernel this CPU supports; every kernel
//! computes the same per-block integer sums as the portable one in
//! `blocks`, so results differ only in float accumulation order.

use crate::blocks::{
    BlockFormat, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ6K, BlockQ8_0,
    F16Value, F32Value, VecDot,
};

pub fn best_f32_dot() -> VecDot<F32Value> {
    F32Value::vec_dot
}

pub fn best_f16_dot() -> VecDot<F16Value> {
    F16Value::vec_dot
}

pub fn best_q4_0_dot() -> VecDot<BlockQ4_0> {
    BlockQ4_0::vec_dot
}

pub fn best_q4_1_dot() -> VecDot<BlockQ4_1> {
    BlockQ4_1::vec_dot
}

pub fn best_q5_0_dot() -> VecDot<BlockQ5_0> {
    BlockQ5_0::vec_dot
}

pub fn best_q5_1_dot() -> VecDot<BlockQ5_1> {
    BlockQ5_1::vec_dot
}

pub fn best_q8_0_dot() -> VecDot<BlockQ8_0> {
    BlockQ8_0::vec_dot
}

pub fn best_q4_k_dot() -> VecDot<BlockQ4K> {
    BlockQ4K::vec_dot
}

pub fn best_q6_k_dot() -> VecDot<BlockQ6K> {
    BlockQ6K::vec_dot
}
