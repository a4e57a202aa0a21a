//! The error type of every fallible fish-vk call.

use crate::weight_format::WeightFormat;
use ash::vk;

pub type Result<T> = std::result::Result<T, VkError>;

#[derive(Debug, thiserror::Error)]
pub enum VkError {
    #[error("GPU disabled by FISH_GPU={0}")]
    Disabled(String),
    #[error("Vulkan loader not available: {0}")]
    Loader(String),
    #[error("{call} failed: {result}")]
    Vulkan {
        call: &'static str,
        result: vk::Result,
    },
    #[error("no usable Vulkan device: {0}")]
    NoDevice(String),
    #[error("weight type {0} has no GPU kernel")]
    Unsupported(WeightFormat),
    #[error("bad tensor shape: {0}")]
    Shape(String),
    #[error("allocation of {requested} bytes refused: {reason}")]
    Budget { requested: u64, reason: String },
    #[error("tensor handle {0} is not resident on this device")]
    UnknownHandle(u64),
    #[error("bad input: {0}")]
    Input(String),
    #[error("embedded shader {0} is missing or invalid")]
    Shader(String),
    #[error("kernel not available on this device: {0}")]
    KernelUnavailable(String),
}

/// Attaches the name of the Vulkan call to a raw result.
pub(crate) trait VkCall<T> {
    fn call(self, name: &'static str) -> Result<T>;
}

impl<T> VkCall<T> for std::result::Result<T, vk::Result> {
    fn call(self, name: &'static str) -> Result<T> {
        self.map_err(|result| VkError::Vulkan { call: name, result })
    }
}
