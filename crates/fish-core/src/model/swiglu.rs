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

/// Values per vector step of the reference kernel.
const LANES: usize = 16;

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

/// `e^x` as ggml's vectorised `expf`: `x = n ln2 + b` with `n` rounded to
/// nearest (by adding and subtracting 1.5 * 2^23) and ln 2 split into a
/// short high part and a low correction, then a degree-5 polynomial in `b`
/// evaluated with fused multiply-adds, scaled by `2^n`. Beyond
/// `|n| > 192` the result is 0 (negative `n`) or infinity.
#[inline(always)]
fn exp_poly(x: f32) -> f32 {
    const ROUND: f32 = 12_582_912.0; // 1.5 * 2^23
    let log2e = f32::from_bits(0x3fb8_aa3b);
    let ln2_hi = f32::from_bits(0x3f31_7200);
    let ln2_lo = f32::from_bits(0x35bf_be8e);
    let c5 = f32::from_bits(0x3c07_2010);
    let c4 = f32::from_bits(0x3d2b_9f17);
    let c3 = f32::from_bits(0x3e2a_af33);
    let c2 = f32::from_bits(0x3eff_fedb);
    let c1 = f32::from_bits(0x3f7f_fff6);

    let n = x.mul_add(log2e, ROUND) - ROUND;
    let b = (-n).mul_add(ln2_lo, (-n).mul_add(ln2_hi, x));
    let u = b * b;
    let hi = c5.mul_add(b, c4).mul_add(u, c3.mul_add(b, c2));
    let j = hi.mul_add(u, c1.mul_add(b, 1.0));
    if n.abs() > 192.0 {
        return if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    // j * 2^n with one rounding (as a scale-by-power-of-two instruction
    // does, subnormal and overflowing results included): exact in f64.
    (j as f64 * (n as f64).exp2()) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_poly_is_within_two_ulps_of_libm() {
        let mut x = -87.0f32;
        while x < 88.0 {
            let (a, b) = (exp_poly(x), x.exp());
            let ulps = (a.to_bits() as i64 - b.to_bits() as i64).abs();
            assert!(ulps <= 2, "exp({x}): {a} vs {b}");
            x += 0.013;
        }
        assert_eq!(exp_poly(-200.0), 0.0);
        assert_eq!(exp_poly(200.0), f32::INFINITY);
    }

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
