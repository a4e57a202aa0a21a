// The set of SPIR-V modules fish-vk embeds, shared by build.rs, `cargo xtask
// shaders` and the staleness test (each includes this file with `include!`).
// Only std is used here so that every includer can compile it as is.

/// Weight types with kernels, as (WeightFormat name, lower-case module suffix).
pub const KERNEL_TYPES: &[(&str, &str)] = &[
    ("F32", "f32"),
    ("F16", "f16"),
    ("Q4_0", "q4_0"),
    ("Q4_1", "q4_1"),
    ("Q5_0", "q5_0"),
    ("Q5_1", "q5_1"),
    ("Q8_0", "q8_0"),
    ("Q4_K", "q4_k"),
    ("Q5_K", "q5_k"),
    ("Q6_K", "q6_k"),
    // The project's own 3-bit format (fish_vk::WeightFormat::Fq3).
    ("FQ3", "fq3"),
];

/// Kernel types stored as floats: no int8-activation matvec (matvec_i8.comp).
pub const FLOAT_TYPES: &[&str] = &["F32", "F16"];

/// The span kernels (stage 2) as (module name, source file in shaders/, defines).
pub const SPAN_MODULES: &[(&str, &str, &[&str])] = &[
    ("span_rmsnorm", "span_rmsnorm.comp", &[]),
    ("span_add", "span_add.comp", &[]),
    ("span_act", "span_act.comp", &[]),
    ("span_rope", "span_rope.comp", &[]),
    ("span_attention", "span_attention.comp", &[]),
    ("span_attention_rope", "span_attention.comp", &["ROPE_FUSED"]),
    ("span_attention_tiled", "span_attention_tiled.comp", &[]),
    ("span_attention_split", "span_attention_split.comp", &[]),
    ("span_attention_split_rope", "span_attention_split.comp", &["ROPE_FUSED"]),
    // Spans record it with the matmul bindings (shaders/common.glsl).
    ("l2_prefetch", "l2_prefetch.comp", &[]),
    ("l2_prefetch_up", "l2_prefetch.comp", &["READ_UP"]),
];

/// Measurement-only modules compiled with glslc: (name, source, defines).
pub const PROBE_MODULES: &[(&str, &str, &[&str])] = &[
    ("grid_barrier_probe", "grid_barrier_probe.comp", &[]),
    ("atomic_add_probe", "atomic_add_probe.comp", &[]),
    ("persistent_matvec_probe", "persistent_matvec_probe.comp", &[]),
    (
        "persistent_matvec_probe_prefetch",
        "persistent_matvec_probe.comp",
        &["PREFETCH"],
    ),
    (
        "persistent_matvec_probe_prefetch_l1",
        "persistent_matvec_probe.comp",
        &["PREFETCH", "L1_X"],
    ),
    (
        "persistent_matvec_probe_preload",
        "persistent_matvec_probe.comp",
        &["PRELOAD_ALL"],
    ),
    ("persistent_layer_probe", "persistent_layer_probe.comp", &[]),
    (
        "persistent_layer_probe_ahead",
        "persistent_layer_probe.comp",
        &["AHEAD"],
    ),
    (
        "persistent_layer_probe_ahead_l1",
        "persistent_layer_probe.comp",
        &["AHEAD", "L1_X"],
    ),
    (
        "persistent_layer_probe_ahead_wide",
        "persistent_layer_probe.comp",
        &["AHEAD", "L1_X", "WIDE_BLOCKS"],
    ),
    ("persistent_decode_layer", "persistent_decode_layer.comp", &[]),
    (
        "persistent_decode_layer_l1",
        "persistent_decode_layer.comp",
        &["L1_INPUTS"],
    ),
];

/// Modules that glslc compiles unoptimised and SPIRV-Tools 2025 or later
/// optimises (`ShaderCompiler::GlslcSpirvOpt`).
pub const SPIRV_OPT_MODULES: &[(&str, &str, &[&str])] = &[
    // On a layout of its own (span/persistent.rs). Its matvec phases are
    // compiled apart with the phase a constant, which the optimiser of
    // Debian 12's glslc (SPIRV-Tools 2022.4) crashes on.
    ("span_persistent_layer", "span_persistent_layer.comp", &[]),
];

