//! Submits that poll their fence (FISH_VK_SPIN_WAIT_US, set here for the
//! whole binary; on lavapipe the default blocks) return the finished work:
//! a matvec of every call equals the one before and the CPU product.

mod common;

use common::{check_against_cpu, gpu_or_skip, matmul_one, random_values, with_uploaded};
use fish_gguf::GgmlType;
use fish_vk::Kernel;

#[test]
fn polled_submits_return_finished_results() {
    // Long enough that most waits end in the polling loop, short enough
    // that a slow one reaches the blocking wait as well.
    std::env::set_var("FISH_VK_SPIN_WAIT_US", "2000");
    let Some(gpu) = gpu_or_skip() else { return };
    let (n_in, n_out) = (1024, 512);
    let x = random_values(n_in, 7);
    with_uploaded(gpu, GgmlType::Q4_K, (n_in, n_out), 11, |w, h| {
        let first = matmul_one(gpu, h, &x, 1, Kernel::Matvec);
        check_against_cpu(w, &x, 1, &first, "polled matvec");
        for _ in 0..20 {
            assert_eq!(matmul_one(gpu, h, &x, 1, Kernel::Matvec), first);
        }
    });
    assert_eq!(gpu.validation_messages(), 0);
}
