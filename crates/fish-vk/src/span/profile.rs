//! FISH_GPU_PROFILE=2: a timestamp after every stage of a span forward, and
//! the share of GPU time each kind of stage took; FISH_GPU_PROFILE=3 also
//! lists the stages of the middle layer and those after the last layer
//! with their times, in order; FISH_GPU_PROFILE=4 lists every layer's
//! (every layer and chunk's, in prefill): layers of one shape can differ in
//! their weight types (a Q4_K_M file's down projections are Q6_K in some
//! layers only).

use crate::error::{Result, VkCall};
use ash::vk;

/// What a span times: nothing, its forwards as wholes (FISH_GPU_PROFILE=1,
/// span/forward_timer.rs: two timestamps in the recording decode reuses,
/// and the host's phases), or every stage (2 and up: each forward
/// recorded afresh with a timestamp per stage).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpanProfiling {
    Off,
    Forwards,
    Stages,
}

impl SpanProfiling {
    /// The kind FISH_GPU_PROFILE asks for.
    pub fn from_env() -> SpanProfiling {
        match level() {
            0 => SpanProfiling::Off,
            1 => SpanProfiling::Forwards,
            _ => SpanProfiling::Stages,
        }
    }
}

/// The kinds of span stages the profile reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpanStage {
    Matvec,
    RmsNorm,
    Attention,
    ActMul,
    Add,
    /// RoPE and the KV store run as one fused kernel.
    RopeKvStore,
    /// A whole layer in one dispatch (span/persistent.rs).
    PersistentLayer,
}

impl SpanStage {
    const ALL: [SpanStage; 7] = [
        SpanStage::Matvec,
        SpanStage::RmsNorm,
        SpanStage::Attention,
        SpanStage::ActMul,
        SpanStage::Add,
        SpanStage::RopeKvStore,
        SpanStage::PersistentLayer,
    ];

    pub fn label(self) -> &'static str {
        match self {
            SpanStage::Matvec => "matvec",
            SpanStage::RmsNorm => "rmsnorm",
            SpanStage::Attention => "attention",
            SpanStage::ActMul => "act*mul",
            SpanStage::Add => "add",
            SpanStage::RopeKvStore => "RoPE+KV store",
            SpanStage::PersistentLayer => "persistent layer",
        }
    }
}

pub(crate) struct Profiler {
    pool: vk::QueryPool,
    capacity: u32,
    period_ns: f64,
    /// The stage that ended at each timestamp after the first, in order.
    pub marks: Vec<SpanStage>,
    /// The index in `marks` of each layer's (each chunk's) first stage,
    /// then the index past the last layer's stages.
    pub layer_starts: Vec<usize>,
    /// Nanoseconds per stage kind of the last forward.
    last: Option<Vec<(SpanStage, f64)>>,
    /// The middle layer's stages of the last forward, in order (level 3).
    middle_layer: Vec<(SpanStage, f64)>,
    /// Every layer's stages of the last forward, in order (level 4).
    layer_stages: Vec<Vec<(SpanStage, f64)>>,
    /// The stages after the last layer (output norm and projection), in
    /// order (level 3).
    output_stages: Vec<(SpanStage, f64)>,
    /// Host nanoseconds of the last forward: preparing (plans, bindings, x
    /// upload), recording + submit + fence wait, and reading x back.
    pub host_ns: [u64; 3],
}

/// Timestamps 0..ticks.len() of `pool`, which a finished submission wrote.
pub(super) fn read_timestamps(
    device: &ash::Device,
    pool: vk::QueryPool,
    ticks: &mut [u64],
) -> Result<()> {
    // SAFETY: the caller's finished submission wrote those queries.
    unsafe {
        device.get_query_pool_results(
            pool,
            0,
            ticks,
            vk::QueryResultFlags::TYPE_64 | vk::QueryResultFlags::WAIT,
        )
    }
    .call("vkGetQueryPoolResults")
}

/// `stages` as `label us, ...`, in order.
fn stage_list(stages: &[(SpanStage, f64)]) -> String {
    let parts: Vec<String> = stages
        .iter()
        .map(|(s, ns)| format!("{} {:.1}", s.label(), ns / 1e3))
        .collect();
    parts.join(", ")
}

/// The level FISH_GPU_PROFILE asks for (0 when unset or not a number).
fn level() -> u32 {
    std::env::var("FISH_GPU_PROFILE")
        .ok()
        .and_then(|v| v.trim().parse::<u32>().ok())
        .unwrap_or(0)
}

