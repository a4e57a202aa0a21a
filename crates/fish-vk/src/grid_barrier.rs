//! What a grid-wide barrier costs between the workgroups of one dispatch
//! (shaders/grid_barrier_probe.comp), for the `grid_barrier` bench: the
//! synchronisation a persistent span kernel would use between dependent
//! stages instead of a pipeline barrier; and a chain of dependent matvecs
//! run that way (shaders/persistent_matvec_probe.comp, the
//! `persistent_chain` bench).

use crate::error::{Result, VkError};
use crate::gpu::Gpu;
use crate::kernels::{Dispatch, DispatchSync, Kernel};
use crate::pipeline::Params;
use crate::split_k::ScratchNeed;
use crate::upload::TensorHandle;
use crate::weight_format::WeightFormat;
use fish_gguf::GgmlType;
use std::time::Duration;

impl Gpu {
    /// GPU time of one dispatch of `groups` workgroups meeting at `rounds`
    /// grid-wide barriers. Every workgroup must be resident at once: on a
    /// device that runs fewer together each barrier lasts until the probe's
    /// waits give up, so only the time says so (and lavapipe ends a poller
    /// whose loop passes 65535 iterations).
    pub fn time_grid_barrier(&self, groups: u32, rounds: u32) -> Result<Duration> {
        let pipeline = self
            .pipelines
            .get(&self.device, "grid_barrier_probe", &[])?;
        // The arrival counter is the zeroed x scratch.
        self.time_weightless_probe(pipeline, rounds, groups, (256, 16), 1)
    }
}

/// Rows per workgroup block of the persistent chain probe (ROWS in
/// shaders/persistent_matvec_probe.comp).
const CHAIN_ROWS: usize = 4;
/// The longest rows its PREFETCH variant takes (PREFETCH_UNITS * WG units).
const CHAIN_PREFETCH_MAX_N: usize = 4096;

/// The persistent chain probe's variants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChainProbe {
    /// Workgroups take row blocks in turn, x from L2.
    Plain,
    /// x staged in shared memory once per matvec; the next matvec's first
    /// block of weights loaded before the grid-wide barrier.
    Prefetch,
    /// `Prefetch` with x staged through L1-cached loads (timing only: the
    /// probe rewrites x in place, so the values may be stale).
    PrefetchL1,
}

impl Gpu {
    /// GPU time of one dispatch of `groups` workgroups running a chain of
    /// `chain` dependent matvecs with a grid-wide barrier after each
    /// (shaders/persistent_matvec_probe.comp): matvec m multiplies copy
    /// m % copies of the rows of `handle`, which holds `copies` square
    /// matrices of `handle.n_in()` rows one after another. Q4_K only (rows
    /// of at most 4096 values for `ChainProbe::Prefetch`); the same
    /// residency caveat as `time_grid_barrier`.
    pub fn time_persistent_chain(
        &self,
        probe: ChainProbe,
        handle: TensorHandle,
        copies: usize,
        chain: u32,
        groups: u32,
    ) -> Result<Duration> {
        let n = handle.n_in();
        if handle.ty() != WeightFormat::Ggml(GgmlType::Q4_K)
            || copies == 0
            || handle.n_out() != copies * n
            || !n.is_multiple_of(CHAIN_ROWS)
            || (probe != ChainProbe::Plain && n > CHAIN_PREFETCH_MAX_N)
        {
            return Err(VkError::Input(format!(
                "the chain probe takes Q4_K copies of square matrices ({:?} {}x{} as {copies})",
                handle.ty(),
                n,
                handle.n_out()
            )));
        }
        let plan = self.plan_handles(&[handle], 1, Kernel::Matvec)?;
        let [planned] = plan.as_slice() else {
            return Err(VkError::Input(
                "the chain probe needs one weight buffer".into(),
            ));
        };
        let module = match probe {
            ChainProbe::Plain => "persistent_matvec_probe",
            ChainProbe::Prefetch => "persistent_matvec_probe_prefetch",
            ChainProbe::PrefetchL1 => "persistent_matvec_probe_prefetch_l1",
        };
        let pipeline = self.pipelines.get(&self.device, module, &[])?;
        let dispatch = Dispatch {
            pipeline,
            params: Params {
                n_in: n as u32,
                n_rows: n as u32,
                n_tok: chain,
                row_stride: planned.params.row_stride,
                y_stride: copies as u32,
                groups_x: groups,
                ..Params::default()
            },
            groups: (groups, 1),
            weights: planned.weights,
            up_weights: None,
        };
        // x and y hold one vector each; the arrival counter follows x.
        let x_bytes = (n as u64 + 64) * 4;
        self.time_dispatches(
            &[dispatch],
            x_bytes,
            n as u64 * 4,
            ScratchNeed::NONE,
            1,
            DispatchSync::None,
        )
    }
}
