//! Online re-quantisation at upload (FISH_GPU_REQUANT): the reported error
//! per tensor, the device sizes, the tensors that keep their type, and the
//! GPU kernels against the CPU decode of the same re-quantised bytes.

mod common;

use fish_core::backend::ComputeBackend;
use fish_gguf::GgmlType;
use fish_quant::fq3::dequant_row_fq3;
use fish_quant::requant::{requantize, RequantTarget};
use fish_quant::{dequant_row, quantize_row, row_bytes, Weights};
use fish_span::{device_has, RequantMode, RequantOutcome, VulkanBackend};

/// Deterministic values in about -1..1 with a few larger ones (as real
/// weights have), from a fixed seed.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let u = (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
            if i % 97 == 0 {
                4.0 * u
            } else {
                u
            }
        })
        .collect()
}

/// `n_out` rows of `n_in` random values stored as `ty`.
fn matrix(ty: GgmlType, n_in: usize, n_out: usize, seed: u64) -> Vec<u8> {
    let row = row_bytes(ty, n_in).expect("whole blocks");
    let x = values(n_in * n_out, seed);
    let mut out = vec![0u8; row * n_out];
    for (src, dst) in x.chunks_exact(n_in).zip(out.chunks_exact_mut(row)) {
        quantize_row(ty, src, dst).expect("quantize");
    }
    out
}

fn decode(ty: GgmlType, bytes: &[u8], n_in: usize) -> Vec<f32> {
    let row = row_bytes(ty, n_in).expect("whole blocks");
    let mut out = vec![0f32; bytes.len() / row * n_in];
    for (src, dst) in bytes.chunks_exact(row).zip(out.chunks_exact_mut(n_in)) {
        dequant_row(ty, src, dst).expect("decode");
    }
    out
}

fn decode_target(target: RequantTarget, bytes: &[u8], n_in: usize) -> Vec<f32> {
    match target {
        RequantTarget::Q4K => decode(GgmlType::Q4_K, bytes, n_in),
        RequantTarget::Fq3 => {
            let mut out = vec![0f32; bytes.len() / (n_in / 256 * 112) * n_in];
            dequant_row_fq3(bytes, &mut out).expect("decode FQ3");
            out
        }
    }
}

fn backend_with(mode: RequantMode) -> Option<VulkanBackend> {
    let b = common::backend()?;
    let b = std::sync::Arc::try_unwrap(b).ok().expect("sole owner");
    b.set_requant(mode);
    Some(b)
}

/// y = W x for decoded `w`, each element checked within
/// 1e-3 * (sum_i |w_i||x_i|) / n_out (the kernels' bound). Where decode
/// runs the int8 matvec, x is first quantised as that kernel does and one
/// quant step of the largest weight is allowed on top (a tie rounded the
/// other way).
#[allow(clippy::too_many_arguments)]
fn check_against_decoded(
    gpu: &VulkanBackend,
    ty: fish_vk::WeightFormat,
    w: &[f32],
    n_in: usize,
    x: &[f32],
    n_tok: usize,
    y: &[f32],
    what: &str,
) {
    let n_out = w.len() / n_in;
    assert_eq!(y.len(), n_out * n_tok, "{what}: output length");
    let int8 = n_tok <= fish_vk::MATVEC_MAX_TOKENS && gpu.gpu().int8_matvec(ty);
    let (x, step) = if int8 {
        let (xq, scales) = fish_vk::int8_activations(x);
        (xq, scales.into_iter().fold(0f32, f32::max))
    } else {
        (x.to_vec(), 0.0)
    };
    for (o, row) in w.chunks_exact(n_in).enumerate() {
        let w_max = row.iter().fold(0f64, |m, v| m.max(f64::from(v.abs())));
        for (t, xt) in x.chunks_exact(n_in).enumerate() {
            let (mut dot, mut mag) = (0f64, 0f64);
            for (a, b) in row.iter().zip(xt) {
                dot += f64::from(*a) * f64::from(*b);
                mag += (f64::from(*a) * f64::from(*b)).abs();
            }
            let bound = 1e-3 * mag / n_out as f64 + w_max * f64::from(step);
            let got = f64::from(y[t * n_out + o]);
            assert!(
                (got - dot).abs() <= bound,
                "{what}: y[t={t}, o={o}] = {got}, expected {dot} (bound {bound:e})"
            );
        }
    }
}

/// Every (mode, source type) pair whose target the device runs.
fn conversions() -> Vec<(RequantMode, GgmlType, RequantTarget)> {
    use GgmlType::*;
    let all = [
        (RequantMode::WideToQ4K, Q5_K),
        (RequantMode::WideToQ4K, Q6_K),
        (RequantMode::WideToQ4K, Q8_0),
        (RequantMode::Mixed, Q6_K),
        (RequantMode::Mixed, Q4_K),
        (RequantMode::AllFq3, Q8_0),
        (RequantMode::AllFq3, Q4_K),
        (RequantMode::AllFq3, F16),
    ];
    all.into_iter()
        .filter_map(|(mode, ty)| {
            let target = mode.target(ty)?;
            device_has(target).then_some((mode, ty, target))
        })
        .collect()
}

