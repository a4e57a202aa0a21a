//! What the driver reports about each compiled pipeline
//! (VK_KHR_pipeline_executable_properties), with `FISH_VK_PIPELINE_STATS=1`:
//! register counts, shared memory, spills and whatever else the driver
//! lists, one line per pipeline executable on stderr and kept for
//! `Gpu::pipeline_statistics()`. Kernel tuning needs these facts (a kernel
//! near a register limit loses occupancy and runs several times slower
//! after a small change); they cost a capture flag at pipeline creation, so
//! they are off unless asked for.

use ash::khr::pipeline_executable_properties as exec_props;
use ash::vk;

/// Whether the environment asks for pipeline statistics.
pub(crate) fn wanted() -> bool {
    std::env::var("FISH_VK_PIPELINE_STATS").as_deref() == Ok("1")
}

/// The extension's name, when the device has it.
pub(crate) fn extension_name() -> &'static std::ffi::CStr {
    exec_props::NAME
}

/// The feature struct that turns the queries on at device creation.
pub(crate) fn features() -> vk::PhysicalDevicePipelineExecutablePropertiesFeaturesKHR<'static> {
    vk::PhysicalDevicePipelineExecutablePropertiesFeaturesKHR::default()
        .pipeline_executable_info(true)
}

/// The queries of one device, and the lines reported so far.
pub(crate) struct PipelineStats {
    loader: exec_props::Device,
    lines: std::sync::Mutex<Vec<String>>,
}

impl PipelineStats {
    pub fn new(instance: &ash::Instance, device: &ash::Device) -> PipelineStats {
        PipelineStats {
            loader: exec_props::Device::new(instance, device),
            lines: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// Records and prints the statistics of `pipeline` (built from module
    /// `name` with specialisation constants `spec`, with the capture flag).
    /// A driver that answers nothing leaves no line; errors are reported as
    /// a line, never returned: statistics must not fail a pipeline.
    pub fn capture(&self, pipeline: vk::Pipeline, name: &str, spec: &[u32]) {
        let info = vk::PipelineInfoKHR::default().pipeline(pipeline);
        // SAFETY: `pipeline` is live and was created with CAPTURE_STATISTICS.
        let executables = unsafe { self.loader.get_pipeline_executable_properties(&info) };
        let mut new_lines = Vec::new();
        match executables {
            Ok(executables) => {
                for (index, e) in executables.iter().enumerate() {
                    let exec_info = vk::PipelineExecutableInfoKHR::default()
                        .pipeline(pipeline)
                        .executable_index(index as u32);
                    // SAFETY: as above; `index` is one of the executables listed.
                    let stats =
                        unsafe { self.loader.get_pipeline_executable_statistics(&exec_info) };
                    let values = match stats {
                        Ok(stats) => stats.iter().map(format_statistic).collect::<Vec<_>>(),
                        Err(r) => vec![format!("statistics unavailable ({r})")],
                    };
                    let exe = e.name_as_c_str().map(|c| c.to_string_lossy().into_owned());
                    new_lines.push(format!(
                        "pipeline {name}{spec:?} [{}, subgroup {}]: {}",
                        exe.unwrap_or_default(),
                        e.subgroup_size,
                        values.join(", ")
                    ));
                }
            }
            Err(r) => new_lines.push(format!("pipeline {name}{spec:?}: no executables ({r})")),
        }
        for line in &new_lines {
            eprintln!("{line}");
        }
        self.lines
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(new_lines);
    }

    /// Every line reported on this device so far.
    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// "name=value" of one statistic.
fn format_statistic(s: &vk::PipelineExecutableStatisticKHR<'_>) -> String {
    let name = s
        .name_as_c_str()
        .map(|c| c.to_string_lossy().into_owned())
        .unwrap_or_default();
    // SAFETY: the union member read is the one `format` names.
    let value = unsafe {
        match s.format {
            vk::PipelineExecutableStatisticFormatKHR::BOOL32 => (s.value.b32 != 0).to_string(),
            vk::PipelineExecutableStatisticFormatKHR::INT64 => s.value.i64.to_string(),
            vk::PipelineExecutableStatisticFormatKHR::UINT64 => s.value.u64.to_string(),
            vk::PipelineExecutableStatisticFormatKHR::FLOAT64 => format!("{:.3}", s.value.f64),
            _ => "?".to_string(),
        }
    };
    format!("{name}={value}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn statistic(
        name: &str,
        format: vk::PipelineExecutableStatisticFormatKHR,
        value: vk::PipelineExecutableStatisticValueKHR,
    ) -> vk::PipelineExecutableStatisticKHR<'static> {
        let mut s = vk::PipelineExecutableStatisticKHR {
            format,
            value,
            ..Default::default()
        };
        for (dst, src) in s.name.iter_mut().zip(name.bytes()) {
            *dst = src as std::ffi::c_char;
        }
        s
    }

    #[test]
    fn statistics_print_by_their_declared_format() {
        use vk::PipelineExecutableStatisticFormatKHR as F;
        use vk::PipelineExecutableStatisticValueKHR as V;
        assert_eq!(
            format_statistic(&statistic("Registers", F::UINT64, V { u64: 168 })),
            "Registers=168"
        );
        assert_eq!(
            format_statistic(&statistic("Delta", F::INT64, V { i64: -3 })),
            "Delta=-3"
        );
        assert_eq!(
            format_statistic(&statistic("Spills", F::BOOL32, V { b32: 1 })),
            "Spills=true"
        );
        assert_eq!(
            format_statistic(&statistic("Ratio", F::FLOAT64, V { f64: 0.5 })),
            "Ratio=0.500"
        );
    }
}
