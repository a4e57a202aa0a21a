//! SwiGLU (`silu(gate) * up`) with the SiLU that llama.cpp's CPU backend
//! computes, bit for bit.
//!
//! ggml evaluates SiLU 16 values at a time (AVX-512; the reference outputs
//! come from such a machine) as `x / (1 + e^-x)`, with `e^t` from a range
//! reduction and a short polynomial rather than libm's `expf`; values past the
//! last multiple of 16 in a row go through `expf`. The two differ by an ulp
//! here and there. That ulp matters: the product is quantised to 8 bits for
//! the down projection, and one flipped rounding there is amplified by the
//! later layers into logits that differ by a few percent.

use super::ops::silu;
use super::vec_math::{exp_poly, LANES};

/// `gate = silu(gate) * up` for one row (`gate.len() == up.len()`).
pub fn swiglu_row(gate: &mut [f32], up: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU supports FMA, checked just above.
        return unsafe { swiglu_row_fma(gate, up) };
    }
    swiglu_row_any(gate, up);
}

/// The same code compiled with FMA instructions, so that `mul_add` is one
/// instruction rather than a libm call.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
unsafe fn swiglu_row_fma(gate: &mut [f32], up: &[f32]) {
    swiglu_row_any(gate, up);
}

#[inline(always)]
fn swiglu_row_any(gate: &mut [f32], up: &[f32]) {
    let n_vec = gate.len() / LANES * LANES;
    let (g_vec, g_tail) = gate.split_at_mut(n_vec);
    let (u_vec, u_tail) = up.split_at(n_vec);
    for (g, &u) in g_vec.iter_mut().zip(u_vec) {
        *g = silu_poly(*g) * u;
    }
    for (g, &u) in g_tail.iter_mut().zip(u_tail) {
        *g = silu(*g) * u;
    }
}

/// `x / (1 + e^-x)` with [`exp_poly`].
#[inline(always)]
fn silu_poly(x: f32) -> f32 {
    x / (1.0 + exp_poly(0.0 - x))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_use_the_polynomial_for_whole_steps_and_libm_for_the_tail() {
        // Inputs where the two SiLUs disagree in the last bit exist; the
        // row function must pick per position, not per row.
        let xs: Vec<f32> = (0..4000).map(|i| -8.0 + i as f32 * 0.004).collect();
        let x = *xs
            .iter()
            .find(|&&x| silu_poly(x) != silu(x))
            .expect("a value where they differ");
        let mut gate = vec![x; LANES + 1];
        swiglu_row(&mut gate, &[1.0; LANES + 1]);
        assert_eq!(gate[0], silu_poly(x));
        assert_eq!(gate[LANES], silu(x));
        assert_ne!(gate[0], gate[LANES]);
    }
}
