//! Packed int8 dot products (VK_KHR_shader_integer_dot_product): the
//! int8-activation matvec (shaders/matvec_i8.comp) needs them. Which matvec
//! a decode uses is chosen here too, from what the device reports and
//! `FISH_VK_INT8`: span decode steps, which quantise each matvec input once
//! (in the norm, the attention or the act*mul dispatch before it), take the
//! int8 matvec wherever the device accelerates the products; lone matvecs
//! (stage 1, a span's output projection), which would quantise x in every
//! workgroup, keep the float kernel unless `FISH_VK_INT8` asks.

use crate::instance::has_extension;
use crate::weight_format::WeightFormat;
use ash::khr;
use ash::vk;
use fish_gguf::GgmlType;

/// What the device offers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Int8Dot {
    #[default]
    Absent,
    /// Supported, but the driver says mixed-signedness packed products are
    /// not accelerated (software implementations such as lavapipe).
    Emulated,
    Accelerated,
}

/// Whether the matvec uses int8 activations when the type allows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Int8Policy {
    /// `FISH_VK_INT8=0`: always the float matvec.
    Never,
    /// Default: where the device accelerates the packed products, span
    /// decode steps (and verification-sized chunks) on every quantised type
    /// (on the H200 llama-8b decode +27%, llama-1b +5-16%:
    /// docs/BENCHMARKS.md); lone matvecs keep the float kernel.
    #[default]
    SpanSteps,
    /// `FISH_VK_INT8=auto`: as the default, and lone matvecs too on the
    /// types whose per-workgroup kernel measured faster than the float one
    /// (`INT8_FASTER`).
    WhenAccelerated,
    /// `FISH_VK_INT8=1`: every quantised type, whenever the device has the
    /// products (tests on lavapipe, measurements).
    WhenSupported,
}

/// The types whose int8 matvec measured faster. On the H200 the kernel
/// streams Q8_0 at up to 3.4 TiB/s against the float kernel's 3.1, but
/// the nibble types run slower than their float kernel (Q4_K 1.4-1.9 TiB/s
/// against 1.7, Q6_K 1.7-2.0 against 2.4): quantising x in every workgroup
/// costs them more than the packed products save (docs/BENCHMARKS.md).
const INT8_FASTER: [WeightFormat; 1] = [WeightFormat::Ggml(GgmlType::Q8_0)];

impl Int8Policy {
    pub fn from_env() -> Int8Policy {
        match std::env::var("FISH_VK_INT8").as_deref() {
            Ok("1") => Int8Policy::WhenSupported,
            Ok("0") => Int8Policy::Never,
            Ok("auto") => Int8Policy::WhenAccelerated,
            _ => Int8Policy::SpanSteps,
        }
    }

    /// Whether a lone matvec (which quantises x in every workgroup) on
    /// weights of type `ty` uses int8 activations on a device with `dot`.
    pub fn allows(self, dot: Int8Dot, ty: WeightFormat) -> bool {
        match self {
            Int8Policy::Never | Int8Policy::SpanSteps => false,
            Int8Policy::WhenAccelerated => dot == Int8Dot::Accelerated && INT8_FASTER.contains(&ty),
            Int8Policy::WhenSupported => dot != Int8Dot::Absent && quantised(ty),
        }
    }

    /// Whether span decode steps (inputs quantised once, before the
    /// matvec) use int8 activations on weights of type `ty`.
    pub fn allows_prequantised(self, dot: Int8Dot, ty: WeightFormat) -> bool {
        match self {
            Int8Policy::Never => false,
            Int8Policy::SpanSteps | Int8Policy::WhenAccelerated => {
                dot == Int8Dot::Accelerated && quantised(ty)
            }
            Int8Policy::WhenSupported => dot != Int8Dot::Absent && quantised(ty),
        }
    }
}

fn quantised(ty: WeightFormat) -> bool {
    !matches!(ty, WeightFormat::Ggml(GgmlType::F32 | GgmlType::F16))
}

/// Activation values per int8 scale in the int8 matvec.
pub const INT8_BLOCK: usize = 32;

/// The activations as the int8 matvec sees them (the CPU model of
/// shaders/matvec_i8.comp, for checking its results): per block of
/// `INT8_BLOCK` values, d = max|x| / 127 and quants round(x * 127 / max|x|).
/// Returns the dequantised values (d * quant) and each block's d.
pub fn int8_activations(x: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let mut out = Vec::with_capacity(x.len());
    let mut scales = Vec::with_capacity(x.len().div_ceil(INT8_BLOCK));
    for block in x.chunks(INT8_BLOCK) {
        let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if amax > 0.0 { 127.0 / amax } else { 0.0 };
        out.extend(block.iter().map(|v| (v * id).round() * d));
        scales.push(d);
    }
    (out, scales)
}

/// Bytes one token of pre-quantised activations takes (shaders/int8_acts.glsl:
/// the quants, then a scale per 32 and a sum per 16 values, each part
/// padded to 16 bytes); `n` is a multiple of 32.
pub(crate) fn int8_token_bytes(n: usize) -> usize {
    16 * (n / 16 + (n / 32).div_ceil(4) + (n / 16).div_ceil(4))
}

