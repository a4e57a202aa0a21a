//! Packed int8 dot products (VK_KHR_shader_integer_dot_product): the
//! int8-activation matvec (shaders/matvec_i8.comp) needs them. Which matvec
//! a decode uses is chosen here too, from what the device reports and
//! `FISH_VK_INT8`: wherever the device accelerates the products, span
//! decode steps quantise each matvec input once (in the norm, the attention
//! or the act*mul dispatch before it) and lone matvecs (stage 1) upload x
//! quantised by the host (`quantise_activations`); the kernel that
//! quantises x in every workgroup (`Kernel::MatvecInt8`) runs only when
//! asked for by name.

use crate::instance::has_extension;
use crate::thread_override::with_override;
use crate::weight_format::WeightFormat;
use ash::khr;
use ash::vk;
use fish_gguf::GgmlType;
use std::cell::Cell;

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
    /// Default (also `FISH_VK_INT8=auto`): every quantised type where the
    /// device accelerates the packed products. Span decode steps (and
    /// verification-sized chunks) quantise each matvec input once, in the
    /// stage before it (on the H200 llama-8b decode +27%, llama-1b +5-16%:
    /// docs/BENCHMARKS.md); lone matvecs (`Kernel::Auto` up to
    /// MATVEC_MAX_TOKENS tokens) take x quantised by the host
    /// (`Kernel::MatvecInt8Prequantised`).
    #[default]
    Accelerated,
    /// `FISH_VK_INT8=1`: every quantised type, whenever the device has the
    /// products (tests on lavapipe, measurements).
    WhenSupported,
}

thread_local! {
    /// Tests turn int8 activations off for this thread's spans and calls.
    static INT8_OVERRIDE: Cell<Option<bool>> = const { Cell::new(None) };
}

/// This thread's override of the policy (`Gpu::with_int8_matvecs`).
pub(crate) fn int8_override() -> Option<bool> {
    INT8_OVERRIDE.with(Cell::get)
}

/// Runs `f` with this thread's matvecs on int8 activations as the policy
/// says (`true`) or never (`false`).
pub(crate) fn with_int8_override<R>(on: bool, f: impl FnOnce() -> R) -> R {
    with_override(&INT8_OVERRIDE, on, f)
}

impl Int8Policy {
    pub fn from_env() -> Int8Policy {
        match std::env::var("FISH_VK_INT8").as_deref() {
            Ok("1") => Int8Policy::WhenSupported,
            Ok("0") => Int8Policy::Never,
            _ => Int8Policy::Accelerated,
        }
    }

    /// Whether matvecs on weights of type `ty` take int8 activations on a
    /// device with `dot`.
    pub fn allows(self, dot: Int8Dot, ty: WeightFormat) -> bool {
        match self {
            Int8Policy::Never => false,
            Int8Policy::Accelerated => dot == Int8Dot::Accelerated && quantised(ty),
            Int8Policy::WhenSupported => dot != Int8Dot::Absent && quantised(ty),
        }
    }
}

fn quantised(ty: WeightFormat) -> bool {
    !matches!(ty, WeightFormat::Ggml(GgmlType::F32 | GgmlType::F16))
}

