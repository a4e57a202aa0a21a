//! Online re-quantisation (FISH_GPU_REQUANT, docs/QUANT.md): which weights
//! get a smaller device copy, and the conversion itself. The GGUF bytes and
//! the CPU path never change; only what `upload` hands to the device does.

use fish_gguf::GgmlType;
use fish_quant::requant::RequantTarget;

/// Both targets (Q4_K and FQ3) have blocks of 256 values, so only rows of a
/// multiple of 256 values can be re-quantised.
pub const REQUANT_ROW_MULTIPLE: usize = 256;

/// What `FISH_GPU_REQUANT` (or `--requant`) asks for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RequantMode {
    /// 0: the device gets the GGUF types.
    #[default]
    Off,
    /// 1: every supported weight becomes FQ3.
    AllFq3,
    /// 2: Q5_K, Q6_K and Q8_0 become Q4_K.
    WideToQ4K,
    /// 3: Q4_K becomes FQ3 and Q6_K becomes Q4_K.
    Mixed,
}

impl RequantMode {
    /// The mode of a level 0..=3.
    pub fn from_level(level: u8) -> Option<RequantMode> {
        Some(match level {
            0 => Self::Off,
            1 => Self::AllFq3,
            2 => Self::WideToQ4K,
            3 => Self::Mixed,
            _ => return None,
        })
    }

    pub fn level(self) -> u8 {
        match self {
            Self::Off => 0,
            Self::AllFq3 => 1,
            Self::WideToQ4K => 2,
            Self::Mixed => 3,
        }
    }

    /// `FISH_GPU_REQUANT`; unset, empty or not a level 0..=3 is off.
    pub fn from_env() -> RequantMode {
        std::env::var("FISH_GPU_REQUANT")
            .ok()
            .and_then(|v| v.trim().parse::<u8>().ok())
            .and_then(Self::from_level)
            .unwrap_or_default()
    }

    /// The format this mode turns weights of type `ty` into, if any.
    pub fn target(self, ty: GgmlType) -> Option<RequantTarget> {
        use GgmlType::*;
        match (self, ty) {
            (Self::Off, _) => None,
            (Self::AllFq3, _) if fish_quant::is_supported(ty) => Some(RequantTarget::Fq3),
            (Self::WideToQ4K, Q5_K | Q6_K | Q8_0) => Some(RequantTarget::Q4K),
            (Self::Mixed, Q4_K) => Some(RequantTarget::Fq3),
            (Self::Mixed, Q6_K) => Some(RequantTarget::Q4K),
            _ => None,
        }
    }
}

/// The name a target has in descriptions (GGUF spelling for Q4_K).
pub fn target_name(target: RequantTarget) -> &'static str {
    match target {
        RequantTarget::Q4K => "Q4_K",
        RequantTarget::Fq3 => "FQ3",
    }
}

/// Why a weight the mode would convert keeps its GGUF type on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KeptReason {
    /// Its rows are not a multiple of 256 values.
    PartialBlocks,
    /// The device has no kernel for the target yet.
    NoKernel(TargetKey),
    /// Decoding the source failed (the bytes are uploaded as they are).
    DecodeFailed,
}

/// `RequantTarget` as an ordered map key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TargetKey {
    Q4K,
    Fq3,
}

impl TargetKey {
    pub fn of(target: RequantTarget) -> TargetKey {
        match target {
            RequantTarget::Q4K => Self::Q4K,
            RequantTarget::Fq3 => Self::Fq3,
        }
    }

    pub fn target(self) -> RequantTarget {
        match self {
            Self::Q4K => RequantTarget::Q4K,
            Self::Fq3 => RequantTarget::Fq3,
        }
    }
}

impl std::fmt::Display for KeptReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::PartialBlocks => write!(f, "rows not a multiple of {REQUANT_ROW_MULTIPLE}"),
            Self::NoKernel(t) => write!(f, "no {} kernel", target_name(t.target())),
            Self::DecodeFailed => write!(f, "decode failed"),
        }
    }
}

/// What happens to one weight at upload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Conversion {
    /// The mode leaves this type alone.
    Untouched,
    /// Re-quantised to the target.
    Convert(RequantTarget),
    /// The mode would convert it, but it keeps its type.
    Kept(KeptReason),
}

/// Decides the conversion of a weight of type `ty` with rows of `n_in`
/// values; `device_has` says whether the device runs a target's kernels.
pub fn plan(
    mode: RequantMode,
    ty: GgmlType,
    n_in: usize,
    device_has: impl Fn(RequantTarget) -> bool,
) -> Conversion {
    let Some(target) = mode.target(ty) else {
        return Conversion::Untouched;
    };
    if n_in == 0 || !n_in.is_multiple_of(REQUANT_ROW_MULTIPLE) {
        return Conversion::Kept(KeptReason::PartialBlocks);
    }
    if !device_has(target) {
        return Conversion::Kept(KeptReason::NoKernel(TargetKey::of(target)));
    }
    Conversion::Convert(target)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_kernels(_: RequantTarget) -> bool {
        true
    }

    #[test]
    fn levels_round_trip_and_reject_others() {
        for level in 0..=3 {
            let mode = RequantMode::from_level(level).expect("valid level");
            assert_eq!(mode.level(), level);
        }
        assert_eq!(RequantMode::from_level(4), None);
    }

    #[test]
    fn each_mode_converts_exactly_its_types() {
        use GgmlType::*;
        let q4k = Some(RequantTarget::Q4K);
        let fq3 = Some(RequantTarget::Fq3);
        let cases = [
            (RequantMode::Off, Q6_K, None),
            (RequantMode::WideToQ4K, Q5_K, q4k),
            (RequantMode::WideToQ4K, Q6_K, q4k),
            (RequantMode::WideToQ4K, Q8_0, q4k),
            (RequantMode::WideToQ4K, Q4_K, None),
            (RequantMode::WideToQ4K, Q4_0, None),
            (RequantMode::Mixed, Q4_K, fq3),
            (RequantMode::Mixed, Q6_K, q4k),
            (RequantMode::Mixed, Q8_0, None),
            (RequantMode::AllFq3, Q4_K, fq3),
            (RequantMode::AllFq3, Q8_0, fq3),
            (RequantMode::AllFq3, F16, fq3),
            (RequantMode::AllFq3, IQ2_XS, None),
        ];
        for (mode, ty, want) in cases {
            assert_eq!(mode.target(ty), want, "{mode:?} {ty:?}");
        }
    }

    #[test]
    fn partial_rows_and_missing_kernels_keep_the_type() {
        let mode = RequantMode::Mixed;
        assert_eq!(
            plan(mode, GgmlType::Q6_K, 576, all_kernels),
            Conversion::Kept(KeptReason::PartialBlocks)
        );
        assert_eq!(
            plan(mode, GgmlType::Q6_K, 1536, all_kernels),
            Conversion::Convert(RequantTarget::Q4K)
        );
        let no_fq3 = |t: RequantTarget| t != RequantTarget::Fq3;
        assert_eq!(
            plan(mode, GgmlType::Q4_K, 1536, no_fq3),
            Conversion::Kept(KeptReason::NoKernel(TargetKey::Fq3))
        );
        assert_eq!(
            plan(mode, GgmlType::Q4_0, 1536, all_kernels),
            Conversion::Untouched
        );
    }
}
