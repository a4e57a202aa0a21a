//! The device object: instance, logical device, queue, allocator, budget,
//! pipelines and the resident tensors. Dropping it releases everything.

use crate::budget::{self, Budget};
use crate::buffer::{Buffer, MemoryKind};
use crate::config::Config;
use crate::coopmat;
use crate::device::{self, DeviceInfo};
use crate::error::{Result, VkCall, VkError};
use crate::instance::Instance;
use crate::loader;
use crate::pipeline::Pipelines;
use crate::pipeline_stats::PipelineStats;
use crate::upload::ResidentTensor;
use ash::vk;
use std::collections::HashMap;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

/// Command recording state; one submission at a time.
pub(crate) struct Exec {
    pub pool: vk::CommandPool,
    pub cmd: vk::CommandBuffer,
    pub fence: vk::Fence,
    pub timestamps: Option<vk::QueryPool>,
    /// Host-visible staging towards the device (x and weight uploads).
    pub staging: Option<Buffer>,
    /// Device copies of the kernel input and output.
    pub x_dev: Option<Buffer>,
    pub y_dev: Option<Buffer>,
    /// Host-visible copy of the output.
    pub readback: Option<Buffer>,
    /// The split scratch of the batch tile (split_k.rs), binding 3.
    pub split: Option<Buffer>,
}

impl Exec {
    /// Takes the scratch buffers (staging, x/y, readback, split) for release.
    fn take_scratch(&mut self) -> [Option<Buffer>; 5] {
        [
            self.staging.take(),
            self.x_dev.take(),
            self.y_dev.take(),
            self.readback.take(),
            self.split.take(),
        ]
    }
}

pub struct Gpu {
    pub(crate) config: Config,
    pub(crate) info: DeviceInfo,
    pub(crate) device: ash::Device,
    pub(crate) queue: vk::Queue,
    pub(crate) allocator: ManuallyDrop<vk_mem::Allocator>,
    heap_index: u32,
    pub(crate) budget: Budget,
    /// Bytes of device-local buffers this object holds (weights and scratch).
    own_bytes: AtomicU64,
    pub(crate) pipelines: Pipelines,
    pub(crate) tensors: Mutex<HashMap<u64, ResidentTensor>>,
    pub(crate) exec: Mutex<Exec>,
    // Destroyed last, by its own Drop after ours.
    instance: Instance,
}

