//! The reader's typed errors: each names the problem and the byte offset where it was found.

use thiserror::Error;

/// Why a GGUF file was rejected.
#[derive(Debug, Error)]
pub enum GgufError {
    #[error("cannot open {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("file truncated at byte {offset}: needed {needed} more bytes for {what}")]
    Truncated {
        offset: u64,
        needed: u64,
        what: &'static str,
    },
    #[error("not a GGUF file: bad magic {found:02x?} at byte 0")]
    BadMagic { found: [u8; 4] },
    #[error("unsupported GGUF version {version} at byte 4 (supported: 2, 3, little-endian)")]
    UnsupportedVersion { version: u32 },
    #[error("{what} count {count} at byte {offset} cannot fit in the {remaining} bytes left in the file")]
    CountTooLarge {
        what: &'static str,
        count: u64,
        offset: u64,
        remaining: u64,
    },
    #[error("string length {len} at byte {offset} runs past the end of the file")]
    StringTooLong { len: u64, offset: u64 },
    #[error("string at byte {offset} is not valid UTF-8")]
    InvalidUtf8 { offset: u64 },
    #[error("unknown metadata value type {ty} at byte {offset}")]
    UnknownValueType { ty: u32, offset: u64 },
    #[error("metadata arrays nested deeper than {max} at byte {offset}")]
    NestingTooDeep { max: usize, offset: u64 },
    #[error("duplicate metadata key {key:?} at byte {offset}")]
    DuplicateKey { key: String, offset: u64 },
    #[error("metadata key {key:?} at byte {offset} has the wrong type: expected {expected}, found {found}")]
    WrongValueType {
        key: String,
        expected: &'static str,
        found: &'static str,
        offset: u64,
    },
    #[error(
        "invalid general.alignment {alignment} at byte {offset}: must be a non-zero power of two"
    )]
    BadAlignment { alignment: u64, offset: u64 },
    #[error("tensor {name:?} at byte {offset}: unknown tensor type {ty}")]
    UnknownTensorType { name: String, ty: u32, offset: u64 },
    #[error("tensor {name:?} at byte {offset}: {n_dims} dimensions (at most 4 are allowed)")]
    TooManyDims {
        name: String,
        n_dims: u32,
        offset: u64,
    },
    #[error("tensor {name:?} at byte {offset}: dimension {index} is zero")]
    ZeroDim {
        name: String,
        index: usize,
        offset: u64,
    },
    #[error("tensor {name:?} at byte {offset}: element count overflows")]
    DimOverflow { name: String, offset: u64 },
    #[error("tensor {name:?} at byte {offset}: rows of {n_values} values are not a whole number of {ty} blocks of {block}")]
    PartialBlock {
        name: String,
        ty: &'static str,
        n_values: u64,
        block: usize,
        offset: u64,
    },
    #[error("tensor {name:?} at byte {offset}: {ty} data of {n_values} values overflows 64 bits")]
    DataSizeOverflow {
        name: String,
        ty: &'static str,
        n_values: u64,
        offset: u64,
    },
    #[error("duplicate tensor name {name:?} at byte {offset}")]
    DuplicateTensor { name: String, offset: u64 },
    #[error("tensor {name:?} at byte {offset}: data offset {data_offset} is not a multiple of the alignment {alignment}")]
    MisalignedTensor {
        name: String,
        data_offset: u64,
        alignment: u64,
        offset: u64,
    },
    #[error("tensor {name:?} at byte {offset}: data [{start}, {end}) lies outside the file ({file_len} bytes)")]
    TensorOutOfBounds {
        name: String,
        start: u64,
        end: u64,
        file_len: u64,
        offset: u64,
    },
    #[error("tensor {name:?} at byte {offset}: data [{start}, {end}) overlaps tensor {other:?}")]
    TensorOverlap {
        name: String,
        other: String,
        start: u64,
        end: u64,
        offset: u64,
    },
    #[error("missing metadata key {key:?}")]
    MissingKey { key: String },
}

impl GgufError {
    /// The absolute file offset of the problem; `None` for errors that are
    /// not about a place in the file (I/O, a key the caller asked for).
    pub fn offset(&self) -> Option<u64> {
        use GgufError::*;
        match self {
            Io { .. } | MissingKey { .. } => None,
            BadMagic { .. } => Some(0),
            UnsupportedVersion { .. } => Some(4),
            Truncated { offset, .. }
            | CountTooLarge { offset, .. }
            | StringTooLong { offset, .. }
            | InvalidUtf8 { offset }
            | UnknownValueType { offset, .. }
            | NestingTooDeep { offset, .. }
            | DuplicateKey { offset, .. }
            | WrongValueType { offset, .. }
            | BadAlignment { offset, .. }
            | UnknownTensorType { offset, .. }
            | TooManyDims { offset, .. }
            | ZeroDim { offset, .. }
            | DimOverflow { offset, .. }
            | PartialBlock { offset, .. }
            | DataSizeOverflow { offset, .. }
            | DuplicateTensor { offset, .. }
            | MisalignedTensor { offset, .. }
            | TensorOutOfBounds { offset, .. }
            | TensorOverlap { offset, .. } => Some(*offset),
        }
    }
}

pub type Result<T> = std::result::Result<T, GgufError>;
