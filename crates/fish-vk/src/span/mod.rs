//! Stage 2: a contiguous range of layers run entirely on the device, one
//! command buffer and one fence per forward.
//!
//! A `Span` owns what the range needs besides the resident weights: the
//! parameters (norm vectors, biases, RoPE tables; uploaded once), the work
//! arena (the residual stream and per-chunk buffers), an f16 KV cache per
//! layer that grows on demand up to the context, the span pipelines and the
//! descriptor sets that bind all of it. Like `Buffer`, a `Span` does not free
//! itself: its owner hands it back with `Gpu::span_destroy`.

mod arena;
mod attention_split;
mod bindings;
mod desc;
mod forward;
mod forward_timer;
mod kv;
mod output;
mod params;
mod persistent;
mod pipelines;
mod prefetch;
mod profile;
mod record;
mod recorded;
mod step;

pub use desc::{SpanActivation, SpanDesc, SpanLayerDesc, SpanOutputDesc, SpanRope, SpanShape};
pub use persistent::{PersistentDispatch, PersistentMode, PERSISTENT_MAX_POSITIONS};
pub use profile::{SpanProfiling, SpanStage};
pub use step::{SpanRow, SPAN_MAX_BATCH_ROWS};

use crate::error::Result;
use crate::gpu::Gpu;
use arena::Arena;
use bindings::Bindings;
use forward_timer::ForwardTimer;
use kv::KvCache;
use output::SpanOutput;
use params::Params;
use persistent::Persistent;
use pipelines::SpanPipelines;
use profile::Profiler;
use recorded::Recorded;

/// The fewest tokens per chunk (and the most rows of logits or batched
/// sequences one forward takes, which size the step table and the logits).
pub const SPAN_CHUNK_TOKENS: usize = 64;

/// Tokens per chunk of a forward: the work buffers hold this many, so one
/// matmul dispatch covers a whole chunk. Prefill wants large chunks: with 64
/// tokens a 4096-row projection has only 64 workgroups of 64 x 64 for the
/// GPU's 132 multiprocessors. `FISH_GPU_SPAN_CHUNK=N` (a multiple of 64, at
/// most 4096) overrides the default.
pub fn span_chunk_tokens() -> usize {
    static CHUNK: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CHUNK.get_or_init(|| {
        std::env::var("FISH_GPU_SPAN_CHUNK")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|&n| {
                n.is_multiple_of(SPAN_CHUNK_TOKENS) && (SPAN_CHUNK_TOKENS..=4096).contains(&n)
            })
            .unwrap_or(DEFAULT_CHUNK_TOKENS)
    })
}

/// See [`span_chunk_tokens`]. With the wide prefill tile, 1024 tokens give
/// every llama-8b projection enough 128 x 128 workgroups (wo and down 256):
/// on the H200 (`fish-cli bench MODEL -p 2048 -n 0 -r 1`) pp2048 went 6654
/// -> 7586 tok/s (llama-8b) and 33939 -> 40102 (llama-1b) against 512. The
/// work buffers grow with it (~176 MB for llama-8b, 88 MB at 512).
const DEFAULT_CHUNK_TOKENS: usize = 1024;

/// What a span's device memory depends on, known before its layers are
/// placed (so that placement can hold it first).
#[derive(Clone, Debug)]
pub struct SpanFootprint {
    pub shape: SpanShape,
    pub n_layers: usize,
    /// The widest feed-forward of the span's layers.
    pub n_ff: usize,
    /// RoPE tables (1, or 2 with sliding-window layers).
    pub rope_tables: usize,
    /// Vocabulary when the span runs the output.
    pub n_vocab: Option<usize>,
}

impl SpanFootprint {
    /// Device bytes `span_create` allocates at most on `gpu`: parameters
    /// (counting every optional vector), the arena (with the split scratch
    /// of the batch tile `gpu` picks), the first KV and the logits.
    pub fn device_bytes(&self, gpu: &Gpu) -> u64 {
        let s = &self.shape;
        let per_layer = 4 * s.n_embd + s.q_dim() + s.k_dim() + s.v_dim() + 2 * s.head_dim;
        let params = self.n_layers * per_layer + self.rope_tables * s.n_ctx * s.n_rot + s.n_embd;
        let f32_bytes = |n: usize| (n as u64 * 4).next_multiple_of(16);
        f32_bytes(params)
            + Arena::initial_device_bytes(gpu, s, self.n_ff)
            + KvCache::initial_bytes(s, self.n_layers)
            + self.n_vocab.map_or(0, f32_bytes)
    }
}

