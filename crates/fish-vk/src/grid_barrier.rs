//! What a grid-wide barrier costs between the workgroups of one dispatch
//! (shaders/grid_barrier_probe.comp), for the `grid_barrier` bench: the
//! synchronisation a persistent span kernel would use between dependent
//! stages instead of a pipeline barrier.

use crate::buffer::MemoryKind;
use crate::error::Result;
use crate::gpu::Gpu;
use crate::kernels::{Dispatch, DispatchSync};
use crate::pipeline::Params;
use crate::split_k::ScratchNeed;
use std::time::Duration;

impl Gpu {
    /// GPU time of one dispatch of `groups` workgroups meeting at `rounds`
    /// grid-wide barriers. Every workgroup must be resident at once: on a
    /// device that runs fewer together (lavapipe runs one after another),
    /// each barrier lasts until the probe's waits give up, so only the
    /// time says so.
    pub fn time_grid_barrier(&self, groups: u32, rounds: u32) -> Result<Duration> {
        let pipeline = self
            .pipelines
            .get(&self.device, "grid_barrier_probe", &[])?;
        // The probe reads no weights; binding 0 still needs a buffer.
        let unused = self.alloc(256, MemoryKind::Device)?;
        let dispatch = Dispatch {
            pipeline,
            params: Params {
                n_in: rounds,
                groups_x: groups,
                ..Params::default()
            },
            groups: (groups, 1),
            weights: unused.raw,
        };
        // The arrival counter is the zeroed x scratch.
        let time = self.time_dispatches(
            &[dispatch],
            256,
            16,
            ScratchNeed::NONE,
            1,
            DispatchSync::None,
        );
        self.release(unused);
        time
    }
}
