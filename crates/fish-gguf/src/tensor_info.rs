//! Tensor infos: one header entry per tensor (name, dims, type, data offset),
//! parsed and checked on its own; bounds against the file are checked once the
//! whole header is known.

use crate::cursor::Cursor;
use crate::error::{GgufError, Result};
use crate::GgmlType;

pub const MAX_DIMS: usize = 4;

/// One tensor's header entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` is the row length (contiguous), `dims[1]` the row count.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Offset of the data relative to the start of the data section.
    pub offset: u64,
    pub n_elements: u64,
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Values per row (the contiguous dimension).
    pub fn row_len(&self) -> u64 {
        self.dims[0]
    }

    /// Number of rows: the product of all but the first dimension.
    pub fn n_rows(&self) -> u64 {
        self.dims[1..].iter().product()
    }
}

/// Reads one tensor info at the cursor; `offset` in every error is where the entry starts.
pub(crate) fn read_tensor_info(cur: &mut Cursor<'_>) -> Result<TensorInfo> {
    let offset = cur.offset();
    let name = cur.string()?.to_owned();
    let n_dims = cur.u32("tensor dimension count")?;
    if n_dims as usize > MAX_DIMS {
        return Err(GgufError::TooManyDims {
            name,
            n_dims,
            offset,
        });
    }
    let mut dims = Vec::with_capacity(MAX_DIMS);
    let mut n_elements: u64 = 1;
    for index in 0..n_dims as usize {
        let d = cur.u64("tensor dimension")?;
        if d == 0 {
            return Err(GgufError::ZeroDim {
                name,
                index,
                offset,
            });
        }
        // ggml counts elements in i64, so larger products are as bad as overflow.
        n_elements = n_elements
            .checked_mul(d)
            .filter(|n| *n <= i64::MAX as u64)
            .ok_or_else(|| GgufError::DimOverflow {
                name: name.clone(),
                offset,
            })?;
        dims.push(d);
    }
    if dims.is_empty() {
        dims.push(1);
    }
    let ty_id = cur.u32("tensor type")?;
    let ty = GgmlType::from_id(ty_id).ok_or_else(|| GgufError::UnknownTensorType {
        name: name.clone(),
        ty: ty_id,
        offset,
    })?;
    let data_offset = cur.u64("tensor data offset")?;
    // Blocks run along the row, so the row length must be whole blocks.
    if dims[0] % ty.block_size() as u64 != 0 {
        return Err(GgufError::PartialBlock {
            name,
            ty: ty.name(),
            n_values: dims[0],
            block: ty.block_size(),
            offset,
        });
    }
    let n_bytes = ty
        .bytes_for(n_elements)
        .ok_or_else(|| GgufError::DataSizeOverflow {
            name: name.clone(),
            ty: ty.name(),
            n_values: n_elements,
            offset,
        })?;
    Ok(TensorInfo {
        name,
        dims,
        ty,
        offset: data_offset,
        n_elements,
        n_bytes,
    })
}
