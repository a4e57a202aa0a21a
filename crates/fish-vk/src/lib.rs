//! fish-vk: the raw Vulkan layer. Opens the loader at run time, picks a
//! device, keeps weights resident under a memory budget and runs the matmul
//! kernels (matvec for a few tokens, tiled for many) on them.
//!
//! The process-wide backend is `global()` (lazy, leaked on purpose);
//! `Gpu::open` gives an owned device that releases everything on drop.

mod budget;
mod buffer;
mod config;
mod coopmat;
pub mod coopmat2;
mod coopmat_peak;
mod device;
mod error;
mod frags;
mod frags_check;
mod full_subgroups;
mod gpu;
mod grid_barrier;
mod instance;
mod int8_dot;
mod int8_matrix;
mod kernels;
mod loader;
mod persistent_decode;
mod persistent_layer;
mod pipeline;
mod pipeline_stats;
pub mod span;
mod split_k;
mod status;
mod thread_override;
mod tile_padding;
mod upload;
mod weight_format;

pub use budget::Budget;
pub use config::{Config, CpuDevices, QueuePreference};
pub use coopmat::{CoopMatTile, Staging, WarpLayout};
pub use coopmat_peak::{peak_flops, PeakRun, PeakShape};
pub use device::DeviceInfo;
pub use error::{Result, VkError};
pub use frags::decodes as prefill_frags_decodes;
pub use gpu::Gpu;
pub use grid_barrier::{AtomicProbe, ChainProbe};
pub use int8_dot::{int8_activations, Int8Dot, Int8Policy, INT8_BLOCK};
pub use kernels::{
    supports, DispatchSync, GatedActivation, Kernel, MatmulInput, MATVEC_MAX_TOKENS,
};
pub use persistent_decode::{DecodeRun, DecodeShape, DECODE_PROBE_MAX_LAYERS};
pub use persistent_layer::{LayerProbe, LayerRun, LayerShape, LAYER_PROBE_MAX_LAYERS};
pub use pipeline::{module_bytes, COMPILED_AT_BUILD};
pub use span::{
    PersistentDispatch, PersistentMode, Reservation, Span, SpanActivation, SpanDesc, SpanFootprint,
    SpanLayerDesc, SpanOutputDesc, SpanProfiling, SpanRope, SpanShape, SpanStage,
    PERSISTENT_MAX_POSITIONS, SPAN_CHUNK_TOKENS,
};
pub use status::{enabled, global, status};
pub use tile_padding::{padded_row_stride, PaddingRule, RowStride, SharedLayout};
pub use upload::{TensorHandle, ROW_MULTIPLE};
pub use weight_format::{WeightFormat, FQ3_BLOCK_BYTES, FQ3_BLOCK_VALUES};