/// Arguments every glslc module is compiled with (part of the staleness hash).
pub const GLSLC_ARGS: &[&str] = &["--target-env=vulkan1.1", "-O"];

/// glslc's arguments for the SPIRV_OPT_MODULES (part of their staleness hash).
pub const GLSLC_UNOPTIMISED_ARGS: &[&str] = &["--target-env=vulkan1.1", "-O0"];

/// spirv-opt's arguments for the SPIRV_OPT_MODULES, after glslc (part of
/// their staleness hash).
pub const SPIRV_OPT_ARGS: &[&str] = &["-O"];

/// Arguments of the glslangValidator modules (part of their staleness hash).
/// SPIR-V 1.3 with SPV_KHR_cooperative_matrix and SPV_KHR_vulkan_memory_model,
/// which a Vulkan 1.1 device takes with those extensions enabled.
pub const GLSLANG_ARGS: &[&str] = &["-V", "--target-env", "vulkan1.1"];

/// Arguments of the modules on workgroup-scope cooperative matrices
/// (GL_NV_cooperative_matrix2 needs SPIR-V 1.6, so a Vulkan 1.3 target).
pub const GLSLANG2_ARGS: &[&str] = &["-V", "--target-env", "vulkan1.3"];

/// The compiler a module needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShaderCompiler {
    /// glslc (Debian 12's works); build.rs compiles these when it finds one.
    Glslc,
    /// glslangValidator with GL_KHR_cooperative_matrix (glslc 2023.2 lacks it):
    /// only `cargo xtask shaders` runs it; builds embed the prebuilt module.
    GlslangCoopMat,
    /// glslangValidator 15.1 or later (GL_NV_cooperative_matrix2): only
    /// `cargo xtask shaders` runs it, with $FISH_GLSLANG2.
    GlslangCoopMat2,
    /// glslc without optimisation, then spirv-opt -O of SPIRV-Tools 2025 or
    /// later ($FISH_SPIRV_OPT): only `cargo xtask shaders` runs them.
    GlslcSpirvOpt,
}

impl ShaderCompiler {
    pub fn args(self) -> &'static [&'static str] {
        match self {
            ShaderCompiler::Glslc => GLSLC_ARGS,
            ShaderCompiler::GlslangCoopMat => GLSLANG_ARGS,
            ShaderCompiler::GlslangCoopMat2 => GLSLANG2_ARGS,
            ShaderCompiler::GlslcSpirvOpt => GLSLC_UNOPTIMISED_ARGS,
        }
    }

    /// spirv-opt's arguments after the compiler, if it runs.
    pub fn optimiser_args(self) -> &'static [&'static str] {
        match self {
            ShaderCompiler::GlslcSpirvOpt => SPIRV_OPT_ARGS,
            _ => &[],
        }
    }
}

/// One SPIR-V module: its name, its GLSL source file in shaders/ and its defines.
pub struct ShaderSpec {
    pub name: String,
    pub source: &'static str,
    pub defines: Vec<String>,
    pub compiler: ShaderCompiler,
}

/// One kernel built for every weight type: module `{prefix}_{suffix}` from
/// `source` with `TYPE_{ty}` and `defines`; `quantised_only` skips
/// FLOAT_TYPES.
struct TypeVariant {
    prefix: &'static str,
    source: &'static str,
    defines: &'static [&'static str],
    compiler: ShaderCompiler,
    quantised_only: bool,
}

