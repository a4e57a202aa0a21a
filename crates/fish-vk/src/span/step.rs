//! The step buffer: where each token of a forward sits, written by the host
//! before every submit (shaders/span_common.glsl reads it), so that a
//! recorded command buffer serves any positions. A plain forward puts its
//! tokens at consecutive positions of sequence slot 0, and rows that are
//! all one slot's consecutive positions (a batched session's prompt) go
//! the same way with that slot's first KV row in the header, in any
//! number; a batched forward of several slots gives every row its own
//! (slot, position) in the per-row table.

use super::kv::KvCache;
use super::SPAN_CHUNK_TOKENS;
use crate::error::{Result, VkError};

/// Words before the per-row table: the first position, the layout and (for
/// the consecutive layout) the first KV row of the slot.
const HEADER_WORDS: usize = 4;

/// The most rows one batched forward of several slots takes (the per-row
/// table's size).
pub const SPAN_MAX_BATCH_ROWS: usize = SPAN_CHUNK_TOKENS;

/// Words of the step buffer: the header, then (position, first KV row) per row.
pub(crate) const STEP_WORDS: usize = HEADER_WORDS + 2 * SPAN_MAX_BATCH_ROWS;

/// Bytes of the step buffer (every submit copies all of them, so recordings
/// do not depend on the layout).
pub(crate) const STEP_BYTES: u64 = (STEP_WORDS * 4) as u64;

/// Word of the device step buffer where the overlapped decode attention's
/// words start (shaders/span_common.glsl QKV_ARRIVALS_AT, past the step
/// words on a line of their own): four unused words, then two words per KV
/// head (the q/k/v rows arrived, the attention workgroups that waited for
/// them). Zeroed at the start of every submit that overlaps: the host
/// writes them as zeros into the host-visible copy, which the submit copies
/// in with the step words.
pub(crate) const QKV_ARRIVALS_AT: usize = 160;

// The arrival words lie past the step words.
const _: () = assert!(QKV_ARRIVALS_AT >= STEP_WORDS);

/// The most KV heads the overlapped decode attention counts.
pub(crate) const QKV_ARRIVAL_HEADS: usize = 64;

/// The first KV head's arrival word (shaders/span_common.glsl
/// `qkv_rows_word`).
pub(crate) const QKV_ROWS_AT: usize = QKV_ARRIVALS_AT + 4;

/// Where the words at which each layer's decode attention counts its heads
/// in for the wo matvec beside it start (two per layer of the span: its
/// heads' outputs stored, at the attention's `wo_count`, and its KV heads
/// past their q/k/v; matvec_i8.comp WAIT_X): past the KV heads' words.
/// Zeroed with them.
pub(crate) const WO_ARRIVALS_AT: usize = QKV_ROWS_AT + 2 * QKV_ARRIVAL_HEADS;

/// The most layers a span's wo matvecs can wait in (spans with more keep
/// the barrier after the attention).
pub(crate) const WO_ARRIVAL_LAYERS: usize = 256;

/// Words of the device step buffer: the step words, then the arrival words.
pub(crate) const STEP_DEVICE_WORDS: usize = WO_ARRIVALS_AT + 2 * WO_ARRIVAL_LAYERS;

/// Words of the host-visible step buffer: the device buffer's as uploaded,
/// then at STEP_DEVICE_WORDS (shaders/span_common.glsl
/// QKV_FAILED_HOST_WORD) the failure flag that a wait which gave up (the
/// attention's for its q/k/v, wo's for the attention) sets.
pub(crate) const STEP_UPLOAD_WORDS: usize = STEP_DEVICE_WORDS + 4;

/// One row of a batched forward: a token of the sequence in KV slot `slot`
/// at position `pos` of that sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpanRow {
    pub slot: usize,
    pub pos: usize,
}

/// Where a forward's tokens go.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Placement<'a> {
    /// Token t at position `pos0 + t` of slot 0.
    Consecutive { pos0: usize },
    /// Token t at `rows[t]`.
    Rows(&'a [SpanRow]),
}

/// The positions a forward writes in one slot: `first..end`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SlotRun {
    pub slot: usize,
    pub first: usize,
    pub end: usize,
}

impl Placement<'_> {
    /// The slot runs of a forward of `n_tok` tokens, checked: every slot's
    /// rows are consecutive positions, the first of them leaves no gap after
    /// the slot's valid positions, and a batch fits the step table.
    pub fn slot_runs(&self, kv: &KvCache, n_tok: usize) -> Result<Vec<SlotRun>> {
        let runs = match *self {
            Placement::Consecutive { pos0 } => vec![SlotRun {
                slot: 0,
                first: pos0,
                end: pos0 + n_tok,
            }],
            Placement::Rows(rows) => rows_to_runs(rows, n_tok)?,
        };
        for r in &runs {
            if r.first > kv.len(r.slot) {
                return Err(VkError::Input(format!(
                    "position {} would leave a gap after the {} positions of KV slot {}",
                    r.first,
                    kv.len(r.slot),
                    r.slot
                )));
            }
        }
        Ok(runs)
    }

    /// The step buffer's words for this forward.
    pub fn words(&self, kv: &KvCache) -> Vec<u32> {
        let rows = match *self {
            Placement::Consecutive { pos0 } => return consecutive_words(kv, 0, pos0),
            Placement::Rows(rows) => rows,
        };
        if let Some(first) = one_slot_run(rows) {
            return consecutive_words(kv, first.slot, first.pos);
        }
        let mut w = vec![0, 1, 0, 0];
        for r in rows {
            w.push(r.pos as u32);
            w.push(kv.first_row(r.slot) as u32);
        }
        w
    }
}

