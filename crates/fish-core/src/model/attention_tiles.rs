//! The tiled attention kernel for batches of [`TILED_MIN_TOKENS`] tokens or
//! more, computed a block of query rows at a time.
//!
//! Every query row does exactly the arithmetic of the per-row description
//! in `attention` (sequential fused multiply-adds per score, the tile's
//! softmax with the exp polynomial summed in f64, fused multiply-adds of the
//! weighted values in position order), so the result is bit-identical to
//! it. What changes is the work around that arithmetic: the rows of one
//! key-value head and a block of tokens share each key tile, which is
//! widened from f16 once (keys transposed, so that a tile's 64 scores are
//! 64 independent lanes of one multiply-add chain instead of 64 chains run
//! one after the other), and the vectorisable loops are compiled for AVX2.
//!
//! [`TILED_MIN_TOKENS`]: super::attention::TILED_MIN_TOKENS

use rayon::prelude::*;

use super::attention::{AttentionShape, KEY_TILE};
use super::kv_cache::KvCache;
use super::vec_math::{exp_poly, sum_lanes, LANES};

/// Query tokens per task: small enough that the causal triangle splits
/// into balanced tasks, large enough that a widened key tile serves many
/// rows.
const TOKENS_PER_TASK: usize = 16;

/// One task's inputs: the query rows of tokens `t0..t1` for the query heads
/// of key-value head `kv_head`.
struct Task<'a> {
    shape: &'a AttentionShape,
    cache: &'a KvCache,
    il: usize,
    q: &'a [f32],
    pos0: usize,
    kv_head: usize,
    t0: usize,
    t1: usize,
}

/// Same contract as [`super::attention::attend`], for the tiled kernel.
pub(super) fn attend_tiled(
    shape: &AttentionShape,
    cache: &KvCache,
    il: usize,
    q: &[f32],
    pos0: usize,
    out: &mut [f32],
) {
    let n_tok = q.len() / (shape.n_head * shape.head_dim);
    let group = shape.n_head / shape.n_head_kv;
    let blocks = n_tok.div_ceil(TOKENS_PER_TASK);
    let results: Vec<Vec<f32>> = (0..shape.n_head_kv * blocks)
        .into_par_iter()
        .map(|i| {
            let t0 = (i % blocks) * TOKENS_PER_TASK;
            let task = Task {
                shape,
                cache,
                il,
                q,
                pos0,
                kv_head: i / blocks,
                t0,
                t1: (t0 + TOKENS_PER_TASK).min(n_tok),
            };
            run_task(&task)
        })
        .collect();
    let hdv = shape.head_dim_v;
    for (i, rows) in results.iter().enumerate() {
        let (kv_head, t0) = (i / blocks, (i % blocks) * TOKENS_PER_TASK);
        for (r, row) in rows.chunks_exact(hdv).enumerate() {
            let (t, h) = (t0 + r / group, kv_head * group + r % group);
            out[(t * shape.n_head + h) * hdv..][..hdv].copy_from_slice(row);
        }
    }
}

fn run_task(task: &Task<'_>) -> Vec<f32> {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("f16c")
    {
        // SAFETY: the CPU has the features, checked just above.
        return unsafe { run_task_avx2(task) };
    }
    run_task_any(task)
}

/// The same code compiled for AVX2 with FMA and F16C: the lane loops become
/// vector instructions, `mul_add` one instruction, the f16 widening `vcvtph2ps`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run_task_avx2(task: &Task<'_>) -> Vec<f32> {
    run_task_any(task)
}

/// The running softmax state of one query row.
struct RowState {
    first: usize,
    last: usize,
    m: f32,
    sum: f32,
}