/// The per-type kernels, in module order.
const TYPE_VARIANTS: &[TypeVariant] = &[
    TypeVariant {
        prefix: "matvec",
        source: "matvec.comp",
        defines: &[],
        compiler: ShaderCompiler::Glslc,
        quantised_only: false,
    },
    TypeVariant {
        prefix: "matvec_subgroup",
        source: "matvec.comp",
        defines: &["USE_SUBGROUP"],
        compiler: ShaderCompiler::Glslc,
        quantised_only: false,
    },
    TypeVariant {
        prefix: "matvec_norm",
        source: "matvec.comp",
        defines: &["USE_SUBGROUP", "NORM"],
        compiler: ShaderCompiler::Glslc,
        quantised_only: false,
    },
    TypeVariant {
        prefix: "matvec_resnorm",
        source: "matvec.comp",
        defines: &["USE_SUBGROUP", "RESNORM"],
        compiler: ShaderCompiler::Glslc,
        quantised_only: false,
    },
    TypeVariant {
        prefix: "matvec_prenormed",
        source: "matvec.comp",
        defines: &["USE_SUBGROUP", "PRENORMED"],
        compiler: ShaderCompiler::Glslc,
        quantised_only: false,
    },
    TypeVariant {
        prefix: "matvec_gated",
        source: "matvec.comp",
        defines: &["USE_SUBGROUP", "GATED"],
        compiler: ShaderCompiler::Glslc,
        quantised_only: false,
    },
    TypeVariant {
        prefix: "matvec_gateup",
        source: "matvec.comp",
        defines: &["USE_SUBGROUP", "PRENORMED", "GATE_UP"],
        compiler: ShaderCompiler::Glslc,
        quantised_only: false,
    },
    TypeVariant {
        prefix: "matvec_i8",
        source: "matvec_i8.comp",
        defines: &[],
        compiler: ShaderCompiler::Glslc,
        quantised_only: true,
    },
    TypeVariant {
        prefix: "matvec_i8x",
        source: "matvec_i8.comp",
        defines: &["X_PREQUANTISED"],
        compiler: ShaderCompiler::Glslc,
        quantised_only: true,
    },
    // The int8 matvec on the matrix units (int8_matrix.rs) and its
    // emulation on plain code.
    TypeVariant {
        prefix: "matvec_i8mm",
        source: "matvec_i8mm.comp",
        defines: &[],
        compiler: ShaderCompiler::GlslangCoopMat,
        quantised_only: true,
    },
    TypeVariant {
        prefix: "matvec_i8mm_emu",
        source: "matvec_i8mm.comp",
        defines: &["EMULATE_COOPMAT"],
        compiler: ShaderCompiler::Glslc,
        quantised_only: true,
    },
    // The int8 gate/up matvec with the activation and its quantisation in
    // the epilogue (span decode steps).
    TypeVariant {
        prefix: "matvec_i8x_gateup",
        source: "matvec_i8.comp",
        defines: &["X_PREQUANTISED", "GATE_UP_INT8"],
        compiler: ShaderCompiler::Glslc,
        quantised_only: true,
    },
    // The same in narrow workgroups whose last of a block quantises it.
    TypeVariant {
        prefix: "matvec_i8x_gateup_narrow",
        source: "matvec_i8.comp",
        defines: &["X_PREQUANTISED", "GATE_UP_NARROW"],
        compiler: ShaderCompiler::Glslc,
        quantised_only: true,
    },
    // The plain one-token matvec with the attention norm in that prologue
    // (q/k/v of span decode steps).
    TypeVariant {
        prefix: "matvec_i8x_norm",
        source: "matvec_i8.comp",
        defines: &["SLICED", "NORM_PROLOGUE"],
        compiler: ShaderCompiler::Glslc,
        quantised_only: true,
    },
    // The plain one-token matvec on the attention's int8 copy that loads its
    // weights before waiting for that copy (wo of span decode steps whose
    // attention runs right before it with no barrier).
    TypeVariant {
        prefix: "matvec_i8x_wait",
        source: "matvec_i8.comp",
        defines: &["SLICED", "WAIT_X"],
        compiler: ShaderCompiler::Glslc,
        quantised_only: true,
    },
    // The gate/up one with the feed-forward norm and its quantisation in a
    // prologue (span decode steps, no norm dispatch).
    TypeVariant {
        prefix: "matvec_i8x_gateup_norm",
        source: "matvec_i8.comp",
        defines: &["GATE_UP_INT8", "NORM_PROLOGUE"],
        compiler: ShaderCompiler::Glslc,
        quantised_only: true,
    },
    TypeVariant {
        prefix: "coopmat",
        source: "matmul_coopmat.comp",
        defines: &[],
        compiler: ShaderCompiler::GlslangCoopMat,
        quantised_only: false,
    },
    TypeVariant {
        prefix: "coopmat_emu",
        source: "matmul_coopmat.comp",
        defines: &["EMULATE_COOPMAT"],
        compiler: ShaderCompiler::Glslc,
        quantised_only: false,
    },
    // The same on x in f16 (prefill matmuls after a norm that writes f16).
    TypeVariant {
        prefix: "coopmat_x16",
        source: "matmul_coopmat.comp",
        defines: &["X_F16"],
        compiler: ShaderCompiler::GlslangCoopMat,
        quantised_only: false,
    },
    TypeVariant {
        prefix: "coopmat_emu_x16",
        source: "matmul_coopmat.comp",
        defines: &["EMULATE_COOPMAT", "X_F16"],
        compiler: ShaderCompiler::Glslc,
        quantised_only: false,
    },
    TypeVariant {
        prefix: "coopmat_stream",
        source: "matmul_coopmat_stream.comp",
        defines: &[],
        compiler: ShaderCompiler::GlslangCoopMat,
        quantised_only: false,
    },
    TypeVariant {
        prefix: "coopmat_stream_emu",
        source: "matmul_coopmat_stream.comp",
        defines: &["EMULATE_COOPMAT"],
        compiler: ShaderCompiler::Glslc,
        quantised_only: false,
    },
    TypeVariant {
        prefix: "tiled",
        source: "matmul_tiled.comp",
        defines: &[],
        compiler: ShaderCompiler::Glslc,
        quantised_only: false,
    },
];