impl Profiler {
    pub fn new(period_ns: f64) -> Profiler {
        Profiler {
            pool: vk::QueryPool::null(),
            capacity: 0,
            period_ns,
            marks: Vec::new(),
            layer_starts: Vec::new(),
            last: None,
            middle_layer: Vec::new(),
            layer_stages: Vec::new(),
            output_stages: Vec::new(),
            host_ns: [0; 3],
        }
    }

    /// Makes the query pool hold `n` timestamps.
    pub fn ensure(&mut self, device: &ash::Device, n: u32) -> Result<()> {
        if n <= self.capacity {
            return Ok(());
        }
        let info = vk::QueryPoolCreateInfo::default()
            .query_type(vk::QueryType::TIMESTAMP)
            .query_count(n);
        // SAFETY: valid create info; the old pool is unused (forwards wait).
        let pool = unsafe { device.create_query_pool(&info, None) }.call("vkCreateQueryPool")?;
        self.destroy_pool(device);
        self.pool = pool;
        self.capacity = n;
        Ok(())
    }

    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    pub fn pool(&self) -> vk::QueryPool {
        self.pool
    }

    /// Reads the timestamps of the finished forward and sums them per stage.
    pub fn collect(&mut self, device: &ash::Device) -> Result<()> {
        let n = self.marks.len() + 1;
        let mut ticks = vec![0u64; n];
        read_timestamps(device, self.pool, &mut ticks)?;
        let mut per_stage: Vec<(SpanStage, f64)> =
            SpanStage::ALL.iter().map(|&s| (s, 0.0)).collect();
        let mut per_mark = Vec::with_capacity(self.marks.len());
        for (i, stage) in self.marks.iter().enumerate() {
            let ns = ticks[i + 1].wrapping_sub(ticks[i]) as f64 * self.period_ns;
            if let Some(slot) = per_stage.iter_mut().find(|(s, _)| s == stage) {
                slot.1 += ns;
            }
            per_mark.push((*stage, ns));
        }
        self.last = Some(per_stage);
        // Layer i's stages are marks layer_starts[i] .. layer_starts[i + 1]
        // (both at most marks.len(): they were taken while recording).
        let layers = self.layer_starts.len().saturating_sub(1);
        if layers > 0 {
            let middle = layers / 2;
            let (start, end) = (self.layer_starts[middle], self.layer_starts[middle + 1]);
            self.middle_layer = per_mark[start..end].to_vec();
        }
        self.layer_stages = match level() >= 4 {
            true => self
                .layer_starts
                .windows(2)
                .map(|w| per_mark[w[0]..w[1]].to_vec())
                .collect(),
            false => Vec::new(),
        };
        let after_layers = self.layer_starts.last().copied().unwrap_or(per_mark.len());
        self.output_stages = per_mark[after_layers.min(per_mark.len())..].to_vec();
        Ok(())
    }

    /// e.g. `span 1.92 ms: matvec 92.6%, rmsnorm 2.3%, ...`.
    pub fn summary(&self) -> Option<String> {
        let stages = self.last.as_ref()?;
        let total: f64 = stages.iter().map(|(_, ns)| ns).sum();
        if total <= 0.0 {
            return None;
        }
        // The persistent layer only where it ran (staged forwards never do).
        let parts: Vec<String> = stages
            .iter()
            .filter(|&&(s, ns)| s != SpanStage::PersistentLayer || ns > 0.0)
            .map(|(s, ns)| format!("{} {:.1}%", s.label(), 100.0 * ns / total))
            .collect();
        let [prepare, execute, read] = self.host_ns.map(|ns| ns as f64 / 1e6);
        let mut line = format!(
            "span {:.3} ms: {} (host: prepare {prepare:.3} ms, record+submit+wait {execute:.3} ms, read back {read:.3} ms)",
            total / 1e6,
            parts.join(", ")
        );
        if level() >= 3 {
            for (name, stages) in [
                ("middle layer", &self.middle_layer),
                ("output", &self.output_stages),
            ] {
                if !stages.is_empty() {
                    line.push_str(&format!("; {name}, us: {}", stage_list(stages)));
                }
            }
        }
        for (i, stages) in self.layer_stages.iter().enumerate() {
            line.push_str(&format!("; layer {i}, us: {}", stage_list(stages)));
        }
        Some(line)
    }

    fn destroy_pool(&mut self, device: &ash::Device) {
        if self.pool != vk::QueryPool::null() {
            // SAFETY: no pending submission uses the pool.
            unsafe { device.destroy_query_pool(self.pool, None) };
            self.pool = vk::QueryPool::null();
        }
    }

    pub fn destroy(mut self, device: &ash::Device) {
        self.destroy_pool(device);
    }
}
