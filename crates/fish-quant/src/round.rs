//! The rounding rules the quantisers share.

/// Round to nearest with ties to even, returned as an integer.
///
/// This is what ggml's "add 1.5 * 2^23" trick computes for every value it
/// is used on, so quantised codes match bit for bit.
#[inline(always)]
pub(crate) fn nearest_int(x: f32) -> i32 {
    x.round_ties_even() as i32
}

/// Round half away from zero (C `roundf`).
#[inline(always)]
pub(crate) fn round_half_away(x: f32) -> f32 {
    x.round()
}
