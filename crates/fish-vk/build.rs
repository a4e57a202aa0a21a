//! Compiles the GLSL kernels with glslc when a working one is found and
//! otherwise takes the committed SPIR-V from shaders/prebuilt/; either way it
//! writes `$OUT_DIR/shaders.rs`, a table of `include_bytes!` modules.
//! The cooperative-matrix modules are always the prebuilt ones: they need a
//! newer compiler than glslc (`cargo xtask shaders` runs glslangValidator);
//! so are the SPIRV_OPT_MODULES, which need a newer optimiser than its own.

use std::path::{Path, PathBuf};

include!("build_support/shader_set.rs");

fn main() {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let shader_dir = manifest_dir.join("../../shaders");
    let prebuilt = shader_dir.join("prebuilt");
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets it"));
    println!("cargo:rerun-if-changed={}", shader_dir.display());
    println!("cargo:rerun-if-changed=build_support/shader_set.rs");
    println!("cargo:rerun-if-env-changed=FISH_GLSLC");

    let glslc = PathBuf::from(std::env::var("FISH_GLSLC").unwrap_or_else(|_| "glslc".into()));
    let compiled = glslc_works(&glslc);
    let spv_dir = if compiled {
        let dir = out_dir.join("spv");
        std::fs::create_dir_all(&dir).expect("create OUT_DIR/spv");
        // Cooperative-matrix modules need a newer compiler than glslc, and
        // the SPIRV_OPT_MODULES a newer optimiser than its own: they always
        // come from shaders/prebuilt (write_table).
        let glslc_specs = shader_specs()
            .into_iter()
            .filter(|s| s.compiler == ShaderCompiler::Glslc);
        for spec in glslc_specs {
            if let Err(e) = compile(
                &glslc,
                &shader_dir,
                &spec,
                &dir.join(format!("{}.spv", spec.name)),
            ) {
                panic!("{e}");
            }
        }
        dir
    } else {
        warn_if_stale(&shader_dir, &prebuilt);
        prebuilt.clone()
    };
    write_table(&spv_dir, &prebuilt, &out_dir.join("shaders.rs"), compiled);
}

fn warn_if_stale(shader_dir: &Path, prebuilt: &Path) {
    let current = manifest_text(shader_dir).unwrap_or_default();
    let committed = std::fs::read_to_string(prebuilt.join("manifest.txt")).unwrap_or_default();
    if current != committed {
        println!(
            "cargo:warning=no working glslc and shaders/prebuilt is stale: run `cargo xtask shaders` on a machine with glslc"
        );
    }
}

fn write_table(spv_dir: &Path, prebuilt: &Path, out: &Path, compiled: bool) {
    let mut text = String::new();
    text.push_str(&format!(
        "/// True when these modules were compiled by this build (false: prebuilt).\npub const COMPILED_AT_BUILD: bool = {compiled};\n"
    ));
    text.push_str("/// Every embedded module as (name, SPIR-V bytes).\npub const MODULES: &[(&str, &[u8])] = &[\n");
    for spec in shader_specs() {
        let dir = match spec.compiler {
            ShaderCompiler::Glslc => spv_dir,
            ShaderCompiler::GlslangCoopMat
            | ShaderCompiler::GlslangCoopMat2
            | ShaderCompiler::GlslcSpirvOpt => prebuilt,
        };
        let path = dir.join(format!("{}.spv", spec.name));
        text.push_str(&format!(
            "    ({:?}, include_bytes!({:?})),\n",
            spec.name,
            path.display().to_string()
        ));
    }
    text.push_str("];\n");
    std::fs::write(out, text).expect("write shaders.rs");
}