impl Gpu {
    /// Opens the loader, the instance and the device chosen by `config`.
    pub fn open(config: &Config) -> Result<Gpu> {
        if let Some(v) = &config.disabled_by {
            return Err(VkError::Disabled(v.clone()));
        }
        let entry = loader::load_entry(config.loader.as_deref())?;
        let instance = Instance::create(entry, config)?;
        let (physical, mut info) = device::select(&instance.raw, config)?;
        // SAFETY: `physical` was enumerated from this instance.
        let prefill = unsafe { coopmat::probe(&instance.entry, &instance.raw, physical, &info) };
        if config.verbose {
            coopmat::log_choice(&prefill);
            if prefill.is_ok() {
                // SAFETY: as above; the probe found the extension, without
                // which the query's function is not loaded.
                coopmat::log_shapes(unsafe {
                    coopmat::matrix_properties(&instance.entry, &instance.raw, physical)
                });
            }
        }
        info.cooperative_matrix = prefill.ok();
        info.cooperative_batch = info
            .cooperative_matrix
            .and_then(|t| coopmat::batch_tile(&t, &info));
        info.cooperative_wide = info
            .cooperative_matrix
            .and_then(|t| coopmat::wide_tile(&t, &info));
        if info.cooperative_matrix.is_some() {
            // SAFETY: as above; the prefill tile's probe found the extension.
            let int8 = unsafe {
                crate::int8_matrix::probe(
                    &instance.entry,
                    &instance.raw,
                    physical,
                    info.subgroup_size,
                )
            };
            if config.verbose {
                match &int8 {
                    Ok(n) => {
                        eprintln!("fish-vk: int8 matvec on the matrix units, 16x{n}x32 fragments")
                    }
                    Err(why) => eprintln!("fish-vk: no int8 matvec on the matrix units: {why}"),
                }
            }
            info.int8_matrix = int8.ok();
            // SAFETY: as above.
            let props =
                unsafe { coopmat::matrix_properties(&instance.entry, &instance.raw, physical) };
            let f16_fragments = props
                .map(|p| crate::int8_matrix::has_f16_fragments(&p))
                .unwrap_or(false);
            match crate::frags::offered(f16_fragments, info.subgroup_size) {
                Ok(()) => {
                    info.prefill_frags = true;
                    info.prefill_frags_offered = true;
                }
                Err(why) if config.verbose => {
                    eprintln!("fish-vk: no prefill on fragments built in registers: {why}")
                }
                Err(_) => {}
            }
        }
        // SAFETY: as above; the instance was created at instance.api_version.
        let tensor = unsafe {
            crate::coopmat2::probe(
                &instance.entry,
                &instance.raw,
                instance.api_version,
                physical,
                &info,
            )
        };
        if config.verbose {
            match &tensor {
                Ok(c) => eprintln!(
                    "fish-vk: workgroup-scope cooperative matrices, granularity {:?}",
                    c.granularity
                ),
                Err(why) => eprintln!("fish-vk: no workgroup-scope cooperative matrices: {why}"),
            }
        }
        info.cooperative_tensor = tensor.ok();
        if config.verbose {
            if let Some(wide) = info.cooperative_wide {
                eprintln!("fish-vk: wide prefill tile: {}", wide.describe());
            }
        }
        let (device, queue) = device::create_logical(&instance.raw, physical, &info)?;
        // From here on, failures must destroy what was created.
        let mut alloc_info = vk_mem::AllocatorCreateInfo::new(&instance.raw, &device, physical);
        alloc_info.vulkan_api_version = vk::API_VERSION_1_1;
        if info.memory_budget_ext {
            alloc_info.flags |= vk_mem::AllocatorCreateFlags::EXT_MEMORY_BUDGET;
        }
        // SAFETY: instance, device and physical device outlive the allocator (dropped first in Drop).
        let allocator = match unsafe { vk_mem::Allocator::new(alloc_info) } {
            Ok(a) => a,
            Err(result) => {
                unsafe { device.destroy_device(None) };
                return Err(VkError::Vulkan {
                    call: "vmaCreateAllocator",
                    result,
                });
            }
        };
        let heap_index = largest_device_heap(&allocator);
        let free = budget::memory_free(&allocator, heap_index);
        let budget = Budget::new(info.heap_size, free, config.budget_mb);
        let stats = info
            .pipeline_stats
            .then(|| PipelineStats::new(&instance.raw, &device));
        let pipelines = match Pipelines::new(&device, stats, info.full_subgroups) {
            Ok(p) => p,
            Err(e) => {
                drop(allocator);
                unsafe { device.destroy_device(None) };
                return Err(e);
            }
        };
        let exec = match create_exec(&device, &info) {
            Ok(x) => x,
            Err(e) => {
                pipelines.destroy(&device);
                drop(allocator);
                unsafe { device.destroy_device(None) };
                return Err(e);
            }
        };
        let mut gpu = Gpu {
            config: config.clone(),
            info,
            device,
            queue,
            allocator: ManuallyDrop::new(allocator),
            heap_index,
            budget,
            own_bytes: AtomicU64::new(0),
            pipelines,
            tensors: Mutex::new(HashMap::new()),
            exec: Mutex::new(exec),
            instance,
        };
        if gpu.info.int8_matrix.is_some() {
            if let Err(why) =
                crate::int8_matrix::layout_holds(&gpu, crate::Kernel::MatvecInt8Matrix)
            {
                if config.verbose {
                    eprintln!("fish-vk: no int8 matvec on the matrix units: {why}");
                }
                gpu.info.int8_matrix = None;
            }
            // The check's matmul left its scratch (staging, x/y, readback)
            // for reuse; a device just opened holds nothing of ours, so
            // unloading a model returns it to exactly this state.
            gpu.release_scratch();
        }
        if gpu.info.prefill_frags && crate::frags::unchecked() {
            gpu.info.prefill_frags_gate_up = crate::frags::gate_up_offered();
            if config.verbose {
                eprintln!(
                    "fish-vk: prefill on fragments built in registers without the open-time \
                     check (FISH_VK_FRAGS_UNCHECKED=1)"
                );
            }
        } else if gpu.info.prefill_frags {
            let checked =
                gpu.check_prefill_frags_of(crate::Kernel::CoopMat, &crate::frags::default_types());
            if config.verbose {
                // How their plans take the wide tile (coopmat.rs plan_tile).
                let wide_rule = match gpu.frags_wide_by_waves() {
                    Some(m) => {
                        format!("the wide tile where it keeps 3/4 of {m} multiprocessors busy")
                    }
                    None => "the wide tile by workgroup counts".to_string(),
                };
                match &checked {
                    Ok(()) => eprintln!(
                        "fish-vk: prefill matmuls of {:?} on fragments built in registers, {wide_rule}",
                        crate::frags::default_types()
                    ),
                    Err(why) => eprintln!(
                        "fish-vk: no prefill on fragments built in registers (check: {why})"
                    ),
                }
            }
            gpu.info.prefill_frags = checked.is_ok();
            // The gate/up form where plans give the kernel Q4_K gate/up.
            if gpu.info.prefill_frags && crate::frags::gate_up_offered() {
                let checked = gpu.check_prefill_gate_up(crate::Kernel::CoopMat);
                if config.verbose {
                    match &checked {
                        Ok(()) => eprintln!(
                            "fish-vk: prefill gate/up of Q4_K with the activation in the \
                             fragments kernel's epilogue"
                        ),
                        Err(why) => eprintln!(
                            "fish-vk: no activation in the prefill gate/up epilogue (check: {why})"
                        ),
                    }
                }
                gpu.info.prefill_frags_gate_up = checked.is_ok();
            }
            gpu.release_scratch();
        }
        Ok(gpu)
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// The driver's statistics of every matmul pipeline built so far, one
    /// line per pipeline executable (pipeline_stats.rs); empty unless
    /// FISH_VK_PIPELINE_STATS=1 and the device offers them
    /// (`info().pipeline_stats`).
    pub fn pipeline_statistics(&self) -> Vec<String> {
        self.pipelines
            .stats
            .as_ref()
            .map_or_else(Vec::new, PipelineStats::lines)
    }

    /// Free device memory right now (see budget::memory_free).
    pub fn memory_free(&self) -> u64 {
        budget::memory_free(&self.allocator, self.heap_index)
    }

    /// Bytes of live allocations in the device heap, as the allocator
    /// counts them: what `memory_free` would return to if every buffer of
    /// this process were freed, less the driver's own memory.
    pub fn allocator_bytes_in_use(&self) -> u64 {
        budget::allocator_bytes_in_use(&self.allocator, self.heap_index)
    }

    /// The backend's own ceiling in bytes.
    pub fn ceiling(&self) -> u64 {
        self.budget.ceiling
    }

    /// Validation-layer messages seen so far (0 unless FISH_VK_VALIDATE=1 found the layer).
    pub fn validation_messages(&self) -> u64 {
        self.instance.validation_messages()
    }

    /// The matmul pipelines built so far, each as its module and
    /// specialisation constants (`matvec_i8x_q4_1[64, 4, 1, 1, 96]`), sorted:
    /// which kernels the forwards so far have run.
    pub fn built_matmul_pipelines(&self) -> Vec<String> {
        self.pipelines.built_names()
    }

    /// The keys of the pipelines asked for (built or taken from the cache)
    /// since the last call, sorted: what a piece of work between two calls
    /// planned, open-time checks excluded once a first call follows them.
    pub fn take_requested_pipelines(&self) -> Vec<String> {
        self.pipelines.take_requested()
    }

    /// True when FISH_VK_VALIDATE=1 and the validation layer is active.
    pub fn validation_enabled(&self) -> bool {
        self.instance.validation_enabled
    }

    /// Bytes of device memory held (weights and scratch).
    pub fn bytes_allocated(&self) -> u64 {
        self.own_bytes.load(Ordering::Relaxed)
    }

    /// Live allocations in the allocator (for leak checks).
    pub fn allocation_count(&self) -> u64 {
        self.allocator
            .calculate_statistics()
            .map(|s| u64::from(s.total.statistics.allocationCount))
            .unwrap_or(0)
    }

    /// Frees the scratch buffers (staging, x/y, readback) that matmuls and
    /// uploads keep for reuse; the next call recreates them. Used when the
    /// last model is unloaded, so the device holds nothing of ours.
    pub fn release_scratch(&self) {
        let mut exec = self.lock_exec();
        let scratch = exec.take_scratch();
        drop(exec);
        for buf in scratch.into_iter().flatten() {
            self.release(buf);
        }
    }

    /// One line for stats, e.g. `vulkan NVIDIA H200: 2359 MB weights (196 tensors), ...`.
    pub fn describe(&self) -> String {
        let (n, bytes) = {
            let t = self.lock_tensors();
            (t.len(), t.values().map(|r| r.bytes).sum::<u64>())
        };
        format!(
            "vulkan {}: {} MB weights ({} tensors), {} MB free, ceiling {} MB, subgroup {}{}",
            self.info.name,
            bytes >> 20,
            n,
            self.memory_free() >> 20,
            self.budget.ceiling >> 20,
            self.info.subgroup_size,
            if self.validation_enabled() {
                ", validation on"
            } else {
                ""
            }
        )
    }

    pub(crate) fn lock_tensors(&self) -> MutexGuard<'_, HashMap<u64, ResidentTensor>> {
        self.tensors.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn lock_exec(&self) -> MutexGuard<'_, Exec> {
        self.exec.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Allocates a buffer; device-local ones pass the budget check first.
    pub(crate) fn alloc(&self, size: u64, kind: MemoryKind) -> Result<Buffer> {
        if kind == MemoryKind::Device {
            self.budget
                .check(size, self.bytes_allocated(), self.memory_free())
                .map_err(|reason| VkError::Budget {
                    requested: size,
                    reason,
                })?;
        }
        let buf = Buffer::create(&self.allocator, size, kind)?;
        if kind == MemoryKind::Device {
            self.own_bytes.fetch_add(buf.size, Ordering::Relaxed);
        }
        Ok(buf)
    }

    pub(crate) fn release(&self, buf: Buffer) {
        if buf.kind == MemoryKind::Device {
            self.own_bytes.fetch_sub(buf.size, Ordering::Relaxed);
        }
        buf.destroy(&self.allocator);
    }

    /// Makes `slot` hold a buffer of at least `size` bytes (grow only).
    pub(crate) fn ensure(
        &self,
        slot: &mut Option<Buffer>,
        size: u64,
        kind: MemoryKind,
    ) -> Result<()> {
        if slot.as_ref().is_some_and(|b| b.size >= size) {
            return Ok(());
        }
        if let Some(old) = slot.take() {
            self.release(old);
        }
        *slot = Some(self.alloc(size, kind)?);
        Ok(())
    }

    /// Records with `record`, submits, and waits for completion.
    pub(crate) fn submit_and_wait(
        &self,
        exec: &Exec,
        record: impl FnOnce(vk::CommandBuffer),
    ) -> Result<()> {
        let d = &self.device;
        let cmd = exec.cmd;
        // SAFETY: the command buffer is not in flight (every submit waits), and
        // the exec lock held by the caller serialises the queue.
        unsafe {
            d.reset_command_buffer(cmd, vk::CommandBufferResetFlags::empty())
                .call("vkResetCommandBuffer")?;
            let begin = vk::CommandBufferBeginInfo::default()
                .flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT);
            d.begin_command_buffer(cmd, &begin)
                .call("vkBeginCommandBuffer")?;
            record(cmd);
            d.end_command_buffer(cmd).call("vkEndCommandBuffer")?;
        }
        self.submit_recorded(exec, cmd)
    }

