//! `y = W x` for a batch of tokens, rows split across the current rayon pool.

use crate::acts::{dot_type, quantize_acts_into, QuantizedActs};
use crate::blocks::{ActFormat, BlockFormat, VecDot, INTERLEAVED_ROWS, TILED_BATCH};
use crate::dispatch::with_block_type;
use crate::error::QuantError;
use crate::rows::{is_supported, row_bytes};
use crate::simd::{tile_kernels, ActScale, CodeOffset, LaneOffsets, Tile, TileKernels, TILE_ROWS};
use fish_gguf::GgmlType;
use rayon::prelude::*;
use std::cell::RefCell;

/// A row-major weight matrix borrowed from a mapped file: `n_out` rows of
/// `n_in` values each.
#[derive(Clone, Copy, Debug)]
pub struct Weights<'a> {
    pub ty: GgmlType,
    pub data: &'a [u8],
    pub n_in: usize,
    pub n_out: usize,
}

impl<'a> Weights<'a> {
    /// Checks that `ty` is supported, rows are whole blocks and `data` holds
    /// exactly `n_out` rows.
    pub fn new(
        ty: GgmlType,
        data: &'a [u8],
        n_in: usize,
        n_out: usize,
    ) -> Result<Self, QuantError> {
        let w = Self {
            ty,
            data,
            n_in,
            n_out,
        };
        w.validate()?;
        Ok(w)
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> Result<usize, QuantError> {
        row_bytes(self.ty, self.n_in)
    }

    fn validate(&self) -> Result<(), QuantError> {
        if !is_supported(self.ty) {
            return Err(QuantError::Unsupported(self.ty));
        }
        let expected = self
            .row_bytes()?
            .checked_mul(self.n_out)
            .ok_or(QuantError::Overflow("weight bytes"))?;
        if self.data.len() != expected {
            return Err(QuantError::BadLength {
                what: "weight bytes (n_out rows)",
                expected,
                got: self.data.len(),
            });
        }
        Ok(())
    }
}

thread_local! {
    /// Activation storage reused across calls, so decode allocates nothing.
    static SCRATCH_ACTS: RefCell<QuantizedActs> = RefCell::new(QuantizedActs::default());
}

/// `y[t * n_out + o] = dot(row o of w, x[t * n_in .. (t + 1) * n_in])` for
/// `t` in `0..n_tok`, with `x` quantised to the weight type's dot-product
/// format first.
pub fn matmul_batch(
    w: Weights<'_>,
    x: &[f32],
    n_tok: usize,
    y: &mut [f32],
) -> Result<(), QuantError> {
    w.validate()?;
    SCRATCH_ACTS.with(|cell| {
        // A nested call on this thread (rayon work stealing) finds the slot
        // empty and uses fresh storage.
        let mut acts = cell.take();
        let result = quantize_acts_into(&mut acts, dot_type(w.ty), x, n_tok, w.n_in)
            .and_then(|()| matmul_quantized(w, &acts, y));
        cell.replace(acts);
        result
    })
}

/// Like [`matmul_batch`] with activations quantised beforehand by
/// [`crate::quantize_acts`] (shared by weights with the same input).
pub fn matmul_quantized(
    w: Weights<'_>,
    acts: &QuantizedActs,
    y: &mut [f32],
) -> Result<(), QuantError> {
    w.validate()?;
    let expected = dot_type(w.ty);
    if acts.dot_type != Some(expected) || acts.n_in != w.n_in {
        return Err(QuantError::ActsMismatch {
            expected,
            found: acts.dot_type.unwrap_or(expected),
            expected_n_in: w.n_in,
            found_n_in: acts.n_in,
        });
    }
    let n_y = acts
        .n_tok
        .checked_mul(w.n_out)
        .ok_or(QuantError::Overflow("output"))?;
    if y.len() != n_y {
        return Err(QuantError::BadLength {
            what: "output (n_tok * n_out)",
            expected: n_y,
            got: y.len(),
        });
    }
    with_block_type!(w.ty, B => run::<B>(w, acts, y), _ => Err(QuantError::Unsupported(w.ty)))
}

/// Weight bytes below which one task does the whole matmul.
const SERIAL_BYTES: usize = 32 * 1024;
/// Weight bytes per task when several tokens reuse them: small enough to
/// stay in L2 while every token of the batch passes over them.
const TILE_BYTES: usize = 64 * 1024;

fn run<B: BlockFormat>(
    w: Weights<'_>,
    acts: &QuantizedActs,
    y: &mut [f32],
) -> Result<(), QuantError> {
    let a: &[B::Act] = acts.blocks().ok_or(QuantError::Unsupported(w.ty))?;
    let blocks: &[B] = bytemuck::cast_slice(w.data);
    let bpr = w.n_in / <B as BlockFormat>::VALUES;
    let apr = w.n_in / B::Act::VALUES;
    if bpr != apr || w.n_out == 0 || acts.n_tok == 0 {
        return Ok(());
    }
    let row_bytes = bpr * size_of::<B>();
    // The kernels gather the scales of 4 rows with i32 offsets.
    let offsets_fit = row_bytes
        .checked_mul(TILE_ROWS)
        .is_some_and(|b| b <= i32::MAX as usize);
    if let Some(kernels) = tile_kernels(w.ty, w.n_out).filter(|_| offsets_fit) {
        let offsets = match CodeOffset::of(w.ty) {
            Some(k) => acts.lane_offsets(k).map(Some),
            None => Some(None),
        };
        if let (Some(scales), Some(offsets)) = (acts.tile_scales(), offsets) {
            let geometry = TiledMatmul {
                w: w.data,
                row_bytes,
                n_out: w.n_out,
                acts: bytemuck::cast_slice(a),
                act_row_bytes: apr * size_of::<B::Act>(),
                apr,
                scales,
                offsets,
                n_tok: acts.n_tok,
            };
            geometry.run(kernels, y);
            return Ok(());
        }
    }
    let special = tiled_batch_dot::<B>(acts.n_tok).or_else(|| interleaved_dot::<B>(w.n_out));
    let (dot, grouped_dot) = match special {
        Some(dot) => (dot, dot),
        None => (B::best_vec_dot(), B::grouped_vec_dot()),
    };
    let n_tok = acts.n_tok;
    // Tokens that the reference takes four at a time.
    let n_grouped = n_tok - n_tok % 4;
    let n_out = w.n_out;
    let total = row_bytes * n_out;
    let threads = rayon::current_num_threads().max(1);

    // Rows per task: a few tasks per thread for balance on a shared machine;
    // with a batch, tiles small enough to be reused from cache by every token.
    let mut rows_per_task = if total <= SERIAL_BYTES || threads == 1 {
        n_out
    } else {
        n_out.div_ceil(threads * 2)
    };
    if n_tok > 1 {
        rows_per_task = rows_per_task.min((TILE_BYTES / row_bytes.max(1)).max(1));
    }
    let n_tasks = n_out.div_ceil(rows_per_task);

    let out = OutPtr(y.as_mut_ptr());
    let task = |i: usize| {
        let r0 = i * rows_per_task;
        let r1 = (r0 + rows_per_task).min(n_out);
        for t in 0..n_tok {
            let at = &a[t * apr..(t + 1) * apr];
            let dot = if t < n_grouped { grouped_dot } else { dot };
            for r in r0..r1 {
                let v = dot(&blocks[r * bpr..(r + 1) * bpr], at);
                // SAFETY: task i writes only rows r0..r1 of each token's
                // output; those index sets are disjoint across tasks and lie
                // inside y, whose length was checked to be n_tok * n_out.
                unsafe { out.write(t * n_out + r, v) };
            }
        }
    };
    if n_tasks == 1 {
        task(0);
    } else {
        (0..n_tasks).into_par_iter().for_each(task);
    }
    Ok(())
}

/// The row dot product for a batch of `n_tok` tokens, where its format
/// rounds differently in batches that ggml tiles.
fn tiled_batch_dot<B: BlockFormat>(n_tok: usize) -> Option<VecDot<B>> {
    B::tiled_batch_vec_dot().filter(|_| n_tok >= TILED_BATCH)
}

/// The row dot product of a matrix of `n_out` rows, where its format rounds
/// differently in matrices that ggml repacks.
pub(crate) fn interleaved_dot<B: BlockFormat>(n_out: usize) -> Option<VecDot<B>> {
    B::interleaved_vec_dot().filter(|_| n_out.is_multiple_of(INTERLEAVED_ROWS))
}

/// A matmul served by the multi-row tile kernels: the slices are checked
/// against each other by `run`'s caller (whole rows, `n_tok` tokens of
/// `apr` blocks and scales).
struct TiledMatmul<'a> {
    w: &'a [u8],
    row_bytes: usize,
    n_out: usize,
    acts: &'a [u8],
    act_row_bytes: usize,
    apr: usize,
    scales: &'a [ActScale],
    /// Laid out as `scales`, for formats with a code offset.
    offsets: Option<&'a [LaneOffsets]>,
    n_tok: usize,
}