/// Device memory held for a span before it exists (`Gpu::reserve`).
pub struct Reservation {
    blocks: Vec<crate::buffer::Buffer>,
}

/// Reservations are allocated in blocks of at most this many bytes (below
/// every device's single-allocation limit).
const RESERVATION_BLOCK: u64 = 256 << 20;

/// The device resources of one span (see the module docs).
pub struct Span {
    shape: SpanShape,
    layers: Vec<desc::LayerTensors>,
    params: Params,
    arena: Arena,
    kv: KvCache,
    /// The model's output, when the span runs it (SpanDesc::output).
    output: Option<SpanOutput>,
    pipelines: SpanPipelines,
    bindings: Option<Bindings>,
    /// Command buffers of earlier forwards, reused for the same shape.
    recorded: Recorded,
    /// Single-token forwards run each layer as one dispatch, where asked
    /// for (`Gpu::span_set_persistent`).
    persistent: Option<Persistent>,
    /// One-token forwards run each layer's attention beside its q/k/v
    /// matvec (`record::qkv_overlap_wanted`, read at creation) until a wait
    /// gives up (`qkv_overlap_gave_up`).
    qkv_overlap: bool,
    qkv_overlap_gave_up: bool,
    profiler: Option<Profiler>,
    forward_timer: Option<ForwardTimer>,
}

impl Span {
    /// Positions held by the device KV (slot 0, the sequence of plain forwards).
    pub fn kv_len(&self) -> usize {
        self.kv.len(0)
    }

    /// Positions the device KV has room for in each slot before it must grow.
    pub fn kv_capacity(&self) -> usize {
        self.kv.capacity
    }

    /// Keeps positions `< n` (of slot 0).
    pub fn kv_truncate(&mut self, n: usize) {
        self.kv.truncate(0, n);
    }

    /// Positions held by KV slot `slot` (0 for a slot not allocated yet).
    pub fn kv_slot_len(&self, slot: usize) -> usize {
        self.kv.len(slot)
    }

    /// Keeps positions `< n` of KV slot `slot`; the other slots are untouched.
    pub fn kv_slot_truncate(&mut self, slot: usize, n: usize) {
        self.kv.truncate(slot, n);
    }

    /// KV slots allocated (at least 1).
    pub fn kv_slots(&self) -> usize {
        self.kv.n_slots()
    }

    /// The most rows of several slots one batched forward takes
    /// (`Gpu::span_forward_rows`; one slot's rows may be any number).
    pub fn max_batch_rows(&self) -> usize {
        SPAN_MAX_BATCH_ROWS
    }

    /// Layers in the span.
    pub fn n_layers(&self) -> usize {
        self.layers.len()
    }

    /// Device bytes the span holds (parameters, arena, KV and logits).
    pub fn device_bytes(&self) -> u64 {
        let logits = self.output.as_ref().map_or(0, SpanOutput::bytes);
        let persistent = self.persistent.as_ref().map_or(0, |p| p.scratch.size);
        self.params.bytes() + self.arena.bytes() + self.kv.bytes() + logits + persistent
    }

    /// The most rows of logits one forward can return
    /// (`Gpu::span_forward_logits`); 0 when the span does not run the output.
    pub fn max_logit_rows(&self) -> usize {
        if self.output.is_some() {
            SPAN_CHUNK_TOKENS
        } else {
            0
        }
    }

    /// Whether one-token forwards run each layer's attention beside its
    /// q/k/v matvec: wanted at creation, and no wait has given up.
    pub(crate) fn overlaps_qkv(&self) -> bool {
        self.qkv_overlap && !self.qkv_overlap_gave_up
    }

    /// Whether an attention wait for its q/k/v rows gave up, so that
    /// one-token forwards keep the barrier after q/k/v from then on
    /// (`record::qkv_overlap_wanted`).
    pub fn qkv_overlap_gave_up(&self) -> bool {
        self.qkv_overlap_gave_up
    }

    /// How single-token forwards run their layers: None the staged
    /// recording, else one dispatch per layer (`Gpu::span_set_persistent`).
    pub fn persistent(&self) -> Option<PersistentMode> {
        self.persistent.as_ref().map(|p| p.mode)
    }

    /// Device bytes of the KV cache alone.
    pub fn kv_bytes(&self) -> u64 {
        self.kv.bytes()
    }

