//! The process-wide backend: opened lazily on the first query, never torn
//! down at exit (the device object is leaked on purpose and the loader never
//! closed, so no driver code runs during process teardown).

use crate::config::Config;
use crate::gpu::Gpu;
use std::sync::OnceLock;

static GLOBAL: OnceLock<Result<&'static Gpu, String>> = OnceLock::new();

/// False when FISH_GPU turns the backend off; nothing is opened to answer.
pub fn enabled() -> bool {
    Config::from_env().disabled_by.is_none()
}

/// The process-wide device, opened from the environment on first use; None
/// when disabled or when anything failed (the reason is in `status()`).
pub fn global() -> Option<&'static Gpu> {
    opened().as_ref().ok().copied()
}

fn opened() -> &'static Result<&'static Gpu, String> {
    GLOBAL.get_or_init(|| {
        let config = Config::from_env();
        match Gpu::open(&config) {
            Ok(gpu) => {
                let gpu: &'static Gpu = Box::leak(Box::new(gpu));
                if config.verbose {
                    eprintln!("fish-vk: {}", gpu.describe());
                }
                Ok(gpu)
            }
            Err(e) => {
                let reason = e.to_string();
                if config.verbose {
                    eprintln!("fish-vk: GPU unavailable: {reason}");
                }
                Err(reason)
            }
        }
    })
}

/// One line on the backend's state: `ready: vulkan <device>: ...`,
/// `disabled: ...` or `unavailable: <reason>`. Opens the device if needed.
pub fn status() -> String {
    if let Some(v) = Config::from_env().disabled_by {
        if GLOBAL.get().is_none() {
            return format!("disabled: FISH_GPU={v}");
        }
    }
    match opened() {
        Ok(gpu) => format!("ready: {}", gpu.describe()),
        Err(reason) if reason.starts_with("GPU disabled") => format!("disabled: {reason}"),
        Err(reason) => format!("unavailable: {reason}"),
    }
}
