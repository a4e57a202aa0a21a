//! Runtime selection of the SIMD dot products.
//!
//! Each `best_*` returns the fastest kernel this CPU supports; every kernel
//! computes the same per-block integer sums as the portable one in
//! `blocks`, so results differ only in float accumulation order.

use crate::blocks::{
    BlockFormat, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ6K, BlockQ8_0,
    F16Value, F32Value, VecDot,
};

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod kernels;
#[cfg(test)]
mod tests;

/// The instruction-set level the kernels use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SimdLevel {
    Portable,
    Avx2,
    Avx512Vnni,
}

impl SimdLevel {
    pub fn name(self) -> &'static str {
        match self {
            Self::Portable => "portable",
            Self::Avx2 => "avx2",
            Self::Avx512Vnni => "avx512-vnni",
        }
    }
}

/// The best level this CPU supports, detected once. `FISH_QUANT_SIMD=portable`
/// or `=avx2` caps it (for comparisons).
pub fn simd_level() -> SimdLevel {
    static LEVEL: std::sync::OnceLock<SimdLevel> = std::sync::OnceLock::new();
    *LEVEL.get_or_init(|| {
        let detected = detect();
        match std::env::var("FISH_QUANT_SIMD").as_deref() {
            Ok("portable") => SimdLevel::Portable,
            Ok("avx2") if detected != SimdLevel::Portable => SimdLevel::Avx2,
            _ => detected,
        }
    })
}

#[cfg(target_arch = "x86_64")]
fn detect() -> SimdLevel {
    let avx2 = is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c");
    let vnni = is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni");
    match (avx2, vnni) {
        (true, true) => SimdLevel::Avx512Vnni,
        (true, false) => SimdLevel::Avx2,
        _ => SimdLevel::Portable,
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn detect() -> SimdLevel {
    SimdLevel::Portable
}

/// Defines `best_$name`, choosing between the kernels `$kernel` of the SIMD
/// modules and the portable `vec_dot` of `$B`.
macro_rules! select {
    ($fn_name:ident, $B:ty, $kernel:ident) => {
        pub fn $fn_name() -> VecDot<$B> {
            #[cfg(target_arch = "x86_64")]
            {
                // SAFETY: each kernel is only returned when `simd_level`
                // detected the features it was compiled for.
                match simd_level() {
                    SimdLevel::Avx512Vnni => return |w, a| unsafe { avx512::$kernel(w, a) },
                    SimdLevel::Avx2 => return |w, a| unsafe { avx2::$kernel(w, a) },
                    SimdLevel::Portable => {}
                }
            }
            <$B as BlockFormat>::vec_dot
        }
    };
}

select!(best_f32_dot, F32Value, f32_dot);
select!(best_f16_dot, F16Value, f16_dot);
select!(best_q4_0_dot, BlockQ4_0, q4_0);
select!(best_q4_1_dot, BlockQ4_1, q4_1);
select!(best_q5_0_dot, BlockQ5_0, q5_0);
select!(best_q5_1_dot, BlockQ5_1, q5_1);
select!(best_q8_0_dot, BlockQ8_0, q8_0);
select!(best_q4_k_dot, BlockQ4K, q4_k);
select!(best_q6_k_dot, BlockQ6K, q6_k);
