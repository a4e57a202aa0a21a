//! FISH_GPU=0 turns the backend off without opening anything.
//! (One test per binary: it sets the process environment.)

#[test]
fn fish_gpu_0_disables_the_backend() {
    for value in ["0", "off", "false", "no", "OFF"] {
        std::env::set_var("FISH_GPU", value);
        assert!(!fish_vk::enabled(), "FISH_GPU={value}");
    }
    std::env::set_var("FISH_GPU", "0");
    let status = fish_vk::status();
    assert!(status.starts_with("disabled"), "{status}");
    assert!(fish_vk::global().is_none());
    assert!(fish_vk::status().starts_with("disabled"));
}