    /// The per-stage share of GPU time of the last forward, when the span was
    /// created with `SpanProfiling::Stages`; with `Forwards`, the GPU's and
    /// the host's time per forward over all of its forwards.
    pub fn profile(&self) -> Option<String> {
        match (&self.profiler, &self.forward_timer) {
            (Some(p), _) => p.summary(),
            (None, Some(t)) => t.summary(),
            (None, None) => None,
        }
    }
}

impl Gpu {
    /// Why the device cannot run the cooperative-matrix prefill attention
    /// (shaders/span_attention_coopmat.comp), or None where it can: it needs
    /// 16x16x16 f16 fragments with f32 accumulators (those of the prefill
    /// tile) and 32-invocation subgroups with shuffles;
    /// `FISH_GPU_ATTN_COOPMAT=0` turns it off.
    fn coopmat_attention_unavailable(&self) -> Option<&'static str> {
        let off = crate::config::env_switched_off("FISH_GPU_ATTN_COOPMAT");
        let fragments = self
            .info
            .cooperative_matrix
            .is_some_and(|t| (t.tm, t.tn, t.tk) == (16, 16, 16));
        if off {
            Some("FISH_GPU_ATTN_COOPMAT=0")
        } else if !fragments {
            Some("no 16x16x16 f16 cooperative-matrix fragments")
        } else if self.info.subgroup_size != 32 || !self.info.subgroup_shuffle {
            Some("needs 32-invocation subgroups with shuffles")
        } else {
            None
        }
    }

    /// Whether spans build the key-split attention kernels
    /// (shaders/span_attention_split.comp): they need subgroup arithmetic;
    /// `FISH_GPU_ATTN_SPLIT=0` keeps one workgroup per head and token.
    fn split_attention_wanted(&self) -> bool {
        self.info.subgroup_arithmetic && !crate::config::env_switched_off("FISH_GPU_ATTN_SPLIT")
    }

    /// Uploads the span's parameters and allocates its arena and an initial
    /// KV; `profiling` says what its forwards time (`SpanProfiling`).
    pub fn span_create(&self, desc: &SpanDesc<'_>, profiling: SpanProfiling) -> Result<Span> {
        let layers = desc.validate()?;
        let unavailable = self.coopmat_attention_unavailable();
        let pipelines = SpanPipelines::new(
            &self.device,
            self.pipelines.stats.as_ref(),
            unavailable.is_none(),
            self.split_attention_wanted(),
        )?;
        if self.config.verbose {
            eprintln!(
                "fish-vk: prefill attention: {}",
                pipelines.attention_choice(unavailable)
            );
        }
        let (params, arena, kv) = match self.span_memory(desc, &layers) {
            Ok(parts) => parts,
            Err(e) => {
                pipelines.destroy(&self.device);
                return Err(e);
            }
        };
        let output = match desc
            .output
            .as_ref()
            .map(|o| SpanOutput::new(self, o.weight))
        {
            None => None,
            Some(Ok(o)) => Some(o),
            Some(Err(e)) => {
                pipelines.destroy(&self.device);
                params.release(self);
                arena.release(self);
                kv.release(self);
                return Err(e);
            }
        };
        // Without timestamps on the queue there is nothing to time.
        let period = self.info.timestamp_period_ns;
        let profiler = match profiling {
            SpanProfiling::Stages => period.map(Profiler::new),
            _ => None,
        };
        let mut span = Span {
            shape: desc.shape.clone(),
            layers,
            params,
            arena,
            kv,
            output,
            pipelines,
            bindings: None,
            recorded: Recorded::default(),
            persistent: None,
            qkv_overlap: record::qkv_overlap_wanted(),
            qkv_overlap_gave_up: false,
            profiler,
            forward_timer: None,
        };
        if let (SpanProfiling::Forwards, Some(ns)) = (profiling, period) {
            match ForwardTimer::new(&self.device, ns) {
                Ok(t) => span.forward_timer = Some(t),
                Err(e) => {
                    self.span_destroy(span);
                    return Err(e);
                }
            }
        }
        if let Some(mode) = PersistentMode::from_env() {
            // Asked for by name: say why it is not taken, and go on without.
            if let Err(e) = self.span_set_persistent(&mut span, Some(mode)) {
                eprintln!("fish-vk: FISH_GPU_PERSISTENT: staged decode layers ({e})");
            } else if self.config.verbose {
                eprintln!(
                    "fish-vk: persistent decode layers on {} workgroups, {}",
                    mode.groups,
                    match mode.dispatch {
                        PersistentDispatch::Layer => "one dispatch per layer",
                        PersistentDispatch::Phase => "one dispatch per stage",
                        PersistentDispatch::Span => "the span's layers in one dispatch",
                    }
                );
            }
        }
        Ok(span)
    }

    /// Runs the layers of single-token forwards below
    /// `PERSISTENT_MAX_POSITIONS` as one dispatch each on `mode.groups`
    /// workgroups (shaders/span_persistent_layer.comp), or (None) as staged
    /// dispatches. Every workgroup must be resident at once: where they are
    /// not, a wait gives up, and the span returns to staged layers and runs
    /// that forward again. Refused, leaving the span staged, where the
    /// kernel does not take its layers.
    pub fn span_set_persistent(&self, span: &mut Span, mode: Option<PersistentMode>) -> Result<()> {
        // Recordings and sets bind the old state.
        span.recorded.clear(self);
        if let Some(b) = span.bindings.take() {
            b.destroy(&self.device);
        }
        if let Some(p) = span.persistent.take() {
            p.release(self);
        }
        if let Some(mode) = mode {
            span.persistent =
                Some(self.persistent_new(mode, &span.shape, &span.layers, &span.params)?);
        }
        Ok(())
    }

    /// Parameters, arena and initial KV; on failure nothing stays allocated.
    fn span_memory(
        &self,
        desc: &SpanDesc<'_>,
        layers: &[desc::LayerTensors],
    ) -> Result<(Params, Arena, KvCache)> {
        let params = Params::upload(self, desc)?;
        let arena = match Arena::new(self, &desc.shape, layers) {
            Ok(a) => a,
            Err(e) => {
                params.release(self);
                return Err(e);
            }
        };
        match KvCache::new(self, &desc.shape, layers.len()) {
            Ok(kv) => Ok((params, arena, kv)),
            Err(e) => {
                params.release(self);
                arena.release(self);
                Err(e)
            }
        }
    }

    /// Makes room for `n_pos` positions in the span's KV (never past n_ctx).
    pub fn span_reserve(&self, span: &mut Span, n_pos: usize) -> Result<()> {
        self.span_reserve_slot(span, 0, n_pos)
    }

    /// Makes room for `n_pos` positions in KV slot `slot` (allocating the
    /// slots up to it; every slot has the same capacity). Refused cleanly,
    /// with the KV unchanged, when the budget cannot take it.
    pub fn span_reserve_slot(&self, span: &mut Span, slot: usize, n_pos: usize) -> Result<()> {
        if span.kv.reserve(self, &span.shape, slot, n_pos)? {
            // The KV buffers changed: the sets that bound them are stale, and
            // so are the recordings.
            span.recorded.clear(self);
            if let Some(b) = span.bindings.take() {
                b.destroy(&self.device);
            }
        }
        Ok(())
    }

    /// Holds `bytes` of device memory under the budget until `release_reservation`:
    /// later allocations see that much less.
    pub fn reserve(&self, bytes: u64) -> Result<Reservation> {
        let mut blocks = Vec::new();
        let mut left = bytes;
        while left > 0 {
            let size = left.min(RESERVATION_BLOCK);
            match self.alloc(size, crate::buffer::MemoryKind::Device) {
                Ok(b) => blocks.push(b),
                Err(e) => {
                    blocks.into_iter().for_each(|b| self.release(b));
                    return Err(e);
                }
            }
            left -= size;
        }
        Ok(Reservation { blocks })
    }

    pub fn release_reservation(&self, r: Reservation) {
        r.blocks.into_iter().for_each(|b| self.release(b));
    }

    /// Releases everything the span holds on the device.
    pub fn span_destroy(&self, span: Span) {
        // Forwards wait for their fences; holding the exec lock means none runs.
        let idle = self.lock_exec();
        let mut recorded = span.recorded;
        recorded.free_locked(self, &idle);
        if let Some(b) = span.bindings {
            b.destroy(&self.device);
        }
        if let Some(p) = span.profiler {
            p.destroy(&self.device);
        }
        if let Some(t) = span.forward_timer {
            t.destroy(&self.device);
        }
        span.pipelines.destroy(&self.device);
        if let Some(p) = span.persistent {
            p.release(self);
        }
        span.params.release(self);
        span.arena.release(self);
        span.kv.release(self);
        if let Some(o) = span.output {
            o.release(self);
        }
    }
}
