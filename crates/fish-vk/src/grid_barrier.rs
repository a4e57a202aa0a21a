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

/// Where the atomic_add probe's workgroups add (shaders/atomic_add_probe.comp).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtomicProbe {
    /// atomicAdd into one vector that every workgroup adds to.
    Shared,
    /// atomicAdd into a vector of each workgroup's own.
    Private,
    /// Plain stores into a vector of each workgroup's own.
    Stores,
}

impl Gpu {
    /// GPU time of `repeats` dispatches, a barrier after each, of `groups`
    /// workgroups of 256 invocations, each invocation adding `per_thread`
    /// values into a vector of `rows` 32-bit counters as `probe` says
    /// (shaders/atomic_add_probe.comp): what the reduction of a feed-forward
    /// stage split along its inner dimension, one whole vector per
    /// workgroup, would cost as a stage of its own.
    pub fn time_atomic_add(
        &self,
        probe: AtomicProbe,
        groups: u32,
        per_thread: u32,
        rows: u32,
        repeats: u32,
    ) -> Result<Duration> {
        if groups == 0 || rows == 0 || repeats == 0 {
            return Err(VkError::Input(
                "the atomic probe needs workgroups, rows and a dispatch".into(),
            ));
        }
        let pipeline = self.pipelines.get(&self.device, "atomic_add_probe", &[])?;
        let (mode, vectors) = match probe {
            AtomicProbe::Shared => (0, 1),
            AtomicProbe::Private => (1, u64::from(groups)),
            AtomicProbe::Stores => (2, u64::from(groups)),
        };
        let params = Params {
            n_in: per_thread,
            n_rows: rows,
            n_tok: mode,
            groups_x: groups,
            ..Params::default()
        };
        let x_bytes = vectors * u64::from(rows) * 4;
        let sync = DispatchSync::EveryDispatch;
        self.time_weightless_probe_with(pipeline, params, (x_bytes, 16), repeats, sync)
    }
}

/// Rows per workgroup block of the persistent chain probe (ROWS in
/// shaders/persistent_matvec_probe.comp).
const CHAIN_ROWS: usize = 4;
/// The longest rows its PREFETCH variant takes (PREFETCH_UNITS * WG units).
const CHAIN_PREFETCH_MAX_N: usize = 4096;
/// Units per lane its PRELOAD_ALL variant holds at most (PRELOAD_UNITS), and
/// the Q4_K values of a unit.
const CHAIN_PRELOAD_UNITS: usize = 4;
const Q4_K_UNIT_VALUES: usize = 32;

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
    /// A row per subgroup, all of its units held in registers and loaded
    /// after the workgroup's stores are fenced, before the grid-wide
    /// barrier: the whole next matrix in flight while the workgroups wait
    /// (256 invocations per workgroup; rows of 1 to 4 units per lane).
    PreloadAll,
}

impl Gpu {
    /// Whether the PRELOAD_ALL chain probe takes Q4_K rows of `n` values on
    /// this device: whole units per lane of a subgroup that shuffles, at
    /// most CHAIN_PRELOAD_UNITS of them.
    fn preloads_rows(&self, n: usize) -> bool {
        let lanes = self.info.subgroup_size as usize;
        let units = n / Q4_K_UNIT_VALUES;
        self.info.subgroup_shuffle
            && lanes > 0
            && units.is_multiple_of(lanes)
            && (1..=CHAIN_PRELOAD_UNITS).contains(&(units / lanes))
    }

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
            || (probe == ChainProbe::PreloadAll && !self.preloads_rows(n))
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
            ChainProbe::PreloadAll => "persistent_matvec_probe_preload",
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
