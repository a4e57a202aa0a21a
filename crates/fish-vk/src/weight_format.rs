//! The storage format of a weight matrix handed to `Gpu::upload`: a GGUF
//! type, or FQ3, the project's own 3-bit format (fish-quant's `fq3` module,
//! docs/QUANT.md) that re-quantised weights use and that has no GGUF type id.

use fish_gguf::GgmlType;

/// Values per FQ3 block (fish_quant::fq3::FQ3_BLOCK_VALUES).
pub const FQ3_BLOCK_VALUES: usize = 256;
/// Bytes per FQ3 block (fish_quant::fq3::FQ3_BLOCK_BYTES).
pub const FQ3_BLOCK_BYTES: usize = 112;

/// How the bytes of an uploaded weight matrix encode its values.
///
/// A `GgmlType` converts into it, so `gpu.upload(GgmlType::Q4_K, ...)` and
/// `gpu.upload(WeightFormat::Fq3, ...)` are the same call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightFormat {
    /// Blocks of a GGUF tensor type, as stored in a GGUF file.
    Ggml(GgmlType),
    /// FQ3 blocks exactly as fish-quant writes them (112 bytes per 256 values).
    Fq3,
}

impl WeightFormat {
    /// The name of the type, e.g. `Q4_K` or `FQ3`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Ggml(ty) => ty.name(),
            Self::Fq3 => "FQ3",
        }
    }

    /// Number of values in one block.
    pub fn block_size(self) -> usize {
        match self {
            Self::Ggml(ty) => ty.block_size(),
            Self::Fq3 => FQ3_BLOCK_VALUES,
        }
    }

    /// Bytes occupied by one block.
    pub fn block_bytes(self) -> usize {
        match self {
            Self::Ggml(ty) => ty.block_bytes(),
            Self::Fq3 => FQ3_BLOCK_BYTES,
        }
    }

    /// The GGUF type, when the format is one.
    pub fn ggml(self) -> Option<GgmlType> {
        match self {
            Self::Ggml(ty) => Some(ty),
            Self::Fq3 => None,
        }
    }
}

impl From<GgmlType> for WeightFormat {
    fn from(ty: GgmlType) -> Self {
        Self::Ggml(ty)
    }
}

impl PartialEq<GgmlType> for WeightFormat {
    fn eq(&self, other: &GgmlType) -> bool {
        *self == Self::Ggml(*other)
    }
}

impl std::fmt::Display for WeightFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