/// Span kernels on cooperative matrices (glslangValidator), as SPAN_MODULES:
/// prefill attention for heads of 64 and 128 values.
pub const COOPMAT_SPAN_MODULES: &[(&str, &str, &[&str])] = &[
    ("span_attention_coopmat_d64", "span_attention_coopmat.comp", &["HEAD_DIM=64u"]),
    ("span_attention_coopmat_d128", "span_attention_coopmat.comp", &["HEAD_DIM=128u"]),
];

/// The prefill matmul on workgroup-scope cooperative matrices
/// (matmul_coopmat2.comp, coopmat2.rs) for the types it decodes.
pub const COOPMAT2_MODULES: &[(&str, &str, &[&str])] = &[
    ("coopmat2_q4_k", "matmul_coopmat2.comp", &["TYPE_Q4_K"]),
    ("coopmat2_q6_k", "matmul_coopmat2.comp", &["TYPE_Q6_K"]),
];

/// The int8 matrix kernel's f16-fragment form (matvec_i8mm_h16.glsl) on x
/// in f16 (X_F16), for the two types that form serves: batched decode
/// steps whose stages before write f16 (int8_matrix.rs `reads_f16_x`).
/// glslangValidator, as the other int8 matrix modules.
pub const INT8_MATRIX_X16_MODULES: &[(&str, &str, &[&str])] = &[
    ("matvec_i8mm_x16_q4_k", "matvec_i8mm.comp", &["TYPE_Q4_K", "X_F16"]),
    ("matvec_i8mm_x16_q6_k", "matvec_i8mm.comp", &["TYPE_Q6_K", "X_F16"]),
    // The gate/up matvec of such steps with the activation in its epilogue
    // (GATE_UP; gate and up are Q4_K in Q4_K_M files).
    (
        "matvec_i8mm_x16_gateup_q4_k",
        "matvec_i8mm.comp",
        &["TYPE_Q4_K", "X_F16", "GATE_UP"],
    ),
];

/// Their emulation on plain code (glslc), for tests on any device.
pub const INT8_MATRIX_X16_EMULATED_MODULES: &[(&str, &str, &[&str])] = &[
    (
        "matvec_i8mm_emu_x16_q4_k",
        "matvec_i8mm.comp",
        &["TYPE_Q4_K", "X_F16", "EMULATE_COOPMAT"],
    ),
    (
        "matvec_i8mm_emu_x16_q6_k",
        "matvec_i8mm.comp",
        &["TYPE_Q6_K", "X_F16", "EMULATE_COOPMAT"],
    ),
];