/// Returns the task's output rows, token-major (`(t - t0) * group + h`),
/// `head_dim_v` values each.
#[inline(always)]
fn run_task_any(task: &Task<'_>) -> Vec<f32> {
    let shape = task.shape;
    let (hd, hdv) = (shape.head_dim, shape.head_dim_v);
    let group = shape.n_head / shape.n_head_kv;
    let n_rows = (task.t1 - task.t0) * group;
    let mut state: Vec<RowState> = (0..n_rows)
        .map(|r| {
            let p = task.pos0 + task.t0 + r / group;
            RowState {
                first: if shape.window > 0 {
                    (p + 1).saturating_sub(shape.window)
                } else {
                    0
                },
                last: p,
                m: f32::NEG_INFINITY,
                sum: 0.0,
            }
        })
        .collect();
    let mut acc = vec![0f32; n_rows * hdv];
    // The widened tile: keys transposed (`kt[d * KEY_TILE + j]`), values
    // by position (`vt[j * hdv + d]`).
    let mut kt = vec![0f32; hd * KEY_TILE];
    let mut vt = vec![0f32; KEY_TILE * hdv];
    let mut krow = vec![0f32; hd];
    let first = state.iter().map(|s| s.first).min().unwrap_or(0);
    let last = state.iter().map(|s| s.last).max().unwrap_or(0);
    let (k_dim, v_dim) = (task.cache.k_dim(), task.cache.v_dim());
    let keys = &task.cache.keys(task.il);
    let values = &task.cache.values(task.il);
    for tile_start in (first / KEY_TILE * KEY_TILE..=last).step_by(KEY_TILE) {
        let n_pos = (last + 1 - tile_start).min(KEY_TILE);
        kt.fill(0.0);
        for j in 0..n_pos {
            let pos = tile_start + j;
            widen(&keys[pos * k_dim + task.kv_head * hd..][..hd], &mut krow);
            for (d, &k) in krow.iter().enumerate() {
                kt[d * KEY_TILE + j] = k;
            }
            widen(
                &values[pos * v_dim + task.kv_head * hdv..][..hdv],
                &mut vt[j * hdv..][..hdv],
            );
        }
        for (r, st) in state.iter_mut().enumerate() {
            if tile_start > st.last || tile_start + KEY_TILE <= st.first {
                continue;
            }
            let (t, h) = (task.t0 + r / group, task.kv_head * group + r % group);
            let q = &task.q[(t * shape.n_head + h) * hd..][..hd];
            let visible = st.first.max(tile_start) - tile_start
                ..=st.last.min(tile_start + KEY_TILE - 1) - tile_start;
            let row_acc = &mut acc[r * hdv..][..hdv];
            tile_update(q, &kt, &vt, visible, shape.scale, st, row_acc);
        }
    }
    for (st, row) in state.iter().zip(acc.chunks_exact_mut(hdv)) {
        let inv = if st.sum == 0.0 { 0.0 } else { 1.0 / st.sum };
        row.iter_mut().for_each(|a| *a *= inv);
    }
    acc
}

#[inline(always)]
fn widen(src: &[half::f16], dst: &mut [f32]) {
    use half::slice::HalfFloatSliceExt;
    src.convert_to_f32_slice(dst);
}

/// One key tile for one query row: scores of the visible positions
/// (`visible`, relative to the tile), the running maximum and sum, and the
/// weighted values added to `acc`, in the per-row kernel's order.
#[inline(always)]
fn tile_update(
    q: &[f32],
    kt: &[f32],
    vt: &[f32],
    visible: std::ops::RangeInclusive<usize>,
    scale: f32,
    st: &mut RowState,
    acc: &mut [f32],
) {
    // Lane j is position j's chain of multiply-adds over d, from 0.
    let mut dots = [0f32; KEY_TILE];
    for (d, &qd) in q.iter().enumerate() {
        let k = &kt[d * KEY_TILE..][..KEY_TILE];
        for (s, &kj) in dots.iter_mut().zip(k) {
            *s = qd.mul_add(kj, *s);
        }
    }
    let mut scores = [f32::NEG_INFINITY; KEY_TILE];
    for j in visible.clone() {
        scores[j] = dots[j] * scale;
    }
    let tile_max = scores.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let m_new = st.m.max(tile_max);
    if m_new > st.m {
        let ms = (st.m - m_new).exp();
        acc.iter_mut().for_each(|a| *a *= ms);
        st.sum *= ms;
    }
    st.m = m_new;
    let mut tile_sum = 0f64;
    for chunk in scores.chunks_exact_mut(LANES) {
        let mut lanes = [0f32; LANES];
        for (l, s) in lanes.iter_mut().zip(chunk.iter_mut()) {
            *s = exp_poly(*s - m_new);
            *l = *s;
        }
        tile_sum += sum_lanes(lanes) as f64;
    }
    st.sum = (st.sum as f64 + tile_sum) as f32;
    let hdv = acc.len();
    for j in visible {
        let w = scores[j];
        for (a, &v) in acc.iter_mut().zip(&vt[j * hdv..][..hdv]) {
            *a = v.mul_add(w, *a);
        }
    }
}
