//! The rate of cooperative-matrix products alone (shaders/coopmat_peak.comp),
//! for the `coopmat_peak` bench: it separates what the device and driver
//! give for bare products from what the prefill kernel achieves around them.

use crate::error::{Result, VkError};
use crate::gpu::Gpu;
use std::time::Duration;

/// Accumulators per subgroup (ACCS in shaders/coopmat_peak.comp).
const PEAK_ACCUMULATORS: u64 = 8;

/// How the probe's fragment shape reaches the driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeakShape {
    /// Specialisation constants, as the prefill kernel has it.
    Specialised,
    /// 16 x 16 x 16 written in the source (only where the tile is 16x16x16).
    Fixed16,
    /// As `Specialised`, with both fragments loaded from shared memory in
    /// every round (the products' operand traffic of the prefill kernel).
    SharedLoads,
}

/// One timed run of the probe.
#[derive(Clone, Copy, Debug)]
pub struct PeakRun {
    pub time: Duration,
    /// Floating-point operations of the products (2 per multiply-add).
    pub flops: u64,
}

impl PeakRun {
    pub fn tflops(&self) -> f64 {
        self.flops as f64 / self.time.as_secs_f64().max(1e-12) / 1e12
    }
}

/// Floating-point operations of `groups` workgroups of `subgroups`
/// subgroups each running `rounds` rounds of the probe with fragments of
/// `tm x tn x tk`, `repeats` times.
pub fn peak_flops(
    tm: u32,
    tn: u32,
    tk: u32,
    subgroups: u32,
    groups: u32,
    rounds: u32,
    repeats: u32,
) -> u64 {
    2 * u64::from(tm * tn * tk)
        * PEAK_ACCUMULATORS
        * u64::from(rounds)
        * u64::from(subgroups)
        * u64::from(groups)
        * u64::from(repeats)
}

impl Gpu {
    /// GPU time of `groups` workgroups of the prefill tile's shape running
    /// `rounds` rounds of products each, dispatched `repeats` times in one
    /// submit. An error where the device has no cooperative matrices (or no
    /// 16x16x16 shape for `PeakShape::Fixed16`).
    pub fn time_coopmat_peak(
        &self,
        shape: PeakShape,
        rounds: u32,
        groups: u32,
        repeats: u32,
    ) -> Result<PeakRun> {
        let tile = self.info.cooperative_matrix.ok_or_else(|| {
            VkError::KernelUnavailable("cooperative matrices (coopmat_peak)".into())
        })?;
        let module = match shape {
            PeakShape::Specialised => "coopmat_peak",
            PeakShape::SharedLoads => "coopmat_peak_shared",
            PeakShape::Fixed16 if (tile.tm, tile.tn, tile.tk) == (16, 16, 16) => {
                "coopmat_peak_fixed"
            }
            PeakShape::Fixed16 => {
                return Err(VkError::KernelUnavailable(format!(
                    "16x16x16 fragments (the device's are {}x{}x{})",
                    tile.tm, tile.tn, tile.tk
                )))
            }
        };
        let pipeline =
            self.pipelines
                .get_cooperative(&self.device, module, &tile.spec(), tile.threads())?;
        let subgroups = tile.warps_m * tile.warps_n;
        let y_bytes = u64::from(groups * subgroups * tile.tm * tile.tn) * 4;
        let time = self.time_weightless_probe(pipeline, rounds, groups, (16, y_bytes), repeats)?;
        Ok(PeakRun {
            time,
            flops: peak_flops(
                tile.tm, tile.tn, tile.tk, subgroups, groups, rounds, repeats,
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flops_count_every_product_of_every_subgroup() {
        // One 16x16x16 product is 4096 multiply-adds.
        assert_eq!(
            peak_flops(16, 16, 16, 1, 1, 1, 1),
            2 * 4096 * PEAK_ACCUMULATORS
        );
        assert_eq!(
            peak_flops(16, 16, 16, 4, 10, 100, 3),
            2 * 4096 * PEAK_ACCUMULATORS * 4 * 10 * 100 * 3
        );
        let run = PeakRun {
            time: Duration::from_millis(1),
            flops: 2_000_000_000_000,
        };
        assert!((run.tflops() - 2000.0).abs() < 1e-6);
    }
}
