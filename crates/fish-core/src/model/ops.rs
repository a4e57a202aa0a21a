//! Element-wise and per-row operations of the forward pass, written to follow
//! ggml's CPU numerics (f64 sums in RMSNorm, iterated RoPE angles).

use super::config::RopeStyle;

/// In place: x = x / rms(x) * w, per row of `w.len()` values.
pub fn rms_norm_rows(x: &mut [f32], w: &[f32], eps: f32) {
    for row in x.chunks_exact_mut(w.len()) {
        let sum: f64 = row.iter().map(|&v| (v * v) as f64).sum();
        let mean = (sum / row.len() as f64) as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        for (v, &g) in row.iter_mut().zip(w) {
            *v = *v * scale * g;
        }
    }
}

/// Writes rmsnorm(x) * w into `out` (same shape as `x`).
pub fn rms_norm_into(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    out.copy_from_slice(x);
    rms_norm_rows(out, w, eps);
}

pub fn add_bias_rows(x: &mut [f32], b: &[f32]) {
    for row in x.chunks_exact_mut(b.len()) {
        for (v, &bb) in row.iter_mut().zip(b) {
            *v += bb;
        }
    }
}

pub fn add_in_place(x: &mut [f32], y: &[f32]) {
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// GELU with the tanh approximation (as ggml's gelu).
pub fn gelu(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    const COEF_A: f32 = 0.044_715;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + COEF_A * x * x)).tanh())
}

/// cos/sin of the RoPE angles for one position: `n_rot / 2` pairs.
pub struct RopeAngles {
    pub cos: Vec<f32>,
    pub sin: Vec<f32>,
}

impl RopeAngles {
    /// Angles pos * base^(-2i/n_rot) * freq_scale, with the per-pair factor
    /// accumulated by repeated multiplication as ggml does.
    pub fn new(pos: usize, n_rot: usize, base: f32, freq_scale: f32) -> RopeAngles {
        let theta_scale = base.powf(-2.0 / n_rot as f32);
        let mut theta = pos as f32;
        let mut cos = Vec::with_capacity(n_rot / 2);
        let mut sin = Vec::with_capacity(n_rot / 2);
        for _ in 0..n_rot / 2 {
            let t = theta * freq_scale;
            cos.push(t.cos());
            sin.push(t.sin());
            theta *= theta_scale;
        }
        RopeAngles { cos, sin }
    }
}

/// Rotates the first `2 * angles.cos.len()` dimensions of each head in `x`
/// (one token's heads, `head_dim` values each).
///
/// Each output is one fused multiply-add over one rounded product,
/// `fma(x0, c, -(x1 * s))` and `fma(x0, s, x1 * c)`: that is what the C
/// compiler makes of ggml's `x0*c - x1*s` and `x0*s + x1*c`, and the last
/// bit matters because q and k go on to f16 and into the softmax.
pub fn rope_heads(x: &mut [f32], head_dim: usize, style: RopeStyle, angles: &RopeAngles) {
    let half = angles.cos.len();
    for head in x.chunks_exact_mut(head_dim) {
        for i in 0..half {
            let (a, b) = match style {
                RopeStyle::Adjacent => (2 * i, 2 * i + 1),
                RopeStyle::Neox => (i, i + half),
            };
            let (x0, x1) = (head[a], head[b]);
            let (c, s) = (angles.cos[i], angles.sin[i]);
            head[a] = x0.mul_add(c, -(x1 * s));
            head[b] = x0.mul_add(s, x1 * c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_gives_unit_rms() {
        let mut x = vec![1.0, 2.0, 3.0, 4.0];
        rms_norm_rows(&mut x, &[1.0; 4], 0.0);
        let rms = (x.iter().map(|v| v * v).sum::<f32>() / 4.0).sqrt();
        assert!((rms - 1.0).abs() < 1e-6);
    }

    #[test]
    fn rope_at_position_zero_is_identity_and_preserves_norm() {
        let mut x: Vec<f32> = (0..8).map(|i| i as f32 - 3.5).collect();
        let orig = x.clone();
        rope_heads(
            &mut x,
            8,
            RopeStyle::Neox,
            &RopeAngles::new(0, 8, 10000.0, 1.0),
        );
        assert_eq!(x, orig);
        rope_heads(
            &mut x,
            8,
            RopeStyle::Adjacent,
            &RopeAngles::new(17, 8, 10000.0, 1.0),
        );
        let n0: f32 = orig.iter().map(|v| v * v).sum();
        let n1: f32 = x.iter().map(|v| v * v).sum();
        assert!((n0 - n1).abs() < 1e-4);
        assert_ne!(x, orig);
    }

    #[test]
    fn activations_match_closed_forms() {
        assert!((silu(1.0) - 0.731_058_6).abs() < 1e-6);
        assert!((gelu(1.0) - 0.841_192).abs() < 1e-5);
        assert_eq!(gelu(0.0), 0.0);
    }
}
