//! Warming the L2 cache with the weights of a span's next matvec while the
//! small stages before it run (shaders/l2_prefetch.comp).
//!
//! A decode step alternates matvecs, which stream weights, with norms, RoPE,
//! attention and act*mul, which are bound by latency and leave the memory
//! bus idle for several microseconds each. A prefetch recorded beside such
//! a stage (no barrier between them) reads the next matvec's weights into
//! L2 meanwhile, so that matvec starts on cached bytes. `FISH_GPU_PREFETCH`
//! sets the budget per stage in MB; it is off by default: on the H200 the
//! matvecs ran only ~2% faster from L2 (they are bound by their
//! instructions, not by the memory), and the prefetch lengthened the stages
//! it rode along with by more (llama-8b decode 215 tok/s without, 203 / 197
//! / 188 / 182 with 12 / 24 / 48 / 100 MB; docs/BENCHMARKS.md).

use crate::error::Result;
use crate::gpu::Gpu;
use crate::kernels::Dispatch;
use ash::vk;

/// Threads per workgroup of l2_prefetch.comp; each reads one 32-byte sector.
const THREADS: u64 = 256;
const SECTOR: u64 = 32;

#[derive(Clone, Copy)]
pub(crate) struct L2Prefetch {
    pipeline: vk::Pipeline,
    budget: u64,
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
        let pipeline = self.pipelines.get(&self.device, "l2_prefetch", &[])?;
        Ok(Some(L2Prefetch {
            pipeline,
            budget: mb << 20,
        }))
    }

    /// Records reads of the weights of `plan` (bound by `sets`), in order,
    /// up to the budget. No barrier: the caller records it beside a stage
    /// that does not touch the weights.
    pub(crate) unsafe fn record_prefetch(
        &self,
        cmd: vk::CommandBuffer,
        prefetch: &L2Prefetch,
        plan: &[Dispatch],
        sets: &[vk::DescriptorSet],
    ) {
        let max_x = u64::from(self.info.max_workgroups_x.clamp(1, 65535));
        let mut left = prefetch.budget;
        let mut reads = Vec::with_capacity(plan.len());
        for disp in plan {
            let bytes =
                (u64::from(disp.params.n_rows) * u64::from(disp.params.row_stride)).min(left);
            if bytes < SECTOR {
                break;
            }
            left -= bytes;
            let groups = (bytes / SECTOR).div_ceil(THREADS);
            let gx = groups.min(max_x);
            let mut params = disp.params;
            // The shader reads min(n_rows * row_stride, n_in) bytes.
            params.n_in = bytes as u32;
            params.groups_x = gx as u32;
            params.accumulate = 0;
            reads.push(Dispatch {
                pipeline: prefetch.pipeline,
                params,
                groups: (gx as u32, groups.div_ceil(gx) as u32),
                weights: disp.weights,
                up_weights: None,
            });
        }
        // Same bindings and push constants as the matmuls: record them alike.
        self.record_dispatches(cmd, &reads, sets);
    }
}