    /// Records a command buffer meant to be submitted many times, allocated
    /// from the exec pool (the caller frees it there, holding the lock).
    pub(crate) fn record_once(
        &self,
        exec: &Exec,
        record: impl FnOnce(vk::CommandBuffer),
    ) -> Result<vk::CommandBuffer> {
        let d = &self.device;
        let info = vk::CommandBufferAllocateInfo::default()
            .command_pool(exec.pool)
            .level(vk::CommandBufferLevel::PRIMARY)
            .command_buffer_count(1);
        // SAFETY: the exec lock held by the caller serialises the pool.
        let cmd = unsafe { d.allocate_command_buffers(&info) }.call("vkAllocateCommandBuffers")?[0];
        let begin = vk::CommandBufferBeginInfo::default();
        // SAFETY: a new command buffer, recorded once and ended here.
        let recorded = unsafe {
            d.begin_command_buffer(cmd, &begin)
                .call("vkBeginCommandBuffer")
                .and_then(|()| {
                    record(cmd);
                    d.end_command_buffer(cmd).call("vkEndCommandBuffer")
                })
        };
        match recorded {
            Ok(()) => Ok(cmd),
            Err(e) => {
                // SAFETY: never submitted.
                unsafe { d.free_command_buffers(exec.pool, &[cmd]) };
                Err(e)
            }
        }
    }

