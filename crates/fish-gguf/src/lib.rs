//! fish-gguf: the GGUF v2/v3 container format.
//!
//! [`Gguf::open`] maps a file and validates everything the rest of the engine
//! will rely on: header, metadata (all 13 value types, nested arrays), tensor
//! infos and data bounds. After that, metadata and tensor bytes are served as
//! zero-copy views. [`GgufWriter`] writes files that this reader and gguf-py
//! both read back.
//!
//! Invariant: no allocation is ever sized by a count read from a file before
//! that count has been checked against the bytes that remain.

mod arch;
mod cursor;
mod error;
mod ggml_type;
mod reader;
mod tensor_info;
mod value;
mod writer;

pub use cursor::MAX_ARRAY_NESTING;
pub use error::{GgufError, Result};
pub use ggml_type::GgmlType;
pub use reader::{Gguf, DEFAULT_ALIGNMENT};
pub use tensor_info::{TensorInfo, MAX_DIMS};
pub use value::{ArrayIter, ArrayRef, Value, ValueRef, ValueType};
pub use writer::{GgufWriter, TensorSpec};
