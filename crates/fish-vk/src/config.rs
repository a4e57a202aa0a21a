//! The environment knobs (docs/GPU.md), read once into a plain struct so that
//! tests and embedders can also build one by hand.

use crate::int8_dot::Int8Policy;

/// Which queue family to run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum QueuePreference {
    /// A compute-only family when the device has one (keeps off the compositor's queue).
    #[default]
    ComputeOnly,
    /// The graphics + compute family (`FISH_VK_QUEUE=universal`).
    Universal,
}

/// Whether CPU (software) Vulkan implementations may be picked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CpuDevices {
    #[default]
    Excluded,
    /// `FISH_GPU=cpu`: lavapipe and the like are acceptable (ranked last).
    Allowed,
}

#[derive(Clone, Debug, Default)]
pub struct Config {
    /// `FISH_GPU=0|off|false|no`: the value that turned the backend off.
    pub disabled_by: Option<String>,
    pub cpu_devices: CpuDevices,
    /// `FISH_GPU_DEVICE=<index>`: a physical-device index to force.
    pub device_index: Option<usize>,
    pub queue: QueuePreference,
    /// `FISH_VK_VALIDATE=1`: add the validation layer when installed.
    pub validate: bool,
    /// `FISH_GPU_VERBOSE=1`: print the status and failures on stderr.
    pub verbose: bool,
    /// `FISH_VRAM_BUDGET_MB`: own ceiling instead of 85% of free memory.
    pub budget_mb: Option<u64>,
    /// `FISH_VK_CHUNK_MB`: cap on one weight buffer (tests the row split).
    pub chunk_mb: Option<u64>,
    /// `FISH_VK_LOADER`: an explicit loader library path instead of the
    /// platform's default names.
    pub loader: Option<String>,
    /// `FISH_VK_INT8=0|1` (unset or `auto`: `Int8Policy::Accelerated`): when the
    /// matvec runs on int8 activations.
    pub int8_matvec: Int8Policy,
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn env_flag(name: &str) -> bool {
    env(name).is_some_and(|v| v != "0")
}

/// Whether the switch `name` is set to turn something off (0, off, false
/// or no), the form of every FISH_* on-by-default switch.
pub(crate) fn env_switched_off(name: &str) -> bool {
    matches!(
        std::env::var(name).as_deref(),
        Ok("0" | "off" | "false" | "no")
    )
}

/// The number in `name` where it parses and lies in `range`, else
/// `default`: the form of the numeric FISH_VK_* tuning knobs.
pub(crate) fn env_number_in<T>(name: &str, range: std::ops::RangeInclusive<T>, default: T) -> T
where
    T: std::str::FromStr + PartialOrd,
{
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .filter(|n| range.contains(n))
        .unwrap_or(default)
}

fn env_u64(name: &str) -> Option<u64> {
    env(name).and_then(|v| v.trim().parse().ok())
}

impl Config {
    pub fn from_env() -> Config {
        let gpu = env("FISH_GPU").map(|v| v.to_ascii_lowercase());
        let disabled_by = gpu
            .clone()
            .filter(|v| matches!(v.as_str(), "0" | "off" | "false" | "no"));
        let cpu_devices = if gpu.as_deref() == Some("cpu") {
            CpuDevices::Allowed
        } else {
            CpuDevices::Excluded
        };
        let queue = match env("FISH_VK_QUEUE")
            .map(|v| v.to_ascii_lowercase())
            .as_deref()
        {
            Some("universal") => QueuePreference::Universal,
            _ => QueuePreference::ComputeOnly,
        };
        Config {
            disabled_by,
            cpu_devices,
            device_index: env_u64("FISH_GPU_DEVICE").map(|i| i as usize),
            queue,
            validate: env_flag("FISH_VK_VALIDATE"),
            verbose: env_flag("FISH_GPU_VERBOSE"),
            budget_mb: env_u64("FISH_VRAM_BUDGET_MB"),
            chunk_mb: env_u64("FISH_VK_CHUNK_MB").filter(|&mb| mb > 0),
            loader: env("FISH_VK_LOADER"),
            int8_matvec: Int8Policy::from_env(),
        }
    }
}