/// Queries the feature and its acceleration; `exts` are the device's extensions.
///
/// # Safety
/// `physical` must come from `instance`.
pub(crate) unsafe fn probe(
    instance: &ash::Instance,
    physical: vk::PhysicalDevice,
    exts: &[vk::ExtensionProperties],
) -> Int8Dot {
    if !has_extension(exts, khr::shader_integer_dot_product::NAME) {
        return Int8Dot::Absent;
    }
    let mut feature = vk::PhysicalDeviceShaderIntegerDotProductFeatures::default();
    let mut features = vk::PhysicalDeviceFeatures2::default().push_next(&mut feature);
    // SAFETY: a 1.1 query with a struct of an extension the device lists.
    unsafe { instance.get_physical_device_features2(physical, &mut features) };
    if feature.shader_integer_dot_product == vk::FALSE {
        return Int8Dot::Absent;
    }
    let mut props = vk::PhysicalDeviceShaderIntegerDotProductProperties::default();
    let mut props2 = vk::PhysicalDeviceProperties2::default().push_next(&mut props);
    // SAFETY: as above.
    unsafe { instance.get_physical_device_properties2(physical, &mut props2) };
    if props.integer_dot_product4x8_bit_packed_mixed_signedness_accelerated == vk::TRUE {
        Int8Dot::Accelerated
    } else {
        Int8Dot::Emulated
    }
}

/// The feature struct and extension name to enable at device creation.
pub(crate) struct Int8DotFeatures {
    feature: vk::PhysicalDeviceShaderIntegerDotProductFeatures<'static>,
}

impl Int8DotFeatures {
    pub fn enabled() -> Int8DotFeatures {
        Int8DotFeatures {
            feature: vk::PhysicalDeviceShaderIntegerDotProductFeatures::default()
                .shader_integer_dot_product(true),
        }
    }

    pub fn extension_name() -> *const std::ffi::c_char {
        khr::shader_integer_dot_product::NAME.as_ptr()
    }

    /// Chains the feature into a device create info.
    pub fn chain<'a>(&'a mut self, info: vk::DeviceCreateInfo<'a>) -> vk::DeviceCreateInfo<'a> {
        info.push_next(&mut self.feature)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn activations_keep_their_block_maximum_and_sign() {
        let x: Vec<f32> = (0..64).map(|i| (i as f32 - 40.0) * 0.05).collect();
        let (q, d) = int8_activations(&x);
        assert_eq!(d.len(), 2);
        assert!((d[0] - 2.0 / 127.0).abs() < 1e-7, "block 0 max |x| is 2.0");
        assert!(
            (d[1] - 1.15 / 127.0).abs() < 1e-7,
            "block 1 max |x| is 1.15"
        );
        assert_eq!(q[0], x[0], "the block maximum is exact");
        for (a, b) in x.iter().zip(&q) {
            assert!((a - b).abs() <= d[0].max(d[1]) / 2.0 + 1e-6);
            assert!(a * b >= 0.0, "sign kept: {a} -> {b}");
        }
        let (zeros, dz) = int8_activations(&[0.0; 32]);
        assert_eq!((zeros, dz), (vec![0.0; 32], vec![0.0]));
    }

    #[test]
    fn token_bytes_pad_each_part_to_16_bytes() {
        // 576 values: 576 quant bytes, 18 scales (5 words), 36 sums (9 words).
        assert_eq!(int8_token_bytes(576), 576 + 80 + 144);
        // 4096: 4096 + 128 * 4 + 256 * 4, already whole words.
        assert_eq!(int8_token_bytes(4096), 4096 + 512 + 1024);
    }

    #[test]
    fn policy_follows_the_device_the_type_and_the_switch() {
        use Int8Dot::*;
        let (q8, q4k, f16) = (
            WeightFormat::Ggml(GgmlType::Q8_0),
            WeightFormat::Ggml(GgmlType::Q4_K),
            WeightFormat::Ggml(GgmlType::F16),
        );
        for dot in [Absent, Emulated, Accelerated] {
            for ty in [q8, q4k, f16, WeightFormat::Fq3] {
                assert!(!Int8Policy::Never.allows(dot, ty));
                assert!(!Int8Policy::SpanSteps.allows(dot, ty));
                assert_eq!(
                    Int8Policy::WhenSupported.allows(dot, ty),
                    dot != Absent && ty != f16
                );
            }
            assert_eq!(
                Int8Policy::WhenAccelerated.allows(dot, q8),
                dot == Accelerated
            );
            assert!(!Int8Policy::WhenAccelerated.allows(dot, q4k));
            // Span decode steps: every quantised type where accelerated.
            for ty in [q8, q4k, f16, WeightFormat::Fq3] {
                assert!(!Int8Policy::Never.allows_prequantised(dot, ty));
                for policy in [Int8Policy::SpanSteps, Int8Policy::WhenAccelerated] {
                    assert_eq!(
                        policy.allows_prequantised(dot, ty),
                        dot == Accelerated && ty != f16
                    );
                }
                assert_eq!(
                    Int8Policy::WhenSupported.allows_prequantised(dot, ty),
                    dot != Absent && ty != f16
                );
            }
        }
        assert_eq!(Int8Policy::default(), Int8Policy::SpanSteps);
    }
}