/// The header of the consecutive layout: tokens from position `pos0` of
/// `slot`.
fn consecutive_words(kv: &KvCache, slot: usize, pos0: usize) -> Vec<u32> {
    vec![pos0 as u32, 0, kv.first_row(slot) as u32, 0]
}

/// The first row of `rows` when they are all one slot's consecutive
/// positions (the step buffer's consecutive layout takes them, however many).
fn one_slot_run(rows: &[SpanRow]) -> Option<SpanRow> {
    let first = *rows.first()?;
    rows.iter()
        .enumerate()
        .all(|(i, r)| r.slot == first.slot && r.pos == first.pos + i)
        .then_some(first)
}

/// Groups rows by slot, refusing tables the step buffer cannot hold (rows
/// of several slots beyond SPAN_MAX_BATCH_ROWS) and slots whose rows are
/// not consecutive positions in row order.
fn rows_to_runs(rows: &[SpanRow], n_tok: usize) -> Result<Vec<SlotRun>> {
    if rows.len() != n_tok {
        return Err(VkError::Input(format!(
            "{} rows for a forward of {n_tok} tokens",
            rows.len()
        )));
    }
    if rows.len() > SPAN_MAX_BATCH_ROWS && one_slot_run(rows).is_none() {
        return Err(VkError::Input(format!(
            "{} rows that are not one slot's consecutive positions (a batch of several slots holds at most {SPAN_MAX_BATCH_ROWS})",
            rows.len()
        )));
    }
    let mut runs: Vec<SlotRun> = Vec::new();
    for r in rows {
        match runs.iter_mut().find(|run| run.slot == r.slot) {
            Some(run) if run.end == r.pos => run.end += 1,
            Some(run) => {
                return Err(VkError::Input(format!(
                    "slot {} gets position {} after position {}: a slot's rows must be consecutive",
                    r.slot,
                    r.pos,
                    run.end - 1
                )))
            }
            None => runs.push(SlotRun {
                slot: r.slot,
                first: r.pos,
                end: r.pos + 1,
            }),
        }
    }
    Ok(runs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shaders_find_the_arrival_words_where_the_host_puts_them() {
        let common = include_str!("../../../../shaders/span_common.glsl");
        let define = format!("#define QKV_ARRIVALS_AT {QKV_ARRIVALS_AT}u");
        assert!(
            common.contains(&define),
            "span_common.glsl lacks `{define}`"
        );
        assert!(common.contains("QKV_ARRIVALS_AT + 4u + 2u * g"));
        let failed = format!(
            "#define QKV_FAILED_HOST_WORD (QKV_ARRIVALS_AT + 4u + 2u * {QKV_ARRIVAL_HEADS}u + \
             2u * {WO_ARRIVAL_LAYERS}u)"
        );
        assert_eq!(
            STEP_DEVICE_WORDS,
            QKV_ROWS_AT + 2 * QKV_ARRIVAL_HEADS + 2 * WO_ARRIVAL_LAYERS
        );
        assert!(
            common.contains(&failed),
            "span_common.glsl lacks `{failed}`"
        );
    }

    fn row(slot: usize, pos: usize) -> SpanRow {
        SpanRow { slot, pos }
    }

    #[test]
    fn rows_group_into_runs_per_slot() {
        let runs = rows_to_runs(&[row(2, 5), row(0, 7), row(2, 6)], 3).unwrap();
        assert_eq!(
            runs,
            vec![
                SlotRun {
                    slot: 2,
                    first: 5,
                    end: 7
                },
                SlotRun {
                    slot: 0,
                    first: 7,
                    end: 8
                }
            ]
        );
    }

    #[test]
    fn rows_of_a_slot_must_be_consecutive() {
        assert!(rows_to_runs(&[row(1, 5), row(1, 7)], 2).is_err());
        assert!(rows_to_runs(&[row(1, 5), row(1, 5)], 2).is_err());
        assert!(rows_to_runs(&[row(1, 5)], 2).is_err());
    }

    #[test]
    fn batches_beyond_the_step_table_are_refused() {
        let rows: Vec<SpanRow> = (0..=SPAN_MAX_BATCH_ROWS).map(|s| row(s, 0)).collect();
        assert!(rows_to_runs(&rows, rows.len()).is_err());
        assert!(rows_to_runs(&rows[1..], rows.len() - 1).is_ok());
    }

    #[test]
    fn one_slots_consecutive_rows_take_the_consecutive_layout_in_any_number() {
        let prompt: Vec<SpanRow> = (0..3 * SPAN_MAX_BATCH_ROWS)
            .map(|p| row(2, 7 + p))
            .collect();
        assert_eq!(one_slot_run(&prompt), Some(row(2, 7)));
        let runs = rows_to_runs(&prompt, prompt.len()).unwrap();
        assert_eq!(
            runs,
            vec![SlotRun {
                slot: 2,
                first: 7,
                end: 7 + 3 * SPAN_MAX_BATCH_ROWS
            }]
        );
        // Two slots, or a gap, are not one run.
        assert_eq!(one_slot_run(&[row(2, 7), row(3, 8)]), None);
        assert_eq!(one_slot_run(&[row(2, 7), row(2, 9)]), None);
        assert_eq!(one_slot_run(&[]), None);
    }
}
