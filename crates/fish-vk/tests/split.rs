//! Tensors larger than one device buffer are split by rows; an explicitly
//! opened device releases everything when dropped.

mod common;

use fish_gguf::GgmlType;
use fish_vk::{Config, Gpu, Kernel};

#[test]
fn split_tensors_compute_like_whole_ones_and_drop_releases_all() {
    if common::gpu_or_skip().is_none() {
        return;
    }
    let config = Config {
        chunk_mb: Some(1),
        ..Config::from_env()
    };
    let gpu = Gpu::open(&config).expect("open a second device object");
    // 3000 rows x 1024 Q4_1 values = 1.8 MB: two chunks of at most 1 MB.
    let (n_in, n_out) = (1024, 3000);
    let w = common::synthetic_weights(GgmlType::Q4_1, n_in, n_out, 5);
    let h = gpu.upload(GgmlType::Q4_1, &w, n_in, n_out).expect("upload");
    assert_eq!(gpu.chunk_count(h), Some(2));
    for (kernel, n_tok) in [(Kernel::Matvec, 2usize), (Kernel::Tiled, 70)] {
        let x = common::random_values(n_in * n_tok, 9);
        let y = common::matmul_one(&gpu, h, &x, n_tok, kernel);
        common::check_against_cpu(
            &common::Weights {
                ty: GgmlType::Q4_1,
                bytes: &w,
                n_in,
                n_out,
            },
            &x,
            n_tok,
            &y,
            &format!("split {kernel:?}"),
        );
    }
    assert!(gpu.allocation_count() > 0);
    common::assert_no_validation_messages(&gpu);
    // Dropping runs vkDestroyDevice/Instance; the validation layer (when on)
    // reports any object still alive as an error on stderr at that point.
    drop(gpu);
}