    /// Submits a recorded command buffer and waits for it.
    pub(crate) fn submit_recorded(&self, exec: &Exec, cmd: vk::CommandBuffer) -> Result<()> {
        let d = &self.device;
        let cmds = [cmd];
        let submit = [vk::SubmitInfo::default().command_buffers(&cmds)];
        // SAFETY: the exec lock held by the caller serialises the queue, and
        // the fence is unsignalled (every submit resets it after its wait).
        unsafe {
            d.queue_submit(self.queue, &submit, exec.fence)
                .call("vkQueueSubmit")?;
            let waited = wait_fence(d, exec.fence, spin_wait(self.info.kind));
            d.reset_fences(&[exec.fence]).call("vkResetFences")?;
            waited
        }
    }
}

/// How long a submit polls its fence before it blocks in vkWaitForFences:
/// `FISH_VK_SPIN_WAIT_US` microseconds where set, else 20 ms on a GPU and
/// none on a CPU device (lavapipe runs the work on this machine's cores,
/// which a polling thread would take from it). The blocking wait returns
/// tens of microseconds after the fence signals, a large share of a
/// decode step: H200 tg128 llama-8b +4%, llama-1b +8-20% with polling
/// (docs/BENCHMARKS.md). 20 ms covers every decode step; a longer forward
/// then blocks, where the late return costs little.
fn spin_wait(kind: vk::PhysicalDeviceType) -> std::time::Duration {
    static SPIN_US: OnceLock<Option<u64>> = OnceLock::new();
    let set = *SPIN_US.get_or_init(|| {
        std::env::var("FISH_VK_SPIN_WAIT_US")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
    });
    spin_budget(kind, set)
}

