//! fish-core: the inference engine.
//!
//! Model configuration from GGUF metadata, tokenizer and chat template, the
//! CPU forward pass over memory-mapped weights, KV cache and sampling. A GPU
//! backend is handed in as a trait object; this crate knows no Vulkan.

pub mod backend;
pub mod batch;
pub mod error;
pub mod model;

pub use error::{EngineError, Result};
pub mod chat;
pub mod generate;
pub mod sampling;
pub mod session;
pub mod spec_controller;
pub mod speculative;
pub mod tokenizer;
