//! Maps a runtime [`GgmlType`] to its block struct.

/// Runs `$body` with `$B` bound to the block type of `$ty`, or evaluates
/// `$otherwise` for types this crate does not implement.
macro_rules! with_block_type {
    ($ty:expr, $B:ident => $body:expr, _ => $otherwise:expr) => {{
        use fish_gguf::GgmlType as T;
        use $crate::blocks::*;
        match $ty {
            T::F32 => {
                type $B = F32Value;
                $body
            }
            T::F16 => {
                type $B = F16Value;
                $body
            }
            T::BF16 => {
                type $B = Bf16Value;
                $body
            }
            T::Q4_0 => {
                type $B = BlockQ4_0;
                $body
            }
            T::Q4_1 => {
                type $B = BlockQ4_1;
                $body
            }
            T::Q5_0 => {
                type $B = BlockQ5_0;
                $body
            }
            T::Q5_1 => {
                type $B = BlockQ5_1;
                $body
            }
            T::Q8_0 => {
                type $B = BlockQ8_0;
                $body
            }
            T::Q2_K => {
                type $B = BlockQ2K;
                $body
            }
            T::Q3_K => {
                type $B = BlockQ3K;
                $body
            }
            T::Q4_K => {
                type $B = BlockQ4K;
                $body
            }
            T::Q5_K => {
                type $B = BlockQ5K;
                $body
            }
            T::Q6_K => {
                type $B = BlockQ6K;
                $body
            }
            _ => $otherwise,
        }
    }};
}
pub(crate) use with_block_type;
