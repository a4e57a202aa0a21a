//! Device-memory budget: the live free memory, the backend's own ceiling and
//! the headroom rule that keeps the driver from demoting weights.

use vk_mem::Allocator;

const MB: u64 = 1 << 20;
/// The least headroom ever left free (a fill to the last ~64 MB was measured
/// to let the driver demote weights to system memory).
const MIN_HEADROOM: u64 = 256 * MB;

#[derive(Clone, Copy, Debug)]
pub struct Budget {
    pub heap_size: u64,
    /// Most bytes this backend may hold (weights and scratch together).
    pub ceiling: u64,
}

impl Budget {
    /// `free_at_init` is memory_free() when the device was opened; an explicit
    /// `budget_mb` (FISH_VRAM_BUDGET_MB) replaces 85% of it.
    pub fn new(heap_size: u64, free_at_init: u64, budget_mb: Option<u64>) -> Budget {
        let ceiling = match budget_mb {
            Some(mb) => mb.saturating_mul(MB),
            None => free_at_init / 100 * 85,
        };
        Budget { heap_size, ceiling }
    }

    /// Memory that must stay free after any allocation: max(256 MB, 10% of the heap).
    pub fn headroom(&self) -> u64 {
        MIN_HEADROOM.max(self.heap_size / 10)
    }

    /// Whether `request` more bytes may be allocated, given what this backend
    /// holds and what is free on the heap right now; the error says why not.
    pub fn check(&self, request: u64, own_in_use: u64, free_now: u64) -> Result<(), String> {
        let after = own_in_use.saturating_add(request);
        if after > self.ceiling {
            return Err(format!(
                "would hold {} MB, over the ceiling of {} MB",
                after.div_ceil(MB),
                self.ceiling / MB
            ));
        }
        let left = free_now.saturating_sub(request);
        if left < self.headroom() {
            return Err(format!(
                "would leave {} MB free, less than the {} MB headroom",
                left / MB,
                self.headroom() / MB
            ));
        }
        Ok(())
    }
}

/// Free bytes on `heap`: budget - usage from VK_EXT_memory_budget when the
/// device has it; without it the allocator reports 80% of the heap as the
/// budget and its own blocks as usage, which is the documented fallback.
pub(crate) fn memory_free(allocator: &Allocator, heap: u32) -> u64 {
    match allocator.get_heap_budgets() {
        Ok(budgets) => budgets
            .get(heap as usize)
            .map(|b| b.budget.saturating_sub(b.usage))
            .unwrap_or(0),
        Err(_) => 0,
    }
}

/// Bytes of live allocations the allocator has made in `heap` (whatever
/// their owner inside this process: tensors, spans, scratch buffers).
pub(crate) fn allocator_bytes_in_use(allocator: &Allocator, heap: u32) -> u64 {
    match allocator.get_heap_budgets() {
        Ok(budgets) => budgets
            .get(heap as usize)
            .map_or(0, |b| b.statistics.allocationBytes),
        Err(_) => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceiling_is_85_percent_of_free_or_the_explicit_budget() {
        assert_eq!(Budget::new(8000 * MB, 1000 * MB, None).ceiling, 850 * MB);
        assert_eq!(Budget::new(8000 * MB, 1000 * MB, Some(3)).ceiling, 3 * MB);
    }

    #[test]
    fn headroom_is_the_larger_of_256_mb_and_a_tenth_of_the_heap() {
        assert_eq!(Budget::new(2048 * MB, 0, None).headroom(), 256 * MB);
        assert_eq!(Budget::new(10_000 * MB, 0, None).headroom(), 1000 * MB);
    }

    #[test]
    fn refuses_over_the_ceiling_and_under_the_headroom() {
        let b = Budget::new(2048 * MB, 1600 * MB, None);
        assert!(b.check(100 * MB, 0, 1600 * MB).is_ok());
        assert!(b
            .check(100 * MB, 1300 * MB, 1600 * MB)
            .unwrap_err()
            .contains("ceiling"));
        assert!(b
            .check(100 * MB, 0, 300 * MB)
            .unwrap_err()
            .contains("headroom"));
    }
}
