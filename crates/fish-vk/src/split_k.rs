//! Splitting the steps of a cooperative batch-tile matmul across
//! workgroups (shaders/matmul_coopmat.comp, `Params::split`).
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
//! regions: arrival counters first (SPLIT_TARGET_WORKGROUPS per region, zero
//! at the start of every submission and reset by each last arrival), then
//! the partial tiles. A plan hands the regions to its splitting dispatches
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
        std::env::var("FISH_VK_SPLIT_TARGET")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|t| (64..=8192).contains(t))
            .unwrap_or(SPLIT_TARGET_WORKGROUPS)
    })
}

/// Dispatches of one plan that may split.
const SPLIT_REGIONS: u32 = 4;
/// Most workgroups per tile.
const SPLIT_MAX_WAYS: u32 = 8;
/// Fewest steps each workgroup of a split keeps.
const SPLIT_MIN_STEPS: u32 = 4;

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

/// Words (uint counters, then f32 partials) of the scratch for `tile`.
fn scratch_words(tile: &CoopMatTile) -> u64 {
    let per_region = split_target() as u64 * (1 + (tile.rows() * tile.tokens()) as u64);
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

    /// The scratch for splits of `tile` (NONE without one).
    pub fn of(tile: Option<&CoopMatTile>) -> ScratchNeed {
        tile.map_or(ScratchNeed::NONE, |t| ScratchNeed {
            bytes: 4 * scratch_words(t),
            counter_bytes: 4 * (SPLIT_REGIONS * split_target()) as u64,
        })
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
        Ok(ScratchNeed::of(self.coopmat_tile(kernel)?.as_ref()))
    }
}

/// Hands out the scratch regions of one plan.
pub(crate) struct SplitPlanner {
    next_region: u32,
}

impl SplitPlanner {
    pub fn new() -> SplitPlanner {
        SplitPlanner { next_region: 0 }
    }

    /// The split of a dispatch of `tiles` output tiles of `tile` over rows of
    /// `n_in` values: enough ways to reach SPLIT_TARGET_WORKGROUPS (at most
    /// SPLIT_MAX_WAYS, each keeping SPLIT_MIN_STEPS steps), while regions last.
    pub fn split(&mut self, tile: &CoopMatTile, tiles: u32, n_in: u32) -> SplitK {
        let steps = n_in.div_ceil(tile.k_step);
        let target = split_target();
        let ways = (target / tiles.max(1))
            .min(SPLIT_MAX_WAYS)
            .min(steps / SPLIT_MIN_STEPS)
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
        let mut p = SplitPlanner::new();
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
    fn the_scratch_holds_every_region() {
        let t = batch_tile();
        let mut p = SplitPlanner::new();
        let words = scratch_words(&t);
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
        let need = ScratchNeed::of(Some(&t));
        assert_eq!(need.counter_bytes, 4 * 4 * 512);
        // Four regions of 512 workgroups' counters and 32 x 16 partial tiles.
        assert_eq!(need.bytes, 4 * 4 * 512 * (1 + 32 * 16));
        assert_eq!(ScratchNeed::of(None), ScratchNeed::NONE);
    }
}
