//! Warming the L2 cache with the weights of a span's next matvecs while a
//! stage that does not touch them runs (shaders/l2_prefetch.comp).
//!
//! A decode step alternates matvecs, which stream weights, with stages bound
//! by latency (attention, and every matvec's ramp and tail), during which
//! the memory bus is partly idle. A prefetch recorded beside such a stage
//! (no barrier between them) reads later weights into L2 meanwhile, so that
//! their matvec starts on cached bytes. `FISH_GPU_PREFETCH` sets the budget
//! per place in MB, `FISH_GPU_PREFETCH_AT` names the places (`PrefetchAt`).
//! Off by default: slower at every place and budget measured, since a
//! stage whose weights are all in L2 ran only 5-15% faster (its chain of
//! dependent loads and sums bounds it, not the memory) while the prefetch
//! lengthened the stage beside it by nearly its transfer time
//! (docs/BENCHMARKS.md, "Decode knobs timed"). A budget smaller than a
//! group's weights reads the same prefix of every row (the shader's
//! comment says why).

use crate::error::Result;
use crate::gpu::Gpu;
use crate::kernels::Dispatch;
use ash::vk;

/// Threads per workgroup of l2_prefetch.comp, sectors per thread and bytes
/// per sector.
const THREADS: u64 = 256;
const LOADS: u64 = 4;
const SECTOR: u64 = 32;

/// Where a decode layer prefetches, as bits: beside attention (wo, then
/// gate/up), beside gate/up (down), beside down (the next layer's q/k/v).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PrefetchAt(u32);

impl PrefetchAt {
    pub(crate) const ATTENTION: PrefetchAt = PrefetchAt(1);
    pub(crate) const GATE_UP: PrefetchAt = PrefetchAt(2);
    pub(crate) const DOWN: PrefetchAt = PrefetchAt(4);

    /// `FISH_GPU_PREFETCH_AT`: a comma list of `attention`, `gate_up`,
    /// `down` (or `all`); unset or unreadable, attention alone.
    fn parse(v: Option<&str>) -> PrefetchAt {
        let mut bits = 0;
        for name in v.unwrap_or("attention").split(',') {
            bits |= match name.trim() {
                "attention" => Self::ATTENTION.0,
                "gate_up" => Self::GATE_UP.0,
                "down" => Self::DOWN.0,
                "all" => Self::ATTENTION.0 | Self::GATE_UP.0 | Self::DOWN.0,
                _ => 0,
            };
        }
        PrefetchAt(if bits == 0 { Self::ATTENTION.0 } else { bits })
    }

    pub(crate) fn has(self, place: PrefetchAt) -> bool {
        self.0 & place.0 != 0
    }
}

#[derive(Clone, Copy)]
pub(crate) struct L2Prefetch {
    pipeline: vk::Pipeline,
    /// The same kernel on binding 5 (a gate/up set's up weights).
    pipeline_up: vk::Pipeline,
    budget: u64,
    pub(crate) at: PrefetchAt,
}

/// One group to prefetch: its plan, the sets it binds, and whether those
/// sets carry up weights at binding 5 (read after binding 0's).
#[derive(Clone, Copy)]
pub(crate) struct PrefetchGroup<'a> {
    pub plan: &'a [Dispatch],
    pub sets: &'a [vk::DescriptorSet],
    pub up: bool,
}

impl PrefetchGroup<'_> {
    fn bytes(&self) -> u64 {
        let tensors = if self.up { 2 } else { 1 };
        self.plan
            .iter()
            .map(|d| tensors * u64::from(d.params.n_rows) * u64::from(d.params.row_stride))
            .sum()
    }
}

impl Gpu {
    /// The prefetch kernel and its budget, or None when prefetching is off.
    pub(crate) fn l2_prefetch(&self) -> Result<Option<L2Prefetch>> {
        let mb = std::env::var("FISH_GPU_PREFETCH")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        if mb == 0 {
            return Ok(None);
        }
        let at = PrefetchAt::parse(std::env::var("FISH_GPU_PREFETCH_AT").ok().as_deref());
        Ok(Some(L2Prefetch {
            pipeline: self.pipelines.get(&self.device, "l2_prefetch", &[])?,
            pipeline_up: self.pipelines.get(&self.device, "l2_prefetch_up", &[])?,
            budget: mb << 20,
            at,
        }))
    }

    /// Records reads of the weights of `groups`, in order, up to the budget:
    /// a group that does not fit in what is left gets the same prefix of
    /// each of its rows. No barrier: the caller records it beside a stage
    /// that does not touch the weights.
    pub(crate) unsafe fn record_prefetch(
        &self,
        cmd: vk::CommandBuffer,
        prefetch: &L2Prefetch,
        groups: &[PrefetchGroup<'_>],
    ) {
        let max_x = u64::from(self.info.max_workgroups_x.clamp(1, 65535));
        let mut left = prefetch.budget;
        for group in groups {
            if left < SECTOR {
                break;
            }
            let total = group.bytes();
            if total == 0 {
                continue;
            }
            // The share of each row read: all of it, or the budget's part.
            let share = |stride: u64| -> u64 {
                if total <= left {
                    stride
                } else {
                    (stride * left / total).max(SECTOR)
                }
            };
            let mut reads = Vec::with_capacity(2 * group.plan.len());
            let mut sets = Vec::with_capacity(2 * group.plan.len());
            let pipelines: &[vk::Pipeline] = if group.up {
                &[prefetch.pipeline, prefetch.pipeline_up]
            } else {
                &[prefetch.pipeline]
            };
            for &pipeline in pipelines {
                for (disp, set) in group.plan.iter().zip(group.sets) {
                    let per_row = share(u64::from(disp.params.row_stride));
                    let sectors = u64::from(disp.params.n_rows) * per_row.div_ceil(SECTOR);
                    let wgs = sectors.div_ceil(THREADS * LOADS);
                    let gx = wgs.min(max_x);
                    let mut params = disp.params;
                    params.n_in = per_row as u32;
                    params.groups_x = gx as u32;
                    params.accumulate = 0;
                    reads.push(Dispatch {
                        pipeline,
                        params,
                        groups: (gx as u32, wgs.div_ceil(gx) as u32),
                        weights: disp.weights,
                        up_weights: None,
                    });
                    sets.push(*set);
                }
            }
            left = left.saturating_sub(total);
            // Same bindings and push constants as the matmuls: record them alike.
            self.record_dispatches(cmd, &reads, &sets);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::PrefetchAt;

    #[test]
    fn places_parse_as_bits_and_default_to_attention() {
        assert_eq!(PrefetchAt::parse(None), PrefetchAt::ATTENTION);
        assert_eq!(PrefetchAt::parse(Some("nonsense")), PrefetchAt::ATTENTION);
        let both = PrefetchAt::parse(Some("gate_up, down"));
        assert!(both.has(PrefetchAt::GATE_UP) && both.has(PrefetchAt::DOWN));
        assert!(!both.has(PrefetchAt::ATTENTION));
        let all = PrefetchAt::parse(Some("all"));
        assert!(all.has(PrefetchAt::ATTENTION) && all.has(PrefetchAt::GATE_UP));
    }
}