/// `spin_wait` for a device of `kind` and the variable's value `set`.
fn spin_budget(kind: vk::PhysicalDeviceType, set: Option<u64>) -> std::time::Duration {
    let us = set.unwrap_or(match kind {
        vk::PhysicalDeviceType::CPU => 0,
        _ => 20_000,
    });
    std::time::Duration::from_micros(us)
}

/// Waits for `fence`: polls it for up to `spin`, then blocks.
///
/// # Safety
/// `fence` is a live fence of `d` with a submit pending or signalled.
unsafe fn wait_fence(d: &ash::Device, fence: vk::Fence, spin: std::time::Duration) -> Result<()> {
    if !spin.is_zero() {
        let start = std::time::Instant::now();
        while start.elapsed() < spin {
            if d.get_fence_status(fence).call("vkGetFenceStatus")? {
                return Ok(());
            }
            std::hint::spin_loop();
        }
    }
    d.wait_for_fences(&[fence], true, u64::MAX)
        .call("vkWaitForFences")
}

fn largest_device_heap(allocator: &vk_mem::Allocator) -> u32 {
    // SAFETY: a plain read of the allocator's cached properties.
    let props = unsafe { allocator.get_memory_properties() };
    props
        .memory_heaps_as_slice()
        .iter()
        .enumerate()
        .filter(|(_, h)| h.flags.contains(vk::MemoryHeapFlags::DEVICE_LOCAL))
        .max_by_key(|(_, h)| h.size)
        .map(|(i, _)| i as u32)
        .unwrap_or(0)
}

