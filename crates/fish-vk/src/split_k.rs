//! Splitting the steps of a cooperative-matrix matmul across workgroups
//! (shaders/matmul_coopmat.comp, `Params::split`): the batch tile's, and
//! the wide prefill tile's where a plan has too few 128 x 128 tiles and
//! rows long enough (`SplitRule::wide`).
//!
//! A batched-decode matmul has one 16-token tile along the tokens, so a
//! projection of 4096 rows runs 128 workgroups, each walking every step of
//! n_in one after the other: on the H200 the step chain, not the weight
//! bytes, set its time (a 16-token step cost what an 8-token one did). When
//! a dispatch has fewer than SPLIT_TARGET_WORKGROUPS tiles, its steps are
//! divided among `ways` workgroups per tile; each writes its partial tile to
//! a scratch buffer and counts itself in with an atomic, and the last to
//! arrive sums the partials in split order (so the result does not depend on
//! the order in which workgroups finish) and writes y.
//!
//! The scratch (binding 3 of the plain matmul sets) holds SPLIT_REGIONS
//! regions: arrival counters first (the rule's target per region, zero at
//! the start of every submission and reset by each last arrival), then the
//! partial tiles; a span's scratch is sized for the larger of its two
//! rules' layouts. A plan hands the regions to its splitting dispatches
//! in order (dispatches of one plan run without barriers between them, so
//! they need disjoint regions); a plan with more splitting dispatches than
//! regions runs the rest unsplit. Plans of different groups are separated
//! by barriers and reuse the regions.

use crate::coopmat::CoopMatTile;

/// Fewest workgroups a batch-tile dispatch should have; below this its steps
/// are split (a few per multiprocessor of the H200's 132). FISH_VK_SPLIT_TARGET
/// overrides it (64..=8192, read once; the scratch grows with it).
const SPLIT_TARGET_WORKGROUPS: u32 = 512;

/// SPLIT_TARGET_WORKGROUPS or its override.
fn split_target() -> u32 {
    static TARGET: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *TARGET.get_or_init(|| {
        crate::config::env_number_in("FISH_VK_SPLIT_TARGET", 64..=8192, SPLIT_TARGET_WORKGROUPS)
    })
}

/// Fewest workgroups a dispatch of the wide prefill tile should have (two
/// 128 x 128 tiles per multiprocessor of the H200 and a few); below this its
/// steps are split. FISH_VK_WIDE_SPLIT overrides it (0 turns the split of
/// wide tiles off, else 64..=1024; read once; the scratch grows with it).
const WIDE_SPLIT_TARGET_WORKGROUPS: u32 = 256;

/// WIDE_SPLIT_TARGET_WORKGROUPS or its override; None when off.
fn wide_split_target() -> Option<u32> {
    static TARGET: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    *TARGET.get_or_init(|| {
        match std::env::var("FISH_VK_WIDE_SPLIT")
            .ok()
            .map(|v| v.parse::<u32>())
        {
            Some(Ok(0)) => None,
            Some(Ok(t)) if (64..=1024).contains(&t) => Some(t),
            _ => Some(WIDE_SPLIT_TARGET_WORKGROUPS),
        }
    })
}

/// Dispatches of one plan that may split.
const SPLIT_REGIONS: u32 = 4;
/// Most workgroups per tile: batch tiles, wide prefill tiles.
const SPLIT_MAX_WAYS: u32 = 8;
const WIDE_SPLIT_MAX_WAYS: u32 = 4;
/// Fewest steps each workgroup of a split keeps: batch tiles, wide tiles.
/// On the H200 (pp512, docs/BENCHMARKS.md) splitting the wide tile's 4096-
/// value rows (128 steps) lost: llama-8b q/k/v 308 -> 363 us and wo 208 ->
/// 251 us per layer, while the down projection's 14336-value rows (448
/// steps, 2 ways) gained 686 -> 585 us.
/// FISH_VK_WIDE_SPLIT_MIN_STEPS overrides the wide tiles' (16..=1024,
/// read once), for measuring the rule.
const SPLIT_MIN_STEPS: u32 = 4;
const WIDE_SPLIT_MIN_STEPS: u32 = 128;

/// WIDE_SPLIT_MIN_STEPS or its override.
fn wide_split_min_steps() -> u32 {
    static STEPS: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *STEPS.get_or_init(|| {
        crate::config::env_number_in(
            "FISH_VK_WIDE_SPLIT_MIN_STEPS",
            16..=1024,
            WIDE_SPLIT_MIN_STEPS,
        )
    })
}

/// How the dispatches of a kind of tile split: the workgroups a dispatch
/// should reach and the most workgroups per tile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SplitRule {
    pub target: u32,
    pub max_ways: u32,
    /// Fewest steps each workgroup keeps.
    pub min_steps: u32,
}

impl SplitRule {
    /// The batch tile's (SPLIT_TARGET_WORKGROUPS).
    pub fn batch() -> SplitRule {
        SplitRule {
            target: split_target(),
            max_ways: SPLIT_MAX_WAYS,
            min_steps: SPLIT_MIN_STEPS,
        }
    }

