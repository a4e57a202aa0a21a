//! Scalar forms of the vector arithmetic in llama.cpp's CPU kernels, exact to
//! the bit, for the places where the forward pass must reproduce it: results
//! that get quantised to 8 bits or rounded to f16 next turn a last-bit
//! difference into a flipped rounding, which later layers amplify.

/// Values per vector step in the reference kernels (AVX-512, the machine
/// the reference outputs come from).
pub const LANES: usize = 16;

/// `e^x` as ggml's vectorised `expf`: `x = n ln2 + b` with `n` rounded to
/// nearest (by adding and subtracting 1.5 * 2^23) and ln 2 split into a
/// short high part and a low correction, then a degree-5 polynomial in `b`
/// evaluated with fused multiply-adds, scaled by `2^n`. Beyond `|n| > 192`
/// the result is 0 (negative `n`, including `x = -inf`) or infinity.
#[inline(always)]
pub fn exp_poly(x: f32) -> f32 {
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
    if n.abs() > 192.0 {
        return if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    let b = (-n).mul_add(ln2_lo, (-n).mul_add(ln2_hi, x));
    let u = b * b;
    let hi = c5.mul_add(b, c4).mul_add(u, c3.mul_add(b, c2));
    let j = hi.mul_add(u, c1.mul_add(b, 1.0));
    // j * 2^n with one rounding (as a scale-by-power-of-two instruction
    // does, subnormal and overflowing results included): exact in f64.
    // n is an integer within +-192 (or NaN, which j carries through), so
    // 2^n is built from its exponent bits rather than by a libm call.
    let n_int = if n.is_nan() { 0 } else { n as i64 };
    let pow2 = f64::from_bits(((n_int + 1023) as u64) << 52);
    (j as f64 * pow2) as f32
}

/// Horizontal sum of one vector register the way the reference reduces it:
/// upper half onto lower half, 8, 4, 2, then 1 lanes.
#[inline(always)]
pub fn sum_lanes(mut lanes: [f32; LANES]) -> f32 {
    let mut width = LANES / 2;
    while width > 0 {
        for l in 0..width {
            lanes[l] += lanes[l + width];
        }
        width /= 2;
    }
    lanes[0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_poly_scales_by_powers_of_two_as_libm_exp2() {
        // The result's last step against libm's 2^n, over normal, subnormal
        // (below e^-87) and vanishing results.
        let mut x = -140.0f32;
        while x < 88.0 {
            let n = x.mul_add(f32::from_bits(0x3fb8_aa3b), 12_582_912.0) - 12_582_912.0;
            let pow2 = f64::from_bits(((n as i64 + 1023) as u64) << 52);
            assert_eq!(pow2, (n as f64).exp2(), "2^{n}");
            let a = exp_poly(x);
            // The smallest subnormal is 2^-149 = e^-103.3.
            assert!(a >= 0.0 && (x > -103.0) <= (a > 0.0), "exp({x}) = {a}");
            assert!(x > -104.5 || a == 0.0, "exp({x}) = {a}");
            x += 0.0071;
        }
        assert!(exp_poly(f32::NAN).is_nan());
    }

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
        assert_eq!(exp_poly(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_poly(200.0), f32::INFINITY);
    }

    #[test]
    fn lanes_are_summed_as_halves() {
        // 2^24 has ulp 2: added one by one the ones would vanish; paired
        // first (1+1 = 2 per lane pair) they survive, except the one added
        // directly to 2^24 in the first step (2^24 + 1 rounds to even).
        let mut lanes = [1f32; LANES];
        lanes[0] = 16_777_216.0;
        assert_eq!(sum_lanes(lanes), 16_777_216.0 + 14.0);
    }
}
