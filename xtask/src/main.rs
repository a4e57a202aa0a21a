//! Project chores: `cargo xtask shaders` regenerates the prebuilt SPIR-V
//! (shaders/prebuilt/*.spv and manifest.txt) with glslc (or $FISH_GLSLC).

use anyhow::{bail, Context};
use std::path::{Path, PathBuf};

include!("../../crates/fish-vk/build_support/shader_set.rs");

fn main() -> anyhow::Result<()> {
    let task = std::env::args().nth(1).unwrap_or_default();
    match task.as_str() {
        "shaders" => shaders(),
        _ => {
            eprintln!("usage: cargo xtask shaders");
            std::process::exit(2)
        }
    }
}

fn shaders() -> anyhow::Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = root.join("shaders");
    let out = dir.join("prebuilt");
    let glslc = PathBuf::from(std::env::var("FISH_GLSLC").unwrap_or_else(|_| "glslc".into()));
    if !glslc_works(&glslc) {
        bail!("no working glslc at {} (set FISH_GLSLC)", glslc.display());
    }
    std::fs::create_dir_all(&out).context("create shaders/prebuilt")?;
    // Remove modules that are no longer in the set, so the folder mirrors it.
    let wanted: Vec<String> = shader_specs()
        .iter()
        .map(|s| format!("{}.spv", s.name))
        .collect();
    for entry in std::fs::read_dir(&out)? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if name.ends_with(".spv") && !wanted.contains(&name) {
            std::fs::remove_file(out.join(&name))?;
        }
    }
    for spec in shader_specs() {
        compile(&glslc, &dir, &spec, &out.join(format!("{}.spv", spec.name)))
            .map_err(anyhow::Error::msg)?;
    }
    std::fs::write(out.join("manifest.txt"), manifest_text(&dir)?).context("write manifest")?;
    println!("wrote {} modules to {}", wanted.len(), out.display());
    Ok(())
}