    /// The wide prefill tile's, unless FISH_VK_WIDE_SPLIT=0.
    pub fn wide() -> Option<SplitRule> {
        wide_split_target().map(|target| SplitRule {
            target,
            max_ways: WIDE_SPLIT_MAX_WAYS,
            min_steps: wide_split_min_steps(),
        })
    }
}

/// How one dispatch splits its steps: the push constants `split`,
/// `split_count_off` (uint offset of its arrival counters in the scratch)
/// and `split_part_off` (float offset of its partial tiles).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct SplitK {
    pub ways: u32,
    pub count_off: u32,
    pub part_off: u32,
}

impl SplitK {
    /// No split (what every other kernel gets).
    pub const NONE: SplitK = SplitK {
        ways: 1,
        count_off: 0,
        part_off: 0,
    };
}

/// Words (uint counters, then f32 partials) of the scratch for splits of
/// `tile` by `rule`.
fn scratch_words(tile: &CoopMatTile, rule: SplitRule) -> u64 {
    let per_region = rule.target as u64 * (1 + (tile.rows() * tile.tokens()) as u64);
    SPLIT_REGIONS as u64 * per_region
}

/// What the split dispatches of a plan (or a span's forwards) need of the
/// scratch: its bytes, and the bytes of the arrival counters at its start,
/// which every submission that may split zeroes first. Without splits the
/// binding still holds a buffer: 16 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ScratchNeed {
    pub bytes: u64,
    pub counter_bytes: u64,
}

impl ScratchNeed {
    pub const NONE: ScratchNeed = ScratchNeed {
        bytes: 16,
        counter_bytes: 16,
    };

    /// The scratch for splits of `tile` by `rule` (NONE without a tile).
    pub fn of(tile: Option<&CoopMatTile>, rule: SplitRule) -> ScratchNeed {
        tile.map_or(ScratchNeed::NONE, |t| ScratchNeed {
            bytes: 4 * scratch_words(t, rule),
            counter_bytes: 4 * (SPLIT_REGIONS * rule.target) as u64,
        })
    }

    /// A scratch that serves both needs.
    pub fn max(self, other: ScratchNeed) -> ScratchNeed {
        ScratchNeed {
            bytes: self.bytes.max(other.bytes),
            counter_bytes: self.counter_bytes.max(other.counter_bytes),
        }
    }
}

impl crate::gpu::Gpu {
    /// The batch tile a span's batched forwards may split: the device's, or
    /// with FISH_GPU_BATCH_EMULATED=1 the emulated one (record.rs).
    pub(crate) fn span_split_tile(&self) -> Option<CoopMatTile> {
        self.info.cooperative_batch.or_else(|| {
            crate::coopmat::emulated_batch_wanted()
                .then(|| crate::coopmat::emulated_tile(&self.info, true).ok())
                .flatten()
        })
    }

    /// The scratch of a span's forwards: the batch tile's splits
    /// (`span_split_tile`) and the wide prefill tile's.
    pub(crate) fn span_split_need(&self) -> ScratchNeed {
        let batch = ScratchNeed::of(self.span_split_tile().as_ref(), SplitRule::batch());
        match SplitRule::wide() {
            Some(rule) => batch.max(ScratchNeed::of(self.span_wide_tile().as_ref(), rule)),
            None => batch,
        }
    }

    /// The wide prefill tile a span's chunks may take: the device's, or
    /// with FISH_GPU_PREFILL_EMULATED=1 on a device without one the
    /// emulated tile (whose splits need the scratch as much).
    fn span_wide_tile(&self) -> Option<CoopMatTile> {
        self.info.cooperative_wide.or_else(|| {
            crate::coopmat::emulated_prefill_wanted()
                .then(|| self.wide_tile_of(crate::kernels::Kernel::CoopMatEmulated))
                .flatten()
        })
    }

    /// The scratch a plan for `kernel` needs: none unless one of its
    /// dispatches splits.
    pub(crate) fn split_need(
        &self,
        dispatches: &[crate::kernels::Dispatch],
        kernel: crate::kernels::Kernel,
    ) -> crate::error::Result<ScratchNeed> {
        if !dispatches.iter().any(|d| d.params.split > 1) {
            return Ok(ScratchNeed::NONE);
        }
        use crate::kernels::Kernel;
        if matches!(kernel, Kernel::CoopMatBatch | Kernel::CoopMatBatchEmulated) {
            return Ok(ScratchNeed::of(
                self.coopmat_tile(kernel)?.as_ref(),
                SplitRule::batch(),
            ));
        }
        // Otherwise only the wide prefill tile splits.
        Ok(match (SplitRule::wide(), self.wide_tile_of(kernel)) {
            (Some(rule), Some(tile)) => ScratchNeed::of(Some(&tile), rule),
            _ => ScratchNeed::NONE,
        })
    }
}

/// Hands out the scratch regions of one plan.
pub(crate) struct SplitPlanner {
    rule: SplitRule,
    next_region: u32,
}

impl SplitPlanner {
    pub fn new(rule: SplitRule) -> SplitPlanner {
        SplitPlanner {
            rule,
            next_region: 0,
        }
    }