/// y (|y| <= 127 up to rounding) rounded to the nearest integer, ties to
/// even, clamped to the int8 quants' range. Adding 1.5 * 2^23 rounds y
/// into the low bits of the sum's mantissa, which are read as an integer:
/// no library call (`f32::round` is one on baseline x86-64) and no
/// saturating conversion, so the block loops vectorise (host quantisation
/// with `round` cost llama-8b stage-1 decode a third of its speed). NaN
/// gives some value in range.
fn quant(y: f32) -> i32 {
    const MAGIC: f32 = 12_582_912.0;
    ((y + MAGIC).to_bits() as i32 - MAGIC.to_bits() as i32).clamp(-127, 127)
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
        out.extend(block.iter().map(|v| quant(v * id) as f32 * d));
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

/// Tokens of `n` values (`n` a multiple of INT8_BLOCK) quantised on the host
/// into the layout of shaders/int8_acts.glsl, which the span's stages write
/// on the device: per token the quants (one signed byte per value), d =
/// max|x| / 127 per 32 values, then d * (sum of quants) per 16 values, each
/// part padded to 16 bytes. Lone matvecs (`Kernel::MatvecInt8Prequantised`) upload
/// it in place of x; the quants are those of `int8_activations`.
pub(crate) fn quantise_activations(x: &[f32], n: usize) -> Vec<u8> {
    let token = int8_token_bytes(n);
    let scale_bytes = 16 * (n / INT8_BLOCK).div_ceil(4);
    let mut out = vec![0u8; x.len() / n.max(1) * token];
    for (src, dst) in x.chunks_exact(n).zip(out.chunks_exact_mut(token)) {
        let (quants, rest) = dst.split_at_mut(n);
        let (scales, sums) = rest.split_at_mut(scale_bytes);
        for (b, block) in src.chunks_exact(INT8_BLOCK).enumerate() {
            // Fixed-size arrays, so that the loops vectorise.
            let block: &[f32; INT8_BLOCK] = block.try_into().expect("whole block");
            // Compare-and-select lanes (f32::max must order NaN, which keeps
            // the compiler from vectorising it).
            let mut lanes = [0f32; 8];
            for eight in block.chunks_exact(8) {
                for (m, v) in lanes.iter_mut().zip(eight) {
                    let a = v.abs();
                    *m = if a > *m { a } else { *m };
                }
            }
            let amax = lanes.iter().fold(0f32, |m, &v| if v > m { v } else { m });
            let d = amax / 127.0;
            let id = if amax > 0.0 { 127.0 / amax } else { 0.0 };
            let mut q = [0i32; INT8_BLOCK];
            for (q, v) in q.iter_mut().zip(block) {
                *q = quant(v * id);
            }
            for (dst, q) in quants[INT8_BLOCK * b..INT8_BLOCK * (b + 1)]
                .iter_mut()
                .zip(q)
            {
                *dst = q as i8 as u8;
            }
            scales[4 * b..4 * b + 4].copy_from_slice(&d.to_le_bytes());
            for (h, half) in q.chunks_exact(16).enumerate() {
                let sum: i32 = half.iter().sum();
                let at = 4 * (2 * b + h);
                sums[at..at + 4].copy_from_slice(&(d * sum as f32).to_le_bytes());
            }
        }
    }
    out
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
    fn host_quantised_tokens_follow_the_shader_layout() {
        let n = 64;
        let x: Vec<f32> = (0..2 * n)
            .map(|i| ((i * 37 % 29) as f32 - 14.0) * 0.1)
            .collect();
        let bytes = quantise_activations(&x, n);
        let token = int8_token_bytes(n);
        assert_eq!(bytes.len(), 2 * token);
        let (deq, scales) = int8_activations(&x);
        let f32_at = |t: usize, at: usize| {
            let o = t * token + at;
            f32::from_le_bytes(bytes[o..o + 4].try_into().unwrap())
        };
        for t in 0..2 {
            for i in 0..n {
                let q = bytes[t * token + i] as i8;
                let d = scales[t * 2 + i / 32];
                assert_eq!(f32::from(q) * d, deq[t * n + i], "token {t} value {i}");
            }
            // Scales start after the quants; sums after the scales' 16 bytes.
            for b in 0..2 {
                assert_eq!(f32_at(t, n + 4 * b), scales[t * 2 + b]);
            }
            for h in 0..4 {
                let sum: i32 = (0..16)
                    .map(|i| i32::from(bytes[t * token + 16 * h + i] as i8))
                    .sum();
                assert_eq!(
                    f32_at(t, n + 16 + 4 * h),
                    scales[t * 2 + h / 2] * sum as f32
                );
            }
        }
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
                assert_eq!(
                    Int8Policy::Accelerated.allows(dot, ty),
                    dot == Accelerated && ty != f16
                );
                assert_eq!(
                    Int8Policy::WhenSupported.allows(dot, ty),
                    dot != Absent && ty != f16
                );
            }
        }
        assert_eq!(Int8Policy::default(), Int8Policy::Accelerated);
    }
}
