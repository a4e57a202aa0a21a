//! Causal grouped-query attention over the f16 KV cache.
//!
//! The arithmetic follows llama.cpp's CPU flash attention for one query row
//! (its default on the CPU) step by step, because the result feeds an 8-bit
//! quantisation: a last-bit difference here can flip a rounding there, and the
//! model amplifies such flips into logits that differ by percents.
//! - the query is rounded to f16 (the keys' dot-product format);
//! - q.k is summed in the order of ggml's AVX-512 f16 dot ([`dot_f16_products`]);
//! - online softmax over keys in position order, the value accumulator kept in
//!   f16 and updated with a fused multiply-add, the running sum as
//!   `fma(sum, ms, vs)` (the C compiler contracts `sum * ms + vs`);
//! - the output is the accumulator times `1 / sum`.

use half::f16;
use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;

use super::kv_cache::KvCache;

pub struct AttentionShape {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub head_dim_v: usize,
    pub scale: f32,
    /// Sliding window (0: attend to every earlier position).
    pub window: usize,
}

/// `q`: n_tok rows of n_head*head_dim (token t sits at position pos0 + t);
/// `out`: n_tok rows of n_head*head_dim_v. Keys and values for positions
/// `..pos0 + n_tok` must already be in the cache.
pub fn attend(
    shape: &AttentionShape,
    cache: &KvCache,
    il: usize,
    q: &[f32],
    pos0: usize,
    out: &mut [f32],
) {
    let hd = shape.head_dim;
    out.par_chunks_mut(shape.head_dim_v)
        .enumerate()
        .for_each(|(idx, o)| {
            let (t, h) = (idx / shape.n_head, idx % shape.n_head);
            let row = QueryRow {
                q: &q[(t * shape.n_head + h) * hd..][..hd],
                kv_head: h / (shape.n_head / shape.n_head_kv),
                pos: pos0 + t,
            };
            attend_row(shape, cache, il, &row, o);
        });
}

/// One query head of one token.
struct QueryRow<'a> {
    q: &'a [f32],
    kv_head: usize,
    pos: usize,
}

fn attend_row(
    shape: &AttentionShape,
    cache: &KvCache,
    il: usize,
    row: &QueryRow<'_>,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU supports FMA, checked just above.
        return unsafe { attend_row_fma(shape, cache, il, row, out) };
    }
    attend_row_any(shape, cache, il, row, out);
}

/// The same code compiled with FMA instructions, so that `mul_add` is one
/// instruction rather than a libm call.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
unsafe fn attend_row_fma(
    shape: &AttentionShape,
    cache: &KvCache,
    il: usize,
    row: &QueryRow<'_>,
    out: &mut [f32],
) {
    attend_row_any(shape, cache, il, row, out);
}

#[inline(always)]
fn attend_row_any(
    shape: &AttentionShape,
    cache: &KvCache,
    il: usize,
    row: &QueryRow<'_>,
    out: &mut [f32],
) {
    let (keys, values) = (cache.keys(il), cache.values(il));
    let (k_dim, v_dim) = (cache.k_dim(), cache.v_dim());
    let (hd, hdv) = (shape.head_dim, shape.head_dim_v);
    let p = row.pos;
    let first = if shape.window > 0 {
        (p + 1).saturating_sub(shape.window)
    } else {
        0
    };
    let qh: Vec<f32> = row.q.iter().map(|&v| f16::from_f32(v).to_f32()).collect();
    let mut krow = vec![0f32; hd];
    let mut vrow = vec![0f32; hdv];
    let mut acc = vec![f16::ZERO; hdv];
    let (mut m, mut sum) = (f32::NEG_INFINITY, 0f32);
    for j in first..=p {
        keys[j * k_dim + row.kv_head * hd..][..hd].convert_to_f32_slice(&mut krow);
        let s = dot_f16_products(&qh, &krow) * shape.scale;
        // A new maximum rescales what was accumulated (ms < 1) and the new
        // value enters with weight 1; otherwise it enters with e^(s - m).
        let (mut ms, mut vs) = (1f32, 1f32);
        if s > m {
            let m_old = m;
            m = s;
            ms = (m_old - m).exp();
            for a in acc.iter_mut() {
                *a = f16::from_f32(a.to_f32() * ms);
            }
        } else {
            vs = (s - m).exp();
        }
        values[j * v_dim + row.kv_head * hdv..][..hdv].convert_to_f32_slice(&mut vrow);
        for (a, &v) in acc.iter_mut().zip(&vrow) {
            *a = f16::from_f32(v.mul_add(vs, a.to_f32()));
        }
        sum = sum.mul_add(ms, vs);
    }
    let inv = 1.0 / sum;
    for (o, a) in out.iter_mut().zip(&acc) {
        *o = a.to_f32() * inv;
    }
}

/// Dot product of f16-valued vectors in ggml's AVX-512 order: 64-wide steps
/// into four 16-lane accumulators (products of f16 values are exact in f32,
/// so the fused multiply-add only rounds the sums), the accumulators folded
/// pairwise (0+2 and 1+3, then the two), the 16 lanes reduced by halves
/// (8, 4, 2, 1), and a tail past the last multiple of 64 summed in f64.
#[inline(always)]
fn dot_f16_products(a: &[f32], b: &[f32]) -> f32 {
    const LANES: usize = 16;
    const STEP: usize = 4 * LANES;
    let np = a.len() / STEP * STEP;
    let mut sum = 0f64;
    if np > 0 {
        let mut acc = [[0f32; LANES]; 4];
        for (ca, cb) in a[..np].chunks_exact(STEP).zip(b[..np].chunks_exact(STEP)) {
            for (k, lane_acc) in acc.iter_mut().enumerate() {
                for (l, v) in lane_acc.iter_mut().enumerate() {
                    *v = ca[k * LANES + l].mul_add(cb[k * LANES + l], *v);
                }
            }
        }
        let mut lanes = [0f32; LANES];
        for (l, v) in lanes.iter_mut().enumerate() {
            *v = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
        }
        let mut width = LANES / 2;
        while width > 0 {
            for l in 0..width {
                lanes[l] += lanes[l + width];
            }
            width /= 2;
        }
        sum = lanes[0] as f64;
    }
    for (x, y) in a[np..].iter().zip(&b[np..]) {
        sum += (x * y) as f64;
    }
    sum as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_sums_in_the_reference_order() {
        // Lane 0 of accumulator 0 holds 2^24 (ulp 2), every other product is
        // 1. Summed left to right each 1 is lost against 2^24; in the
        // reference's tree the ones are summed among themselves first and
        // only one is lost (2^24 + 1 rounds to even in lane 0).
        let mut a = vec![1f32; 64];
        a[0] = 16_777_216.0;
        let b = vec![1f32; 64];
        assert_eq!(dot_f16_products(&a, &b), 16_777_216.0 + 62.0);
        let sequential: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        assert_eq!(sequential, 16_777_216.0);
        // A tail past 64 values is added in f64 and rounded once at the end:
        // 2^24 + 63 rounds to the even 2^24 + 64.
        let mut c = a.clone();
        c.push(1.0);
        assert_eq!(dot_f16_products(&c, &[1f32; 65]), 16_777_216.0 + 64.0);
    }
}