    /// The split of a dispatch of `tiles` output tiles of `tile` over rows of
    /// `n_in` values: enough ways to reach the rule's target (at most its
    /// max_ways, each keeping its min_steps steps), while regions last.
    pub fn split(&mut self, tile: &CoopMatTile, tiles: u32, n_in: u32) -> SplitK {
        let steps = n_in.div_ceil(tile.k_step);
        let target = self.rule.target;
        let ways = (target / tiles.max(1))
            .min(self.rule.max_ways)
            .min(steps / self.rule.min_steps)
            .max(1);
        if ways == 1 || self.next_region >= SPLIT_REGIONS {
            return SplitK::NONE;
        }
        let r = self.next_region;
        self.next_region += 1;
        let tile_values = tile.rows() * tile.tokens();
        SplitK {
            ways,
            count_off: r * target,
            part_off: SPLIT_REGIONS * target + r * target * tile_values,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coopmat::BATCH_WARPS;
    use crate::tile_padding::PaddingRule;

    fn batch_tile() -> CoopMatTile {
        CoopMatTile::new(
            (16, 16, 16),
            32,
            BATCH_WARPS,
            PaddingRule::default(),
            crate::coopmat::TileLimits {
                max_shared_bytes: 48 * 1024,
                max_threads: 1024,
            },
        )
        .expect("batch tile")
    }

    #[test]
    fn small_dispatches_split_until_the_target_and_large_ones_do_not() {
        let t = batch_tile();
        let mut p = SplitPlanner::new(SplitRule::batch());
        // 4096 rows of 4096 (the llama-8b wo): 128 tiles, 32 steps -> 4 ways.
        let wo = p.split(&t, 128, 4096);
        assert_eq!(wo.ways, 4);
        assert_eq!((wo.count_off, wo.part_off), (0, 4 * 512));
        // 1024 rows (k, v): 32 tiles -> 16, capped at 8 ways (4 steps each).
        let k = p.split(&t, 32, 4096);
        assert_eq!(k.ways, 8);
        assert_eq!(k.count_off, 512);
        assert_eq!(k.part_off, 4 * 512 + 512 * 512);
        // Every split stays within the region's counters and partials.
        for s in [wo, k] {
            assert!(s.ways * 128 <= 512 || s.ways * 32 <= 512);
        }
        // 896 tiles (gate/up of 14336 rows each) reach the target unsplit.
        assert_eq!(p.split(&t, 896, 4096), SplitK::NONE);
        // Short rows: 512 values are 4 steps, too few to split.
        assert_eq!(p.split(&t, 16, 512), SplitK::NONE);
        // Two more regions, then none left.
        assert_ne!(p.split(&t, 64, 4096), SplitK::NONE);
        assert_ne!(p.split(&t, 64, 4096), SplitK::NONE);
        assert_eq!(p.split(&t, 64, 4096), SplitK::NONE);
    }

    #[test]
    fn wide_tiles_split_only_long_rows() {
        let wide = CoopMatTile::new(
            (16, 16, 16),
            32,
            crate::coopmat::WIDE_WARPS,
            PaddingRule::default(),
            crate::coopmat::TileLimits {
                max_shared_bytes: 48 * 1024,
                max_threads: 1024,
            },
        )
        .expect("wide tile");
        let rule = SplitRule {
            target: 256,
            max_ways: 4,
            min_steps: 128,
        };
        let mut p = SplitPlanner::new(rule);
        // llama-8b down at 512 tokens: 128 tiles of 448 steps -> 2 ways.
        assert_eq!(p.split(&wide, 128, 14336).ways, 2);
        // wo: 128 steps cannot keep 128 per way in two.
        assert_eq!(p.split(&wide, 128, 4096), SplitK::NONE);
        // One tile of 256 steps: the steps, not the target, cap the ways.
        assert_eq!(p.split(&wide, 1, 8192).ways, 2);
        // Enough tiles already.
        assert_eq!(p.split(&wide, 448, 14336), SplitK::NONE);
    }

    #[test]
    fn the_scratch_holds_every_region() {
        let t = batch_tile();
        let mut p = SplitPlanner::new(SplitRule::batch());
        let words = scratch_words(&t, SplitRule::batch());
        for tiles in [1u32, 7, 64, 100, 255] {
            let s = p.split(&t, tiles, 1 << 14);
            if s == SplitK::NONE {
                continue;
            }
            let tile_values = t.rows() * t.tokens();
            assert!(s.count_off + tiles <= SPLIT_REGIONS * SPLIT_TARGET_WORKGROUPS);
            let end = s.part_off as u64 + (s.ways * tiles * tile_values) as u64;
            assert!(end <= words, "{tiles} tiles: {end} > {words}");
        }
        let need = ScratchNeed::of(Some(&t), SplitRule::batch());
        assert_eq!(need.counter_bytes, 4 * 4 * 512);
        // Four regions of 512 workgroups' counters and 32 x 16 partial tiles.
        assert_eq!(need.bytes, 4 * 4 * 512 * (1 + 32 * 16));
        assert_eq!(ScratchNeed::of(None, SplitRule::batch()), ScratchNeed::NONE);
    }
}