fn create_exec(device: &ash::Device, info: &DeviceInfo) -> Result<Exec> {
    // SAFETY: plain object creation on a live device; on failure the device
    // (destroyed by the caller) takes the partial objects with it only if we
    // destroy them here, which we do.
    unsafe {
        let pool_info = vk::CommandPoolCreateInfo::default()
            .queue_family_index(info.queue_family)
            .flags(vk::CommandPoolCreateFlags::RESET_COMMAND_BUFFER);
        let pool = device
            .create_command_pool(&pool_info, None)
            .call("vkCreateCommandPool")?;
        let alloc = vk::CommandBufferAllocateInfo::default()
            .command_pool(pool)
            .level(vk::CommandBufferLevel::PRIMARY)
            .command_buffer_count(1);
        let cmd = match device.allocate_command_buffers(&alloc) {
            Ok(c) => c[0],
            Err(result) => {
                device.destroy_command_pool(pool, None);
                return Err(VkError::Vulkan {
                    call: "vkAllocateCommandBuffers",
                    result,
                });
            }
        };
        let fence = match device.create_fence(&vk::FenceCreateInfo::default(), None) {
            Ok(f) => f,
            Err(result) => {
                device.destroy_command_pool(pool, None);
                return Err(VkError::Vulkan {
                    call: "vkCreateFence",
                    result,
                });
            }
        };
        let timestamps = if info.timestamp_period_ns.is_some() {
            let q = vk::QueryPoolCreateInfo::default()
                .query_type(vk::QueryType::TIMESTAMP)
                .query_count(2);
            device.create_query_pool(&q, None).ok()
        } else {
            None
        };
        Ok(Exec {
            pool,
            cmd,
            fence,
            timestamps,
            staging: None,
            x_dev: None,
            y_dev: None,
            readback: None,
            split: None,
        })
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        // SAFETY: we own every object; waiting for idle makes destruction legal.
        unsafe {
            let _ = self.device.device_wait_idle();
        }
        let tensors: Vec<_> = self.lock_tensors().drain().map(|(_, t)| t).collect();
        for t in tensors {
            for chunk in t.chunks {
                self.release(chunk.buffer);
            }
        }
        let mut exec = self.lock_exec();
        let scratch = exec.take_scratch();
        let (pool, fence, timestamps) = (exec.pool, exec.fence, exec.timestamps);
        drop(exec);
        for buf in scratch.into_iter().flatten() {
            self.release(buf);
        }
        self.pipelines.destroy(&self.device);
        unsafe {
            if let Some(q) = timestamps {
                self.device.destroy_query_pool(q, None);
            }
            self.device.destroy_fence(fence, None);
            self.device.destroy_command_pool(pool, None);
            ManuallyDrop::drop(&mut self.allocator);
            self.device.destroy_device(None);
        }
        // `instance` is dropped next (its own Drop destroys messenger and instance).
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn gpus_poll_their_fences_and_cpu_devices_block_unless_told() {
        use vk::PhysicalDeviceType as T;
        for kind in [T::DISCRETE_GPU, T::INTEGRATED_GPU, T::VIRTUAL_GPU, T::OTHER] {
            assert_eq!(spin_budget(kind, None), Duration::from_millis(20));
        }
        assert_eq!(spin_budget(T::CPU, None), Duration::ZERO);
        assert_eq!(spin_budget(T::CPU, Some(500)), Duration::from_micros(500));
        assert_eq!(spin_budget(T::DISCRETE_GPU, Some(0)), Duration::ZERO);
    }
}