/// The prefill matmul on fragments built in registers (matmul_frags.comp,
/// frags.rs) for the two types it decodes, on x in f16.
pub const FRAGS_MODULES: &[(&str, &str, &[&str])] = &[
    ("coopmat_frags_x16_q4_k", "matmul_frags.comp", &["TYPE_Q4_K"]),
    ("coopmat_frags_x16_q6_k", "matmul_frags.comp", &["TYPE_Q6_K"]),
    // The gate/up projection with the gated activation in its epilogue
    // (GATE_UP; gate and up are Q4_K in Q4_K_M files).
    (
        "coopmat_frags_x16_gateup_q4_k",
        "matmul_frags.comp",
        &["TYPE_Q4_K", "GATE_UP"],
    ),
];

/// Their emulation on plain code (glslc), for tests on any device.
pub const FRAGS_EMULATED_MODULES: &[(&str, &str, &[&str])] = &[
    (
        "coopmat_frags_emu_x16_q4_k",
        "matmul_frags.comp",
        &["TYPE_Q4_K", "EMULATE_COOPMAT"],
    ),
    (
        "coopmat_frags_emu_x16_q6_k",
        "matmul_frags.comp",
        &["TYPE_Q6_K", "EMULATE_COOPMAT"],
    ),
    (
        "coopmat_frags_emu_x16_gateup_q4_k",
        "matmul_frags.comp",
        &["TYPE_Q4_K", "GATE_UP", "EMULATE_COOPMAT"],
    ),
];

/// Measurement-only cooperative-matrix modules (glslangValidator) as
/// (module name, source file in shaders/, defines).
pub const COOPMAT_PROBE_MODULES: &[(&str, &str, &[&str])] = &[
    ("coopmat_peak", "coopmat_peak.comp", &[]),
    ("coopmat_peak_fixed", "coopmat_peak.comp", &["FIXED_SHAPE"]),
    ("coopmat_peak_shared", "coopmat_peak.comp", &["SHARED_LOADS"]),
];

/// Every module, in a fixed order.
pub fn shader_specs() -> Vec<ShaderSpec> {
    let mut specs = Vec::new();
    for (ty, suffix) in KERNEL_TYPES {
        for v in TYPE_VARIANTS {
            if v.quantised_only && FLOAT_TYPES.contains(ty) {
                continue;
            }
            let mut defines = vec![format!("TYPE_{ty}")];
            defines.extend(v.defines.iter().map(|d| d.to_string()));
            specs.push(ShaderSpec {
                name: format!("{}_{suffix}", v.prefix),
                source: v.source,
                defines,
                compiler: v.compiler,
            });
        }
    }
    let lists = [
        (SPAN_MODULES, ShaderCompiler::Glslc),
        (SPIRV_OPT_MODULES, ShaderCompiler::GlslcSpirvOpt),
        (PROBE_MODULES, ShaderCompiler::Glslc),
        (INT8_MATRIX_X16_EMULATED_MODULES, ShaderCompiler::Glslc),
        (INT8_MATRIX_X16_MODULES, ShaderCompiler::GlslangCoopMat),
        (FRAGS_EMULATED_MODULES, ShaderCompiler::Glslc),
        (FRAGS_MODULES, ShaderCompiler::GlslangCoopMat),
        (COOPMAT_SPAN_MODULES, ShaderCompiler::GlslangCoopMat),
        (COOPMAT_PROBE_MODULES, ShaderCompiler::GlslangCoopMat),
        (COOPMAT2_MODULES, ShaderCompiler::GlslangCoopMat2),
    ];
    for (list, compiler) in lists {
        for (name, source, defines) in list {
            specs.push(ShaderSpec {
                name: name.to_string(),
                source,
                defines: defines.iter().map(|d| d.to_string()).collect(),
                compiler,
            });
        }
    }
    specs
}

