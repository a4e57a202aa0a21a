//! Per-thread on/off overrides of a device default: tests and benches run
//! both sides of a choice in one process. Plans and spans are made on the
//! calling thread, so an override reaches everything `f` records.

use std::cell::Cell;

/// A thread-local switch: None follows the device default.
pub(crate) type Override = std::thread::LocalKey<Cell<Option<bool>>>;

/// Puts a thread's previous setting back, also when the closure panics.
struct Restore(&'static Override, Option<bool>);

impl Drop for Restore {
    fn drop(&mut self) {
        self.0.with(|s| s.set(self.1));
    }
}

/// Runs `f` with `key` set to `on` on this thread.
pub(crate) fn with_override<R>(key: &'static Override, on: bool, f: impl FnOnce() -> R) -> R {
    let _restore = Restore(key, key.with(|s| s.replace(Some(on))));
    f()
}
