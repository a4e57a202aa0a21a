//! fish-span: the GPU backend the engine sees. It implements fish-core's
//! `ComputeBackend` over fish-vk: per-matmul offload (stage 1), and
//! `SpanBackend`: a range of layers in one command buffer per forward
//! (stage 2).

mod backend;
pub mod requant;
pub mod requant_mix;
mod requant_upload;
mod span;

pub use backend::{open_global, VulkanBackend};
pub use requant::RequantMode;
pub use requant_mix::{RequantOutcome, RequantRecord};
pub use requant_upload::device_has;
