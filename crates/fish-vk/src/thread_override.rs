//! Per-thread overrides of a device default: tests and benches run both
//! sides of a choice in one process. An override reaches what `f` plans
//! and records on the calling thread (lone matmul calls, and spans built
//! and recorded there), not what a session's own pool threads record: a
//! choice those must see is set process-wide instead (kernels.rs
//! `Gpu::with_preload_rows`).

use std::cell::Cell;

/// A thread-local setting: None follows the device default (an on/off
/// switch unless said otherwise).
pub(crate) type Override<T = bool> = std::thread::LocalKey<Cell<Option<T>>>;

/// Puts a thread's previous setting back, also when the closure panics.
struct Restore<T: Copy + 'static>(&'static Override<T>, Option<T>);

impl<T: Copy + 'static> Drop for Restore<T> {
    fn drop(&mut self) {
        self.0.with(|s| s.set(self.1));
    }
}

/// Runs `f` with `key` set to `value` on this thread.
pub(crate) fn with_override<T: Copy + 'static, R>(
    key: &'static Override<T>,
    value: T,
    f: impl FnOnce() -> R,
) -> R {
    let _restore = Restore(key, key.with(|s| s.replace(Some(value))));
    f()
}