impl TiledMatmul<'_> {
    /// Splits the rows, in groups of [`TILE_ROWS`], across the pool; a
    /// batch walks its tokens `max_tok` at a time over an L2-sized slice of
    /// rows, so each weight block loaded feeds several tokens.
    fn run(&self, kernels: TileKernels, y: &mut [f32]) {
        let n_out = self.n_out;
        let n_tok = self.n_tok;
        debug_assert_eq!(self.w.len(), self.row_bytes * n_out);
        debug_assert_eq!(self.acts.len(), self.act_row_bytes * n_tok);
        debug_assert_eq!(self.scales.len(), self.apr * n_tok);
        debug_assert!(self.offsets.is_none_or(|o| o.len() == self.apr * n_tok));
        debug_assert_eq!(y.len(), n_out * n_tok);
        let groups = n_out.div_ceil(TILE_ROWS);
        let group_bytes = self.row_bytes * TILE_ROWS;
        let threads = rayon::current_num_threads().max(1);
        let mut groups_per_task = if self.row_bytes * n_out <= SERIAL_BYTES || threads == 1 {
            groups
        } else {
            groups.div_ceil(threads * 2)
        };
        if n_tok > 1 {
            groups_per_task = groups_per_task.min((TILE_BYTES / group_bytes.max(1)).max(1));
        }
        let n_tasks = groups.div_ceil(groups_per_task);
        let out = OutPtr(y.as_mut_ptr());
        let task = |i: usize| {
            let r0 = i * groups_per_task * TILE_ROWS;
            let r1 = (r0 + groups_per_task * TILE_ROWS).min(n_out);
            let step = kernels.max_tok.max(1);
            for t0 in (0..n_tok).step_by(step) {
                let kernel = kernels.for_tokens((n_tok - t0).min(step));
                for r in (r0..r1).step_by(TILE_ROWS) {
                    let tile = Tile {
                        w: self.w[r * self.row_bytes..].as_ptr(),
                        row_bytes: self.row_bytes,
                        rows: (r1 - r).min(TILE_ROWS),
                        a: self.acts[t0 * self.act_row_bytes..].as_ptr(),
                        act_row_bytes: self.act_row_bytes,
                        scales: self.scales[t0 * self.apr..].as_ptr(),
                        offsets: self
                            .offsets
                            .map_or(core::ptr::null(), |o| o[t0 * self.apr..].as_ptr()),
                        apr: self.apr,
                        toks: (n_tok - t0).min(step),
                        y: out.at(t0 * n_out + r),
                        y_stride: n_out,
                    };
                    // SAFETY: the tile's rows r..r + rows lie in w, its
                    // tokens t0..t0 + toks in acts, scales and offsets (lengths
                    // checked by the caller), and it writes y[t * n_out + r']
                    // for those rows and tokens only: disjoint across tasks.
                    unsafe { kernel(&tile) };
                }
            }
        };
        if n_tasks == 1 {
            task(0);
        } else {
            (0..n_tasks).into_par_iter().for_each(task);
        }
    }
}

/// The output buffer shared by the tasks of one matmul.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: tasks write disjoint elements (see `run`), and the buffer outlives
// the parallel section that uses the pointer.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// # Safety
    /// `i` must be in bounds and written by no other task.
    unsafe fn write(self, i: usize, v: f32) {
        unsafe { *self.0.add(i) = v };
    }

    /// The address of element `i`, for a kernel that writes through it.
    fn at(self, i: usize) -> *mut f32 {
        self.0.wrapping_add(i)
    }
}
