//! The committed SPIR-V in shaders/prebuilt/ must match the sources: a build
//! without glslc embeds it, so a stale set would silently run old kernels.

use std::path::Path;

include!("../build_support/shader_set.rs");

fn shader_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shaders")
}

#[test]
fn prebuilt_manifest_matches_the_sources() {
    let dir = shader_dir();
    let current = manifest_text(&dir).expect("hash shader sources");
    let committed = std::fs::read_to_string(dir.join("prebuilt/manifest.txt")).unwrap_or_default();
    assert!(
        current == committed,
        "shaders/prebuilt is stale: run `cargo xtask shaders`\n--- committed\n{committed}--- current\n{current}"
    );
}

#[test]
fn every_module_is_prebuilt_and_embedded() {
    let dir = shader_dir().join("prebuilt");
    for spec in shader_specs() {
        let path = dir.join(format!("{}.spv", spec.name));
        let bytes = std::fs::read(&path).unwrap_or_default();
        assert!(
            bytes.starts_with(&[0x03, 0x02, 0x23, 0x07]),
            "{} is not SPIR-V",
            path.display()
        );
        let embedded = fish_vk::module_bytes(&spec.name).unwrap_or_default();
        assert!(
            embedded.starts_with(&[0x03, 0x02, 0x23, 0x07]),
            "{} not embedded",
            spec.name
        );
        // A build without glslc embeds exactly the prebuilt file.
        if !fish_vk::COMPILED_AT_BUILD {
            assert_eq!(embedded, &bytes[..], "{}", spec.name);
        }
    }
}

#[test]
fn editing_a_source_changes_its_hash() {
    let tmp = std::env::temp_dir().join(format!("fish-vk-hash-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).expect("temp dir");
    // Every source and include, so that the copy hashes like the original.
    for entry in std::fs::read_dir(shader_dir()).expect("list shaders") {
        let path = entry.expect("shader entry").path();
        if matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("comp" | "glsl")
        ) {
            let name = path.file_name().expect("file name");
            std::fs::copy(&path, tmp.join(name)).expect("copy shader");
        }
    }
    let spec = &shader_specs()[0];
    let before = spec_hash(&tmp, spec).expect("hash");
    // An edit inside an included file must show up too.
    let mut text = std::fs::read_to_string(tmp.join("dequant.glsl")).expect("read");
    text.push_str("\n// edited\n");
    std::fs::write(tmp.join("dequant.glsl"), text).expect("write");
    let after = spec_hash(&tmp, spec).expect("hash");
    std::fs::remove_dir_all(&tmp).ok();
    assert_ne!(before, after);
}
