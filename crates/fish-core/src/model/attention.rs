//! Causal grouped-query attention over the f16 KV cache.

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
    let keys = cache.keys(il);
    let values = cache.values(il);
    let (k_dim, v_dim) = (cache.k_dim(), cache.v_dim());
    let group = shape.n_head / shape.n_head_kv;
    let (hd, hdv) = (shape.head_dim, shape.head_dim_v);
    out.par_chunks_mut(hdv).enumerate().for_each(|(idx, o)| {
        let (t, h) = (idx / shape.n_head, idx % shape.n_head);
        let kvh = h / group;
        let p = pos0 + t;
        let first = if shape.window > 0 {
            (p + 1).saturating_sub(shape.window)
        } else {
            0
        };
        // q is rounded to f16 because the keys are f16 (as llama.cpp's f16 dot).
        let qh: Vec<f32> = q[(t * shape.n_head + h) * hd..][..hd]
            .iter()
            .map(|&v| f16::from_f32(v).to_f32())
            .collect();
        // Online softmax with an f16 accumulator, as llama.cpp's CPU flash
        // attention does with f16 values; matching it keeps logits within
        // reach of the reference rather than drifting by rounding.
        let mut krow = vec![0f32; hd];
        let mut vrow = vec![0f32; hdv];
        let mut acc = vec![f16::ZERO; hdv];
        let (mut m, mut sum) = (f32::NEG_INFINITY, 0f32);
        for j in first..=p {
            keys[j * k_dim + kvh * hd..][..hd].convert_to_f32_slice(&mut krow);
            let s = qh.iter().zip(&krow).map(|(a, b)| a * b).sum::<f32>() * shape.scale;
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
            values[j * v_dim + kvh * hdv..][..hdv].convert_to_f32_slice(&mut vrow);
            for (a, &v) in acc.iter_mut().zip(&vrow) {
                *a = f16::from_f32(a.to_f32() + v * vs);
            }
            sum = sum * ms + vs;
        }
        let inv = 1.0 / sum;
        for (o, a) in o.iter_mut().zip(&acc) {
            *o = a.to_f32() * inv;
        }
    });
}