#[test]
fn gpu_kernels_match_the_cpu_decode_of_the_same_re_quantised_bytes() {
    let (n_in, n_out) = (512, 37);
    let cases = conversions();
    for target in [RequantTarget::Q4K, RequantTarget::Fq3] {
        assert!(
            cases.iter().any(|c| c.2 == target),
            "the device runs {target:?} kernels, so some mode must convert to it"
        );
    }
    for (mode, ty, target) in cases {
        let Some(gpu) = backend_with(mode) else {
            return;
        };
        let src = matrix(ty, n_in, n_out, 7);
        let w = Weights::new(ty, &src, n_in, n_out).expect("weights");
        let id = gpu.upload("w", w).expect("upload");
        let on_device = gpu.device_handle(id).expect("resident");
        let format = match target {
            RequantTarget::Q4K => fish_vk::WeightFormat::Ggml(GgmlType::Q4_K),
            RequantTarget::Fq3 => fish_vk::WeightFormat::Fq3,
        };
        assert_eq!(on_device.ty(), format, "{mode:?} {ty:?}");
        let requantized = requantize(ty, &src, n_in, n_out, target).expect("requantize");
        let decoded = decode_target(target, &requantized.bytes, n_in);
        for n_tok in [1, 3, 37] {
            let x = values(n_in * n_tok, 100 + n_tok as u64);
            let y = gpu.matmul(id, &x, n_tok).expect("matmul");
            let what = format!("{mode:?} {ty:?} n_tok {n_tok}");
            check_against_decoded(&gpu, format, &decoded, n_in, &x, n_tok, &y, &what);
        }
        gpu.free(id);
        assert_eq!(gpu.gpu().validation_messages(), 0, "{mode:?} {ty:?}");
    }
}

#[test]
fn the_reported_error_is_the_relative_rms_of_the_device_weights() {
    let Some(gpu) = backend_with(RequantMode::WideToQ4K) else {
        return;
    };
    let (n_in, n_out) = (768, 20);
    for ty in [GgmlType::Q6_K, GgmlType::Q8_0] {
        let src = matrix(ty, n_in, n_out, 11);
        let id = gpu
            .upload(
                "blk.0.ffn_down.weight",
                Weights::new(ty, &src, n_in, n_out).unwrap(),
            )
            .expect("upload");
        let report = gpu.requant_report();
        let record = report.last().expect("a record");
        let RequantOutcome::Converted { to, bytes, rel_rms } = record.outcome else {
            panic!("{ty:?} was not converted: {}", record.line());
        };
        assert_eq!(to, RequantTarget::Q4K);
        assert_eq!(bytes as usize, n_out * n_in / 256 * 144);
        let original = decode(ty, &src, n_in);
        let requantized = requantize(ty, &src, n_in, n_out, to).expect("requantize");
        let device = decode_target(to, &requantized.bytes, n_in);
        let (mut err, mut energy) = (0f64, 0f64);
        for (a, b) in original.iter().zip(&device) {
            err += f64::from(a - b).powi(2);
            energy += f64::from(*a).powi(2);
        }
        let expected = (err / energy).sqrt();
        assert!(
            (rel_rms - expected).abs() <= 1e-4 * expected,
            "{ty:?}: reported {rel_rms}, measured {expected}"
        );
        // 4 bits cost a few percent on these values; 0 would mean nothing was converted.
        assert!((0.01..0.15).contains(&rel_rms), "{ty:?}: {rel_rms}");
        assert!(record.line().contains("rel RMS"), "{}", record.line());
        gpu.free(id);
    }
    assert!(
        gpu.requant_report().is_empty(),
        "freed tensors leave the report"
    );
}

#[test]
fn re_quantised_copies_take_less_device_memory() {
    let (n_in, n_out) = (1536, 64);
    let src = matrix(GgmlType::Q6_K, n_in, n_out, 3);
    let mut resident = Vec::new();
    for mode in [RequantMode::Off, RequantMode::WideToQ4K] {
        let Some(gpu) = backend_with(mode) else {
            return;
        };
        let before = gpu.bytes_resident();
        let w = Weights::new(GgmlType::Q6_K, &src, n_in, n_out).unwrap();
        let id = gpu.upload("w", w).expect("upload");
        resident.push(gpu.bytes_resident() - before);
        gpu.free(id);
    }
    // Q4_K holds 256 values in 144 bytes, Q6_K in 210.
    let ratio = resident[1] as f64 / resident[0] as f64;
    assert!((0.6..0.75).contains(&ratio), "{resident:?}");
}

