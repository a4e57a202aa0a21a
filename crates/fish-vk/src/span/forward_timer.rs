//! FISH_GPU_PROFILE=1: where a span forward's wall time goes, on the
//! command buffers decode really submits. The stage profile (level 2 and
//! up) records every forward afresh with a timestamp per stage, which
//! inflates the host's share; this timer adds only two timestamps to the
//! recording that is reused (one before the forward's first command, one
//! after its last) and sums, over the span's forwards, the GPU's time
//! between them and the host's phases around the submit: preparing
//! (uploads, bindings, plans), submit + fence wait, reading the result
//! back, and the time from one forward's return to the next one's call
//! (the engine's work between forwards: embedding, logits, sampling).
//! What the submit + wait phase holds beyond the GPU's time is the launch
//! and wake-up latency of one submit. Forwards that recorded their command
//! buffer (the first of each shape, and every one after bindings were
//! rebuilt) are counted apart: one such forward's recording (and a first
//! use's pipeline work in the driver) would otherwise swamp the means of
//! hundreds of reused ones.

use std::time::Instant;

use super::profile::read_timestamps;
use crate::error::{Result, VkCall};
use ash::vk;

/// Two timestamps per forward, and the sums over the forwards timed.
pub(crate) struct ForwardTimer {
    pool: vk::QueryPool,
    period_ns: f64,
    sums: ForwardSums,
    /// When the last timed forward returned.
    last_end: Option<Instant>,
}

/// Nanoseconds summed over the forwards timed.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct ForwardSums {
    forwards: u64,
    gpu: f64,
    prepare: f64,
    execute: f64,
    read: f64,
    /// From a forward's return to the next one's call, over `gaps` gaps.
    between: f64,
    gaps: u64,
    /// Forwards that recorded their command buffer, left out of the sums
    /// above, and their wall time (call to return).
    recorded: u64,
    recorded_wall: f64,
}

/// The host's marks of one forward: called, submitted, fence signalled
/// (and waited for), returned; and whether it recorded its command buffer.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ForwardMarks {
    pub start: Instant,
    pub submit: Instant,
    pub read: Instant,
    pub end: Instant,
    pub recorded: bool,
}

impl ForwardTimer {
    pub fn new(device: &ash::Device, period_ns: f64) -> Result<ForwardTimer> {
        let info = vk::QueryPoolCreateInfo::default()
            .query_type(vk::QueryType::TIMESTAMP)
            .query_count(2);
        // SAFETY: valid create info.
        let pool = unsafe { device.create_query_pool(&info, None) }.call("vkCreateQueryPool")?;
        Ok(ForwardTimer {
            pool,
            period_ns,
            sums: ForwardSums::default(),
            last_end: None,
        })
    }

    /// Records the forward's first timestamp (after resetting both).
    ///
    /// # Safety
    /// `cmd` is recording, outside a render pass.
    pub unsafe fn record_start(&self, d: &ash::Device, cmd: vk::CommandBuffer) {
        d.cmd_reset_query_pool(cmd, self.pool, 0, 2);
        d.cmd_write_timestamp(cmd, vk::PipelineStageFlags::TOP_OF_PIPE, self.pool, 0);
    }

    /// Records the forward's last timestamp, once all of its work is done.
    ///
    /// # Safety
    /// `cmd` is recording, after `record_start`.
    pub unsafe fn record_end(&self, d: &ash::Device, cmd: vk::CommandBuffer) {
        d.cmd_write_timestamp(cmd, vk::PipelineStageFlags::BOTTOM_OF_PIPE, self.pool, 1);
    }

    /// Adds a finished forward (its fence waited for) to the sums.
    pub fn collect(&mut self, device: &ash::Device, marks: ForwardMarks) -> Result<()> {
        let mut ticks = [0u64; 2];
        read_timestamps(device, self.pool, &mut ticks)?;
        let gpu = ticks[1].wrapping_sub(ticks[0]) as f64 * self.period_ns;
        let between = self
            .last_end
            .map(|end| marks.start.saturating_duration_since(end).as_nanos() as f64);
        self.sums.add(gpu, marks, between);
        self.last_end = Some(marks.end);
        Ok(())
    }

