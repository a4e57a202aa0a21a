//! FISH_VK_PIPELINE_STATS=1: every matmul pipeline built reports the
//! driver's statistics (VK_KHR_pipeline_executable_properties) where the
//! device offers them; the results do not change. Its own test binary: the
//! variable is read when a device is opened.

mod common;

use fish_gguf::GgmlType;
use fish_vk::{Config, Gpu, Kernel};

#[test]
fn pipelines_report_statistics_when_asked() {
    if common::gpu_or_skip().is_none() {
        return;
    }
    std::env::set_var("FISH_VK_PIPELINE_STATS", "1");
    let gpu = Gpu::open(&Config::from_env()).expect("open a second device object");
    let (n_in, n_out, n_tok) = (256, 40, 3);
    let w = common::synthetic_weights(GgmlType::Q4_K, n_in, n_out, 3);
    let h = gpu.upload(GgmlType::Q4_K, &w, n_in, n_out).expect("upload");
    let x = common::random_values(n_in * n_tok, 4);
    let y = common::matmul_one(&gpu, h, &x, n_tok, Kernel::Matvec);
    let weights = common::Weights {
        ty: GgmlType::Q4_K,
        bytes: &w,
        n_in,
        n_out,
    };
    common::check_against_cpu(&weights, &x, n_tok, &y, "with statistics");
    let lines = gpu.pipeline_statistics();
    eprintln!("{}", lines.join("\n"));
    if gpu.info().pipeline_stats {
        assert!(
            lines.iter().any(|l| l.starts_with("pipeline matvec_q4_k")),
            "no statistics for the matvec pipeline: {lines:?}"
        );
    } else {
        assert!(lines.is_empty(), "{lines:?}");
    }
    common::assert_no_validation_messages(&gpu);
}
