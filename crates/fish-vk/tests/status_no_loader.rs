//! Without a Vulkan loader the backend is unavailable and says why.
//! (One test per binary: it sets the process environment.)

#[test]
fn a_missing_loader_leaves_the_backend_unavailable_with_a_reason() {
    std::env::remove_var("FISH_GPU");
    std::env::set_var(
        "FISH_VK_LOADER",
        "/nonexistent/libvulkan-for-fish-tests.so.1",
    );
    assert!(fish_vk::enabled());
    assert!(fish_vk::global().is_none());
    let status = fish_vk::status();
    assert!(
        status.starts_with("unavailable: Vulkan loader not available"),
        "{status}"
    );
    assert!(status.contains("libvulkan-for-fish-tests"), "{status}");
    // The explicit API reports the same failure as a typed error.
    let err = fish_vk::Gpu::open(&fish_vk::Config::from_env()).err();
    assert!(matches!(err, Some(fish_vk::VkError::Loader(_))), "{err:?}");
}
