//! Causal grouped-query attention over the f16 KV cache.
//!
//! The arithmetic follows llama.cpp's CPU flash attention (its default on the
//! CPU) step by step, because the result feeds an 8-bit quantisation: a
//! last-bit difference here can flip a rounding there, and the model
//! amplifies such flips into logits that differ by percents. The reference
//! has two kernels and picks by batch size, so this does too:
//! - fewer than [`TILED_MIN_TOKENS`] tokens ([`one_key_at_a_time`]): the
//!   query rounded to f16, q.k in the order of ggml's f16 dot, an online
//!   softmax over single keys with an f16 value accumulator;
//! - more ([`tiles_of_keys`]): an f32 query, keys in tiles of [`KEY_TILE`]
//!   positions, q.k and p.v as sequential fused multiply-adds (the reference's
//!   small GEMM), the softmax of a tile with the vectorised exp polynomial and
//!   an f32 value accumulator. `attention_tiles` runs it a block of rows at
//!   a time; `tiles_of_keys` states it for one row.

use half::f16;
use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;

use super::attention_tiles::attend_tiled;
use super::kv_cache::KvCache;
#[cfg(test)]
use super::vec_math::exp_poly;
use super::vec_math::{sum_lanes, LANES};

/// Batches of at least this many tokens take the tiled kernel.
pub const TILED_MIN_TOKENS: usize = 64;
/// Key positions per tile of the tiled kernel (tiles start at position 0).
pub(super) const KEY_TILE: usize = 64;

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
    let n_tok = q.len() / (shape.n_head * hd);
    if n_tok >= TILED_MIN_TOKENS {
        return attend_tiled(shape, cache, il, q, pos0, out);
    }
    let keys = Keys { shape, cache, il };
    out.par_chunks_mut(shape.head_dim_v)
        .enumerate()
        .for_each(|(idx, o)| {
            let (t, h) = (idx / shape.n_head, idx % shape.n_head);
            let p = pos0 + t;
            let row = QueryRow {
                q: &q[(t * shape.n_head + h) * hd..][..hd],
                kv_head: h / (shape.n_head / shape.n_head_kv),
                first: if shape.window > 0 {
                    (p + 1).saturating_sub(shape.window)
                } else {
                    0
                },
                last: p,
            };
            attend_row(&keys, &row, o);
        });
}

/// The cached keys and values of one layer.
struct Keys<'a> {
    shape: &'a AttentionShape,
    cache: &'a KvCache,
    il: usize,
}

impl Keys<'_> {
    fn key(&self, pos: usize, kv_head: usize, out: &mut [f32]) {
        let (k_dim, hd) = (self.cache.k_dim(), self.shape.head_dim);
        self.cache.keys(self.il)[pos * k_dim + kv_head * hd..][..hd].convert_to_f32_slice(out);
    }

    fn value(&self, pos: usize, kv_head: usize, out: &mut [f32]) {
        let (v_dim, hdv) = (self.cache.v_dim(), self.shape.head_dim_v);
        self.cache.values(self.il)[pos * v_dim + kv_head * hdv..][..hdv].convert_to_f32_slice(out);
    }
}

/// One query head of one token, attending to positions `first..=last`.
struct QueryRow<'a> {
    q: &'a [f32],
    kv_head: usize,
    first: usize,
    last: usize,
}

fn attend_row(keys: &Keys<'_>, row: &QueryRow<'_>, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU supports FMA, checked just above.
        return unsafe { attend_row_fma(keys, row, out) };
    }
    one_key_at_a_time(keys, row, out);
}

/// The same code compiled with FMA instructions, so that `mul_add` is one
/// instruction rather than a libm call.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
unsafe fn attend_row_fma(keys: &Keys<'_>, row: &QueryRow<'_>, out: &mut [f32]) {
    one_key_at_a_time(keys, row, out);
}

