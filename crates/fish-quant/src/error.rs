//! Typed errors for every public entry point of the crate.

use fish_gguf::GgmlType;
use thiserror::Error;

/// Why a quantisation, dequantisation or matmul request was refused.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum QuantError {
    /// The type has no implementation for the requested operation.
    #[error("{0} is not supported for this operation")]
    Unsupported(GgmlType),
    /// A value count is not a whole number of blocks of the type.
    #[error("{n_values} values are not a whole number of {ty} blocks ({block} values each)")]
    PartialBlock {
        ty: GgmlType,
        n_values: usize,
        block: usize,
    },
    /// A buffer does not have the length its companion arguments imply.
    #[error("{what}: expected {expected} elements, got {got}")]
    BadLength {
        what: &'static str,
        expected: usize,
        got: usize,
    },
    /// Quantised activations were made for another dot-product type or shape.
    #[error("activations are {found} with {found_n_in} inputs, the weights need {expected} with {expected_n_in}")]
    ActsMismatch {
        expected: GgmlType,
        found: GgmlType,
        expected_n_in: usize,
        found_n_in: usize,
    },
    /// A size computation overflowed `usize`.
    #[error("size overflow for {0}")]
    Overflow(&'static str),
}
