//! Command buffers of earlier forwards, kept for reuse: a forward's
//! recording depends only on its shape (tokens, rows of logits, whether its
//! tokens are consecutive positions of one slot) and on the span's buffers
//! and sets, never on its positions (those come from the step buffer), so
//! decode submits one recording again and again instead of planning and
//! recording several hundred commands per token.

use super::record::TokenLayout;
use crate::gpu::{Exec, Gpu};
use ash::vk;

/// Shapes kept at once; prefill of varied lengths would otherwise grow the
/// list without bound.
const MAX_RECORDED: usize = 8;

/// (tokens, rows of logits or None for x, token layout, whether its layers
/// are persistent dispatches, whether its attention overlaps q/k/v) of a
/// forward: plain and batched forwards of one size record different
/// attention kernels, and a single token past the persistent kernel's
/// positions takes the staged layers.
pub(crate) type ForwardKey = (usize, Option<usize>, TokenLayout, bool, bool);

#[derive(Default)]
pub(crate) struct Recorded {
    entries: Vec<(ForwardKey, vk::CommandBuffer)>,
}

impl Recorded {
    pub fn get(&self, key: ForwardKey) -> Option<vk::CommandBuffer> {
        self.entries
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, c)| *c)
    }

    /// Keeps `cmd` (allocated from the exec pool) for `key`; when the list is
    /// full the older recordings are freed first.
    pub fn insert(&mut self, gpu: &Gpu, exec: &Exec, key: ForwardKey, cmd: vk::CommandBuffer) {
        if self.entries.len() >= MAX_RECORDED {
            self.free_locked(gpu, exec);
        }
        self.entries.push((key, cmd));
    }

    /// Frees every recording (the span's buffers or sets changed).
    pub fn clear(&mut self, gpu: &Gpu) {
        if !self.entries.is_empty() {
            let exec = gpu.lock_exec();
            self.free_locked(gpu, &exec);
        }
    }

    /// Frees every recording while the caller holds the exec lock.
    pub fn free_locked(&mut self, gpu: &Gpu, exec: &Exec) {
        let cmds: Vec<vk::CommandBuffer> = self.entries.drain(..).map(|(_, c)| c).collect();
        if !cmds.is_empty() {
            // SAFETY: every submit waits for its fence, so none is pending,
            // and the exec lock serialises use of the pool.
            unsafe { gpu.device.free_command_buffers(exec.pool, &cmds) };
        }
    }
}