/// The reference's per-row kernel: online softmax key by key, the query
/// rounded to f16, an f16 value accumulator updated with a fused
/// multiply-add, the running sum as `fma(sum, ms, vs)` (the C compiler
/// contracts `sum * ms + vs`), the output the accumulator times `1 / sum`.
#[inline(always)]
fn one_key_at_a_time(keys: &Keys<'_>, row: &QueryRow<'_>, out: &mut [f32]) {
    let (hd, hdv) = (keys.shape.head_dim, keys.shape.head_dim_v);
    let qh: Vec<f32> = row.q.iter().map(|&v| f16::from_f32(v).to_f32()).collect();
    let mut krow = vec![0f32; hd];
    let mut vrow = vec![0f32; hdv];
    // The f16 accumulator is held widened to f32 and rounded to f16 after
    // every update with whole-slice conversions (vectorised, unlike one
    // value at a time); the values are the same as an f16 array's.
    let mut acc = vec![0f32; hdv];
    let mut acc16 = vec![f16::ZERO; hdv];
    let round_to_f16 = |acc: &mut [f32], acc16: &mut [f16]| {
        acc16.convert_from_f32_slice(acc);
        acc16.convert_to_f32_slice(acc);
    };
    let (mut m, mut sum) = (f32::NEG_INFINITY, 0f32);
    for j in row.first..=row.last {
        keys.key(j, row.kv_head, &mut krow);
        let s = dot_f16_products(&qh, &krow) * keys.shape.scale;
        // A new maximum rescales what was accumulated (ms < 1) and the new
        // value enters with weight 1; otherwise it enters with e^(s - m).
        let (mut ms, mut vs) = (1f32, 1f32);
        if s > m {
            let m_old = m;
            m = s;
            ms = (m_old - m).exp();
            acc.iter_mut().for_each(|a| *a *= ms);
            round_to_f16(&mut acc, &mut acc16);
        } else {
            vs = (s - m).exp();
        }
        keys.value(j, row.kv_head, &mut vrow);
        for (a, &v) in acc.iter_mut().zip(&vrow) {
            *a = v.mul_add(vs, *a);
        }
        round_to_f16(&mut acc, &mut acc16);
        sum = sum.mul_add(ms, vs);
    }
    let inv = 1.0 / sum;
    for (o, a) in out.iter_mut().zip(&acc) {
        *o = a * inv;
    }
}

/// The reference's kernel for large batches, seen from one query row: keys
/// in tiles of [`KEY_TILE`] positions from position 0 (tiles with no visible
/// key are skipped); per tile the scores are sequential fused multiply-adds
/// of the f32 query with f32-widened keys, times the scale; the running
/// maximum moves to the tile's maximum (rescaling accumulator and sum by
/// libm's `e^(old - new)`); the weights come from [`exp_poly`], summed 16 at
/// a time in f64 and added to the f32 sum; the f32 accumulator takes each
/// weighted value in position order as a fused multiply-add.
///
/// This is the specification of `attention_tiles`, which computes the same
/// values for a block of rows at once; the tests hold the two to the bit.
#[cfg(test)]
fn tiles_of_keys(keys: &Keys<'_>, row: &QueryRow<'_>, out: &mut [f32]) {
    let (hd, hdv) = (keys.shape.head_dim, keys.shape.head_dim_v);
    let mut krow = vec![0f32; hd];
    let mut vrow = vec![0f32; hdv];
    let mut acc = vec![0f32; hdv];
    let mut scores = [f32::NEG_INFINITY; KEY_TILE];
    let (mut m, mut sum) = (f32::NEG_INFINITY, 0f32);
    for tile_start in (row.first / KEY_TILE * KEY_TILE..=row.last).step_by(KEY_TILE) {
        let visible = row.first.max(tile_start)..=row.last.min(tile_start + KEY_TILE - 1);
        scores.fill(f32::NEG_INFINITY);
        for j in visible.clone() {
            keys.key(j, row.kv_head, &mut krow);
            let s = row
                .q
                .iter()
                .zip(&krow)
                .fold(0f32, |acc, (&q, &k)| q.mul_add(k, acc));
            scores[j - tile_start] = s * keys.shape.scale;
        }
        let tile_max = scores.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        let m_new = m.max(tile_max);
        if m_new > m {
            let ms = (m - m_new).exp();
            acc.iter_mut().for_each(|a| *a *= ms);
            sum *= ms;
        }
        m = m_new;
        let mut tile_sum = 0f64;
        for chunk in scores.chunks_exact_mut(LANES) {
            let mut lanes = [0f32; LANES];
            for (l, s) in lanes.iter_mut().zip(chunk.iter_mut()) {
                *s = exp_poly(*s - m);
                *l = *s;
            }
            tile_sum += sum_lanes(lanes) as f64;
        }
        sum = (sum as f64 + tile_sum) as f32;
        for j in visible {
            keys.value(j, row.kv_head, &mut vrow);
            let w = scores[j - tile_start];
            for (a, &v) in acc.iter_mut().zip(&vrow) {
                *a = v.mul_add(w, *a);
            }
        }
    }
    let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
    for (o, a) in out.iter_mut().zip(&acc) {
        *o = a * inv;
    }
}