/// 64-bit FNV-1a; enough to notice an edited source, not a security hash.
fn fnv1a(hash: &mut u64, bytes: &[u8]) {
    for b in bytes {
        *hash ^= u64::from(*b);
        *hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
}

/// The files `#include "..."`d by `text`, in order of appearance.
fn includes_of(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|line| {
            let rest = line.trim_start().strip_prefix("#include")?;
            let start = rest.find('"')? + 1;
            let end = start + rest[start..].find('"')?;
            Some(rest[start..end].to_string())
        })
        .collect()
}

/// Feeds `file` and, depth first, everything it includes into the hash.
fn hash_file(
    dir: &std::path::Path,
    file: &str,
    hash: &mut u64,
    seen: &mut Vec<String>,
) -> std::io::Result<()> {
    if seen.iter().any(|s| s == file) {
        return Ok(());
    }
    seen.push(file.to_string());
    let text = std::fs::read_to_string(dir.join(file))?;
    fnv1a(hash, file.as_bytes());
    // Line endings are normalised so that a Windows checkout hashes alike.
    fnv1a(hash, text.replace("\r\n", "\n").as_bytes());
    for inc in includes_of(&text) {
        hash_file(dir, &inc, hash, seen)?;
    }
    Ok(())
}

/// Hash of a module's source, its includes, defines and compiler arguments.
pub fn spec_hash(dir: &std::path::Path, spec: &ShaderSpec) -> std::io::Result<u64> {
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    fnv1a(&mut hash, spec.name.as_bytes());
    for d in &spec.defines {
        fnv1a(&mut hash, d.as_bytes());
    }
    for a in spec.compiler.args() {
        fnv1a(&mut hash, a.as_bytes());
    }
    for a in spec.compiler.optimiser_args() {
        fnv1a(&mut hash, a.as_bytes());
    }
    hash_file(dir, spec.source, &mut hash, &mut Vec::new())?;
    Ok(hash)
}

/// The text of shaders/prebuilt/manifest.txt for the current sources.
pub fn manifest_text(dir: &std::path::Path) -> std::io::Result<String> {
    let mut out = String::from("# name source-hash (regenerate with `cargo xtask shaders`)\n");
    for spec in shader_specs() {
        out.push_str(&format!("{} {:016x}\n", spec.name, spec_hash(dir, &spec)?));
    }
    Ok(out)
}

/// True when `glslc --version` runs and exits successfully.
pub fn glslc_works(glslc: &std::path::Path) -> bool {
    std::process::Command::new(glslc)
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Compiles one module to `out` with `compiler` (the program that
/// spec.compiler names); the error carries the compiler's message.
pub fn compile(
    compiler: &std::path::Path,
    dir: &std::path::Path,
    spec: &ShaderSpec,
    out: &std::path::Path,
) -> Result<(), String> {
    let mut cmd = std::process::Command::new(compiler);
    cmd.args(spec.compiler.args());
    for d in &spec.defines {
        cmd.arg(format!("-D{d}"));
    }
    cmd.arg(dir.join(spec.source)).arg("-o").arg(out);
    run_tool(cmd, compiler, spec)
}

/// Runs spirv-opt (`optimiser`) with spec.compiler's optimiser arguments on
/// `module`, in place; the error carries its message.
pub fn optimise(
    optimiser: &std::path::Path,
    spec: &ShaderSpec,
    module: &std::path::Path,
) -> Result<(), String> {
    let mut cmd = std::process::Command::new(optimiser);
    cmd.args(spec.compiler.optimiser_args())
        .arg(module)
        .arg("-o")
        .arg(module);
    run_tool(cmd, optimiser, spec)
}

/// Runs `cmd` (the program `tool`) for module `spec`; a failure's error
/// names both and carries the tool's output.
fn run_tool(
    mut cmd: std::process::Command,
    tool: &std::path::Path,
    spec: &ShaderSpec,
) -> Result<(), String> {
    let output = cmd
        .output()
        .map_err(|e| format!("running {}: {e}", tool.display()))?;
    if output.status.success() {
        Ok(())
    } else {
        // glslangValidator reports errors on stdout, glslc on stderr.
        Err(format!(
            "{} failed on {}: {}{}",
            tool.display(),
            spec.name,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}
