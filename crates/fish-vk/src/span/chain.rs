//! Chained decode stages: a one-token forward's dispatches recorded without
//! pipeline barriers between its stages, the order kept by the kernels
//! themselves (shaders/chain.glsl). A barrier costs a stage its launch and
//! the drain of the stage before (~3 us on an H100, five stages a layer);
//! chained, the next stage's workgroups are already resident when the last
//! ones of the stage before finish.
//!
//! The chained stages of a forward are numbered from 0. Every workgroup of
//! stage s counts itself in at the stage's arrival counter when it is
//! done; the last to arrive (the counter reaching the stage's workgroups)
//! sets the flag words to s + 1; a workgroup of stage s waits, before it
//! reads anything, for the flags to reach s. A stage can only finish after
//! the one before it has, so the flags count finished stages.
//!
//! A dispatch whose kernel does not chain (the norms, the prefetches, the
//! output projection on float x) gets a barrier before it and after its
//! stage, as unchained forwards do; the chained stages after it still wait
//! for the flags, which every chained stage before the barrier has set.

use std::sync::atomic::{AtomicU64, Ordering};

/// Copies of the flag word, each on a line of its own
/// (shaders/chain.glsl FLAG_COPIES, FLAG_STRIDE): the waiting workgroups of
/// a stage poll one copy each, so that no one line takes every poll.
const FLAG_COPIES: usize = 32;
const FLAG_STRIDE: usize = 32;
/// Word of the first arrival counter (shaders/chain.glsl COUNTER_BASE),
/// after the failure word's line and the flags.
const COUNTER_BASE: usize = FLAG_STRIDE * (1 + FLAG_COPIES);

/// Chained stages a forward of `n_layers` layers may hold: five a layer at
/// most (q/k/v, attention, wo, gate/up, down), with room to spare.
pub(crate) fn chain_capacity(n_layers: usize) -> u32 {
    (8 * n_layers + 8) as u32
}

/// Bytes of the chain words for `n_layers` layers: the failure word's
/// line, the flags, an arrival counter per stage.
pub(crate) fn chain_bytes(n_layers: usize) -> u64 {
    4 * (COUNTER_BASE as u64 + u64::from(chain_capacity(n_layers)))
}

/// The chained dispatches of the stage being recorded, held back until the
/// stage ends: each is told the stage's number and its workgroups, which
/// only the whole stage knows.
pub(crate) struct ChainStages<T> {
    /// The stage being recorded (chained stages recorded before it).
    stage: u32,
    capacity: u32,
    pending: Vec<T>,
    pending_groups: u32,
    /// The stage holds a dispatch that does not chain: it ends with a barrier.
    barrier_due: bool,
}

/// A stage's chained dispatches, as `ChainStages::flush` releases them.
pub(crate) struct ChainedStage<T> {
    /// The dispatches' `chain` push word: 1 + the stage's number.
    pub chain: u32,
    /// The stage's workgroups (`chain_groups`).
    pub groups: u32,
    pub dispatches: Vec<T>,
}

impl<T> ChainStages<T> {
    pub(crate) fn new(capacity: u32) -> ChainStages<T> {
        ChainStages {
            stage: 0,
            capacity,
            pending: Vec::new(),
            pending_groups: 0,
            barrier_due: false,
        }
    }

    /// Holds back a chained dispatch of `workgroups` workgroups; gives it
    /// back where the chain is full (the caller records it unchained).
    pub(crate) fn join(&mut self, dispatch: T, workgroups: u32) -> Option<T> {
        if self.stage >= self.capacity {
            return Some(dispatch);
        }
        self.pending.push(dispatch);
        self.pending_groups += workgroups;
        None
    }

    /// The held-back dispatches as one chained stage (none held: None).
    pub(crate) fn flush(&mut self) -> Option<ChainedStage<T>> {
        if self.pending.is_empty() {
            return None;
        }
        self.stage += 1;
        Some(ChainedStage {
            chain: self.stage,
            groups: std::mem::take(&mut self.pending_groups),
            dispatches: std::mem::take(&mut self.pending),
        })
    }

    /// A dispatch that does not chain joins the stage (the caller flushes
    /// and records a barrier before it): the stage ends with one too.
    pub(crate) fn unchained(&mut self) {
        self.barrier_due = true;
    }

    /// Ends the stage (after `flush`); true when the caller must record a
    /// barrier.
    pub(crate) fn end_stage(&mut self) -> bool {
        debug_assert!(self.pending.is_empty());
        std::mem::take(&mut self.barrier_due)
    }
}

/// Whether a new span's one-token forwards chain their stages:
/// `FISH_GPU_CHAIN=1` on, `0` off (read when the span is made).
pub(crate) fn chain_wanted() -> bool {
    std::env::var("FISH_GPU_CHAIN").as_deref() == Ok("1")
}

/// Chained forwards run to the end without a wait giving up, in this process.
static CHAINED_FORWARDS: AtomicU64 = AtomicU64::new(0);

pub(crate) fn count_chained_forward() {
    CHAINED_FORWARDS.fetch_add(1, Ordering::Relaxed);
}

/// How many span forwards of this process ran with chained stages (tests
/// check that a chained run was one).
pub fn chained_forwards() -> u64 {
    CHAINED_FORWARDS.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_stage_is_numbered_and_counts_all_its_workgroups() {
        let mut c = ChainStages::new(8);
        // q/k/v in two dispatches: stage 0 (chain word 1), 128 workgroups.
        assert!(c.join("q", 96).is_none());
        assert!(c.join("v", 32).is_none());
        let s = c.flush().expect("two dispatches");
        assert_eq!((s.chain, s.groups, s.dispatches), (1, 128, vec!["q", "v"]));
        assert!(!c.end_stage());
        assert!(c.join("attention", 32).is_none());
        let s = c.flush().expect("one dispatch");
        assert_eq!((s.chain, s.groups), (2, 32));
        assert!(c.flush().is_none());
    }

    #[test]
    fn a_stage_with_an_unchained_dispatch_ends_with_a_barrier() {
        let mut c = ChainStages::new(8);
        c.join(0, 10);
        assert_eq!(c.flush().map(|s| s.chain), Some(1));
        c.unchained();
        assert!(c.end_stage());
        assert!(!c.end_stage());
        c.join(1, 4);
        assert_eq!(c.flush().map(|s| (s.chain, s.groups)), Some((2, 4)));
    }

    #[test]
    fn a_full_chain_gives_dispatches_back() {
        let mut c = ChainStages::new(1);
        assert!(c.join(0, 1).is_none());
        c.flush();
        assert_eq!(c.join(7, 1), Some(7));
    }

    #[test]
    fn the_words_hold_a_counter_per_stage_past_the_flags() {
        assert_eq!(COUNTER_BASE, 1056);
        assert_eq!(chain_bytes(32), 4 * (1056 + 264));
    }
}