/// Dot product of f16-valued vectors in ggml's AVX-512 order: 64-wide steps
/// into four 16-lane accumulators (products of f16 values are exact in f32,
/// so the fused multiply-add only rounds the sums), the accumulators folded
/// pairwise (0+2 and 1+3, then the two), the lanes reduced by [`sum_lanes`],
/// and a tail past the last multiple of 64 summed in f64.
#[inline(always)]
fn dot_f16_products(a: &[f32], b: &[f32]) -> f32 {
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
        sum = sum_lanes(lanes) as f64;
    }
    for (x, y) in a[np..].iter().zip(&b[np..]) {
        sum += (x * y) as f64;
    }
    sum as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A one-layer cache of `n` positions with varied keys and values.
    fn cache_with(n: usize, hd: usize) -> KvCache {
        let mut cache = KvCache::new(1, n, hd, hd);
        for pos in 0..n {
            let k: Vec<f32> = (0..hd)
                .map(|i| ((pos * 7 + i * 3) % 11) as f32 * 0.1 - 0.5)
                .collect();
            let v: Vec<f32> = (0..hd)
                .map(|i| ((pos * 5 + i) % 13) as f32 * 0.05 - 0.3)
                .collect();
            cache.store(0, pos, &k, &v);
        }
        cache.set_len(n);
        cache
    }

    #[test]
    fn both_kernels_compute_the_same_attention() {
        let hd = 64;
        let cache = cache_with(200, hd);
        let shape = AttentionShape {
            n_head: 1,
            n_head_kv: 1,
            head_dim: hd,
            head_dim_v: hd,
            scale: 0.125,
            window: 0,
        };
        let keys = Keys {
            shape: &shape,
            cache: &cache,
            il: 0,
        };
        let q: Vec<f32> = (0..hd).map(|i| (i % 9) as f32 * 0.2 - 0.8).collect();
        // Ranges inside one key tile, across tiles, and starting mid-tile
        // (a sliding window).
        for (first, last) in [(0, 10), (0, 199), (70, 150), (64, 127)] {
            let row = QueryRow {
                q: &q,
                kv_head: 0,
                first,
                last,
            };
            let (mut a, mut b) = (vec![0f32; hd], vec![0f32; hd]);
            one_key_at_a_time(&keys, &row, &mut a);
            tiles_of_keys(&keys, &row, &mut b);
            for (x, y) in a.iter().zip(&b) {
                assert!((x - y).abs() < 2e-3, "{first}..={last}: {x} vs {y}");
            }
            // Only the visible positions count: a lone key gives its value.
            let lone = QueryRow { first: last, ..row };
            tiles_of_keys(&keys, &lone, &mut b);
            let mut v = vec![0f32; hd];
            keys.value(last, 0, &mut v);
            assert_eq!(b, v);
        }
    }

    #[test]
    fn row_blocks_compute_the_per_row_kernel_to_the_bit() {
        // Grouped heads (4 query heads on 2 key-value heads), a batch of 70
        // tokens after 50 cached positions (key tiles from 0 to 119, token
        // blocks cut mid-tile), with and without a sliding window.
        let (hd, n_head, n_head_kv, pos0, n_tok) = (64, 4, 2, 50, 70);
        let n_pos = pos0 + n_tok;
        let mut cache = KvCache::new(1, n_pos, n_head_kv * hd, n_head_kv * hd);
        let wave = |i: usize, f: f32| ((i as f32 * f).sin() * 1.7) - 0.2;
        for pos in 0..n_pos {
            let k: Vec<f32> = (0..n_head_kv * hd)
                .map(|i| wave(pos * 131 + i, 0.37))
                .collect();
            let v: Vec<f32> = (0..n_head_kv * hd)
                .map(|i| wave(pos * 71 + i, 0.23))
                .collect();
            cache.store(0, pos, &k, &v);
        }
        cache.set_len(n_pos);
        let q: Vec<f32> = (0..n_tok * n_head * hd)
            .map(|i| wave(i, 0.11) * 2.0)
            .collect();
        for window in [0, 40] {
            let shape = AttentionShape {
                n_head,
                n_head_kv,
                head_dim: hd,
                head_dim_v: hd,
                scale: 0.125,
                window,
            };
            let mut out = vec![f32::NAN; n_tok * n_head * hd];
            attend(&shape, &cache, 0, &q, pos0, &mut out);
            let keys = Keys {
                shape: &shape,
                cache: &cache,
                il: 0,
            };
            let mut expected = vec![0f32; hd];
            for t in 0..n_tok {
                for h in 0..n_head {
                    let p = pos0 + t;
                    let row = QueryRow {
                        q: &q[(t * n_head + h) * hd..][..hd],
                        kv_head: h / (n_head / n_head_kv),
                        first: if window > 0 {
                            (p + 1).saturating_sub(window)
                        } else {
                            0
                        },
                        last: p,
                    };
                    tiles_of_keys(&keys, &row, &mut expected);
                    let got = &out[(t * n_head + h) * hd..][..hd];
                    let same = got
                        .iter()
                        .zip(&expected)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "window {window}, token {t}, head {h}");
                }
            }
        }
    }

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