#[test]
fn partial_rows_and_missing_kernels_keep_their_type_and_are_counted() {
    let Some(gpu) = backend_with(RequantMode::WideToQ4K) else {
        return;
    };
    // 576-wide rows (SmolLM2's) cannot hold 256-value blocks.
    let narrow = matrix(GgmlType::Q8_0, 576, 8, 5);
    let a = gpu
        .upload(
            "narrow",
            Weights::new(GgmlType::Q8_0, &narrow, 576, 8).unwrap(),
        )
        .expect("upload");
    assert_eq!(gpu.device_handle(a).unwrap().ty(), GgmlType::Q8_0);
    gpu.set_requant(RequantMode::Mixed);
    let q4k = matrix(GgmlType::Q4_K, 512, 8, 6);
    let b = gpu
        .upload("q4k", Weights::new(GgmlType::Q4_K, &q4k, 512, 8).unwrap())
        .expect("upload");
    let line = gpu.describe();
    assert!(
        line.contains("1 x Q8_0 kept (rows not a multiple of 256)"),
        "{line}"
    );
    if device_has(RequantTarget::Fq3) {
        assert!(line.contains("1 x Q4_K->FQ3"), "{line}");
    } else {
        assert!(line.contains("1 x Q4_K kept (no FQ3 kernel)"), "{line}");
        assert_eq!(gpu.device_handle(b).unwrap().ty(), GgmlType::Q4_K);
    }
    // Types the mode does not name are left alone and not counted.
    let q8 = matrix(GgmlType::Q8_0, 512, 8, 8);
    gpu.upload("q8", Weights::new(GgmlType::Q8_0, &q8, 512, 8).unwrap())
        .expect("upload");
    assert_eq!(gpu.requant_report().len(), 2);
}

/// Qwen2.5-Coder-1.5B Q4_K_M (scripts/fetch-model.sh qwen15): run when
/// present, required when listed in FISH_TEST_MODELS.
fn qwen15() -> Option<fish_gguf::Gguf> {
    let file = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf";
    let listed =
        std::env::var("FISH_TEST_MODELS").is_ok_and(|v| v.split(' ').any(|m| m == "qwen15"));
    let path = common::model_path(file);
    assert!(path.exists() || !listed, "{file} is listed but missing");
    if !path.exists() {
        eprintln!("skipping: {file} is not fetched");
        return None;
    }
    Some(fish_gguf::Gguf::open(path).expect("open"))
}

/// Seed 000's measured errors on blk.0 (Q6_K -> Q4_K 7.3-7.5%, Q4_K -> FQ3
/// 13.9-14.6%), with room for single tensors.
fn error_ceiling(target: RequantTarget) -> f64 {
    match target {
        RequantTarget::Q4K => 0.08,
        RequantTarget::Fq3 => 0.16,
    }
}

#[test]
fn qwen15_blk0_projections_in_mode_3_report_their_error_and_match_the_cpu() {
    let Some(g) = qwen15() else {
        return;
    };
    let Some(gpu) = backend_with(RequantMode::Mixed) else {
        return;
    };
    let names = [
        "attn_q",
        "attn_k",
        "attn_v",
        "attn_output",
        "ffn_gate",
        "ffn_up",
        "ffn_down",
    ];
    for name in names {
        let info = g.tensor(&format!("blk.0.{name}.weight")).expect("tensor");
        let (n_in, n_out) = (info.dims[0] as usize, info.dims[1] as usize);
        let data = g.tensor_data(info);
        let id = gpu
            .upload(
                &info.name,
                Weights::new(info.ty, data, n_in, n_out).unwrap(),
            )
            .expect("upload");
        let report = gpu.requant_report();
        let record = report.last().expect("mode 3 names Q4_K and Q6_K");
        eprintln!("{}", record.line());
        let weights = match record.outcome {
            RequantOutcome::Converted { to, rel_rms, .. } => {
                assert!(rel_rms <= error_ceiling(to), "{}", record.line());
                let r = requantize(info.ty, data, n_in, n_out, to).expect("requantize");
                decode_target(to, &r.bytes, n_in)
            }
            RequantOutcome::Kept(_) => decode(info.ty, data, n_in),
        };
        for n_tok in [1, 3] {
            let x = values(n_in * n_tok, 200 + n_tok as u64);
            let y = gpu.matmul(id, &x, n_tok).expect("matmul");
            check_against_decoded(
                &gpu,
                gpu.device_handle(id).expect("resident").ty(),
                &weights,
                n_in,
                &x,
                n_tok,
                &y,
                &format!("{name} n_tok {n_tok}"),
            );
        }
        gpu.free(id);
    }
    assert_eq!(gpu.gpu().validation_messages(), 0);
}