    /// e.g. `forwards 128, per forward: GPU 0.712 ms; host: prepare
    /// 0.010, submit+wait 0.741 (0.029 beyond the GPU), read back 0.021,
    /// between forwards 0.015 ms; recording forwards left out: 1 (950.3
    /// ms in all)`; None before the first forward.
    pub fn summary(&self) -> Option<String> {
        self.sums.summary()
    }

    pub fn destroy(&self, device: &ash::Device) {
        // SAFETY: no pending submission uses the pool (forwards wait).
        unsafe { device.destroy_query_pool(self.pool, None) };
    }
}

impl ForwardSums {
    fn add(&mut self, gpu_ns: f64, m: ForwardMarks, between_ns: Option<f64>) {
        let ns = |a: Instant, b: Instant| b.saturating_duration_since(a).as_nanos() as f64;
        if let Some(b) = between_ns {
            self.between += b;
            self.gaps += 1;
        }
        if m.recorded {
            self.recorded += 1;
            self.recorded_wall += ns(m.start, m.end);
            return;
        }
        self.forwards += 1;
        self.gpu += gpu_ns;
        self.prepare += ns(m.start, m.submit);
        self.execute += ns(m.submit, m.read);
        self.read += ns(m.read, m.end);
    }

    fn summary(&self) -> Option<String> {
        let recorded = match self.recorded {
            0 => String::new(),
            r => format!(
                "; recording forwards left out: {r} ({:.1} ms in all)",
                self.recorded_wall / 1e6
            ),
        };
        if self.forwards == 0 {
            return (self.recorded > 0).then(|| format!("forwards 0{recorded}"));
        }
        let n = self.forwards as f64;
        let ms = |ns: f64| ns / n / 1e6;
        let between = match self.gaps {
            0 => String::new(),
            g => format!(", between forwards {:.3}", self.between / g as f64 / 1e6),
        };
        Some(format!(
            "forwards {}, per forward: GPU {:.3} ms; host: prepare {:.3}, submit+wait {:.3} ({:.3} beyond the GPU), read back {:.3}{between} ms{recorded}",
            self.forwards,
            ms(self.gpu),
            ms(self.prepare),
            ms(self.execute),
            ms(self.execute - self.gpu),
            ms(self.read),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn marks(at: Instant, us: [u64; 3]) -> ForwardMarks {
        let after = |u: u64| at + Duration::from_micros(u);
        ForwardMarks {
            start: at,
            submit: after(us[0]),
            read: after(us[1]),
            end: after(us[2]),
            recorded: false,
        }
    }

    #[test]
    fn the_summary_gives_means_per_forward_and_per_gap() {
        let mut sums = ForwardSums::default();
        assert_eq!(sums.summary(), None);
        let t0 = Instant::now();
        // Two forwards: 10 us to submit, 800 us to the fence (700 on the
        // GPU), 20 us to read back; 30 us between them.
        sums.add(700_000.0, marks(t0, [10, 810, 830]), None);
        let t1 = t0 + Duration::from_micros(860);
        sums.add(700_000.0, marks(t1, [10, 810, 830]), Some(30_000.0));
        assert_eq!(
            sums.summary().as_deref(),
            Some(
                "forwards 2, per forward: GPU 0.700 ms; host: prepare 0.010, submit+wait 0.800 \
                 (0.100 beyond the GPU), read back 0.020, between forwards 0.030 ms"
            )
        );
    }

    #[test]
    fn forwards_that_record_are_left_out_of_the_means() {
        let mut sums = ForwardSums::default();
        let t0 = Instant::now();
        // The first forward records: 900 us to submit, 1.5 ms in all.
        let first = ForwardMarks {
            recorded: true,
            ..marks(t0, [900, 1400, 1500])
        };
        sums.add(500_000.0, first, None);
        assert_eq!(
            sums.summary().as_deref(),
            Some("forwards 0; recording forwards left out: 1 (1.5 ms in all)")
        );
        let t1 = t0 + Duration::from_micros(1520);
        sums.add(700_000.0, marks(t1, [10, 810, 830]), Some(20_000.0));
        assert_eq!(
            sums.summary().as_deref(),
            Some(
                "forwards 1, per forward: GPU 0.700 ms; host: prepare 0.010, submit+wait 0.800 \
                 (0.100 beyond the GPU), read back 0.020, between forwards 0.020 ms; recording \
                 forwards left out: 1 (1.5 ms in all)"
            )
        );
    }
}
