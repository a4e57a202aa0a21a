//! Which chunks attend with each token's keys split across workgroups
//! (shaders/span_attention_split.comp), how many workgroups they give a
//! token, and the scratch the splits' partials need.
//!
//! A token's splits depend only on how many keys it attends to (at most
//! `MAX_SPLITS`); the dispatch's `splits` workgroups per token take every
//! `splits`-th of them, so the bits do not depend on the chunk: decode,
//! verification and batched steps agree.

use super::desc::SpanShape;
use super::step::SPAN_MAX_BATCH_ROWS;

/// The most splits a token's keys take (MAX_SPLITS in the shader): at 128
/// positions a llama-8b token takes 4 (blocks of 32 keys), from 512 all 16.
const MAX_SPLITS: usize = 16;
/// The fewest workgroups per token: batched steps of 4+ rows take 4 each
/// (on the H200 16 each cost llama-1b 5% at 8 rows, their empty splits
/// holding the GPU; 4 gained 2.5%).
const MIN_SPLITS: usize = 4;

/// Floats per partial past its weighted value sums: max, sum, two unused.
const PARTIAL_HEAD: usize = 4;

/// Whether the kernel takes `shape`: heads of whole 16-byte words that one
/// workgroup rotates and scores (32 to 256 values, as wide for values as
/// for keys) and k/v rows of whole 16-byte words.
pub(crate) fn split_attention_fits(shape: &SpanShape) -> bool {
    let d = shape.head_dim;
    d == shape.head_dim_v
        && d.is_multiple_of(8)
        && (32..=256).contains(&d)
        && shape.k_dim().is_multiple_of(8)
        && shape.v_dim().is_multiple_of(8)
}

/// Workgroups per (token, head) for a chunk of `n` tokens, or None where
/// the chunk keeps the one-workgroup kernel (more rows than the scratch
/// holds). `FISH_VK_ATTN_WORKGROUPS=N` (1..=16) sets it for every chunk
/// (the bits stay the same; tests use 1 to have one workgroup take every
/// split of its token).
pub(crate) fn attention_splits(n: usize) -> Option<usize> {
    let default = (MAX_SPLITS / n.max(1)).clamp(MIN_SPLITS, MAX_SPLITS);
    (1..=SPAN_MAX_BATCH_ROWS)
        .contains(&n)
        .then(|| crate::config::env_number_in("FISH_VK_ATTN_WORKGROUPS", 1..=MAX_SPLITS, default))
}

/// Floats of the arrival counters (one per token and head, whole vec4s),
/// as the shader's `part_base` places the partials.
fn counter_floats(shape: &SpanShape, n: usize) -> usize {
    (n * shape.n_head).next_multiple_of(4)
}

/// (bytes of the counters a submit zeroes, bytes of the whole scratch) for
/// every chunk the kernel takes.
pub(crate) fn split_scratch_bytes(shape: &SpanShape) -> (u64, u64) {
    let counters = counter_floats(shape, SPAN_MAX_BATCH_ROWS);
    let partials =
        SPAN_MAX_BATCH_ROWS * shape.n_head * MAX_SPLITS * (shape.head_dim_v + PARTIAL_HEAD);
    // A dispatch's partials start past its own counters, at most these.
    let total = ((counters + partials) as u64 * 4).next_multiple_of(16);
    (counters as u64 * 4, total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::span::desc::{SpanActivation, SpanRope};

    fn shape(head_dim: usize, head_dim_v: usize) -> SpanShape {
        SpanShape {
            n_embd: 4096,
            n_head: 32,
            n_head_kv: 8,
            head_dim,
            head_dim_v,
            n_rot: head_dim,
            rope: SpanRope::Adjacent,
            activation: SpanActivation::SwiGlu,
            rms_eps: 1e-5,
            attn_scale: 1.0,
            n_ctx: 4096,
        }
    }

    #[test]
    fn the_kernel_takes_heads_of_whole_words_up_to_256() {
        for (k, v, fits) in [
            (128, 128, true),
            (64, 64, true),
            (32, 32, true),
            (256, 256, true),
            (96, 96, true),
            (16, 16, false),
            (512, 512, false),
            (60, 60, false),
            (128, 64, false),
        ] {
            assert_eq!(split_attention_fits(&shape(k, v)), fits, "{k} / {v}");
        }
    }

    #[test]
    fn single_tokens_take_every_split_and_batches_four_each() {
        assert_eq!(attention_splits(1), Some(MAX_SPLITS));
        assert_eq!(attention_splits(2), Some(8));
        for n in 4..=SPAN_MAX_BATCH_ROWS {
            assert_eq!(attention_splits(n), Some(MIN_SPLITS), "{n} rows");
        }
        assert_eq!(attention_splits(SPAN_MAX_BATCH_ROWS + 1), None);
        assert_eq!(attention_splits(0), None);
    }

    #[test]
    fn the_scratch_holds_every_chunk_the_kernel_takes() {
        let shape = shape(128, 128);
        let (counters, total) = split_scratch_bytes(&shape);
        assert_eq!(counters, (SPAN_MAX_BATCH_ROWS * 32 * 4) as u64);
        for n in 1..=SPAN_MAX_BATCH_ROWS + 1 {
            if attention_splits(n).is_some() {
                // The end of the last partial, as part_at places it.
                let end = counter_floats(&shape, n) + n * 32 * MAX_SPLITS * (128 + PARTIAL_HEAD);
                assert!(end as u64 * 4 <= total, "{n} tokens");
            }
        }
    }
}
