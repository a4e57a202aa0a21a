//! fish-span: the GPU backend the engine sees. It implements fish-core's
//! `ComputeBackend` over fish-vk: per-matmul offload (stage 1); the stage-2
//! span scheduler builds on it.

mod backend;

pub use backend::{open_global, VulkanBackend};
