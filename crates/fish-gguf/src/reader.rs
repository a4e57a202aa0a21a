//! The GGUF reader: validates the whole header at open and then hands out
//! zero-copy views of metadata and tensor data.

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;

use memmap2::Mmap;

use crate::error::{GgufError, Result};
use crate::value::{ArrayRef, ValueRef, ValueType};
use crate::GgmlType;

pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Deeper nesting than this is rejected, so hostile files cannot exhaust the stack.
pub const MAX_ARRAY_NESTING: usize = 8;
pub const MAX_DIMS: usize = 4;

/// A bounds-checked little-endian reader over a byte slice. Offsets in errors
/// are absolute file offsets (`base` + position).
pub(crate) struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
    base: u64,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(bytes: &'a [u8], base: u64) -> Self {
        Cursor { bytes, pos: 0, base }
    }

    pub(crate) fn pos(&self) -> usize {
        self.pos
    }

    fn offset(&self) -> u64 {
        self.base + self.pos as u64
    }

    fn remaining(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: &'static str) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(GgufError::Truncated {
                offset: self.offset(),
                needed: n - self.remaining(),
                what,
            });
        }
        let s = &self.bytes[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N]> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &'static str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &'static str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A count that must be able to fit in the rest of the file at `min_size` bytes per item.
    fn count(&mut self, what: &'static str, min_size: u64) -> Result<u64> {
        let offset = self.offset();
        let count = self.u64(what)?;
        let remaining = self.remaining();
        if count > remaining / min_size.max(1) {
            return Err(GgufError::CountTooLarge {
                what,
                count,
                offset,
                remaining,
            });
        }
        Ok(count)
    }

    pub(crate) fn string(&mut self) -> Result<&'a str> {
        let offset = self.offset();
        let len = self.u64("string length")?;
        if len > self.remaining() {
            return Err(GgufError::StringTooLong { len, offset });
        }
        let bytes = self.take(len, "string")?;
        std::str::from_utf8(bytes).map_err(|_| GgufError::InvalidUtf8 { offset: offset + 8 })
    }

    fn value_type(&mut self) -> Result<ValueType> {
        let offset = self.offset();
        let ty = self.u32("value type")?;
        ValueType::from_id(ty).ok_or(GgufError::UnknownValueType { ty, offset })
    }

    /// Decodes (and so validates) one value of type `ty`; arrays are walked
    /// element by element but not materialised.
    pub(crate) fn value(&mut self, ty: ValueType, depth: usize) -> Result<ValueRef<'a>> {
        const W: &str = "metadata value";
        Ok(match ty {
            ValueType::U8 => ValueRef::U8(self.array::<1>(W)?[0]),
            ValueType::I8 => ValueRef::I8(self.array::<1>(W)?[0] as i8),
            ValueType::U16 => ValueRef::U16(u16::from_le_bytes(self.array(W)?)),
            ValueType::I16 => ValueRef::I16(i16::from_le_bytes(self.array(W)?)),
            ValueType::U32 => ValueRef::U32(u32::from_le_bytes(self.array(W)?)),
            ValueType::I32 => ValueRef::I32(i32::from_le_bytes(self.array(W)?)),
            ValueType::F32 => ValueRef::F32(f32::from_le_bytes(self.array(W)?)),
            ValueType::U64 => ValueRef::U64(u64::from_le_bytes(self.array(W)?)),
            ValueType::I64 => ValueRef::I64(i64::from_le_bytes(self.array(W)?)),
            ValueType::F64 => ValueRef::F64(f64::from_le_bytes(self.array(W)?)),
            // ggml writes bools as one byte; anything but 0 is true.
            ValueType::Bool => ValueRef::Bool(self.array::<1>(W)?[0] != 0),
            ValueType::String => ValueRef::String(self.string()?),
            ValueType::Array => ValueRef::Array(self.array_value(depth)?),
        })
    }

    fn array_value(&mut self, depth: usize) -> Result<ArrayRef<'a>> {
        if depth >= MAX_ARRAY_NESTING {
            return Err(GgufError::NestingTooDeep {
                max: MAX_ARRAY_NESTING,
                offset: self.offset(),
            });
        }
        let elem = self.value_type()?;
        let min_size = match elem {
            ValueType::String => 8,
            ValueType::Array => 12,
            t => t.fixed_size().unwrap_or(1) as u64,
        };
        let len = self.count("array element", min_size)?;
        let start = self.pos;
        match elem.fixed_size() {
            Some(sz) => {
                self.take(len * sz as u64, "array elements")?;
            }
            None => {
                for _ in 0..len {
                    self.value(elem, depth + 1)?;
                }
            }
        }
        Ok(ArrayRef {
            elem,
            len,
            bytes: &self.bytes[start..self.pos],
        })
    }
}

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

struct KvEntry {
    key: String,
    ty: ValueType,
    /// Absolute file offset of the value's encoding.
    value_offset: usize,
}

enum Backing {
    Mmap(Mmap),
    Owned(Vec<u8>),
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Mmap(m) => m,
            Backing::Owned(v) => v,
        }
    }
}

/// An opened, fully validated GGUF file.
pub struct Gguf {
    backing: Backing,
    version: u32,
    alignment: u64,
    data_offset: u64,
    kvs: Vec<KvEntry>,
    kv_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

impl Gguf {
    /// Maps the file and validates its header and tensor table. Only the header
    /// pages are touched; tensor data is read when used.
    pub fn open(path: impl AsRef<Path>) -> Result<Gguf> {
        let path = path.as_ref();
        let io_err = |source| GgufError::Io {
            path: path.display().to_string(),
            source,
        };
        let file = File::open(path).map_err(io_err)?;
        // SAFETY: the map is read-only; a file truncated by another process while
        // mapped is outside what any mmap-based reader can defend against.
        let mmap = unsafe { Mmap::map(&file) }.map_err(io_err)?;
        Self::parse(Backing::Mmap(mmap))
    }

    /// Parses a file held in memory (tests, fuzzing, small synthetic files).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Gguf> {
        Self::parse(Backing::Owned(bytes))
    }

    fn parse(backing: Backing) -> Result<Gguf> {
        let bytes = backing.bytes();
        let mut cur = Cursor::new(bytes, 0);
        let magic: [u8; 4] = cur.array("magic")?;
        if magic != GGUF_MAGIC {
            return Err(GgufError::BadMagic { found: magic });
        }
        let version = cur.u32("version")?;
        if version != 2 && version != 3 {
            return Err(GgufError::UnsupportedVersion { version });
        }
        // Minimum encodings: a tensor info is name(8) + n_dims(4) + type(4) + offset(8);
        // a kv is key(8) + type(4) + one byte.
        let n_tensors = cur.count("tensor", 24)?;
        let n_kv = cur.count("metadata key/value", 13)?;

        let mut kvs = Vec::with_capacity(n_kv as usize);
        let mut kv_index = HashMap::with_capacity(n_kv as usize);
        for _ in 0..n_kv {
            let key_offset = cur.offset();
            let key = cur.string()?.to_owned();
            let ty = cur.value_type()?;
            let value_offset = cur.pos();
            cur.value(ty, 0)?;
            if kv_index.insert(key.clone(), kvs.len()).is_some() {
                return Err(GgufError::DuplicateKey {
                    key,
                    offset: key_offset,
                });
            }
            kvs.push(KvEntry {
                key,
                ty,
                value_offset,
            });
        }

        let mut tensors = Vec::with_capacity(n_tensors as usize);
        let mut tensor_index = HashMap::with_capacity(n_tensors as usize);
        for _ in 0..n_tensors {
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
            let mut dims = Vec::with_capacity(n_dims as usize);
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
            let data_rel = cur.u64("tensor data offset")?;
            // Blocks run along the row, so the row length must be whole blocks.
            let n_bytes = (dims[0] % ty.block_size() as u64 == 0)
                .then(|| ty.bytes_for(n_elements))
                .flatten()
                .ok_or_else(|| GgufError::PartialBlock {
                    name: name.clone(),
                    ty: ty.name(),
                    n_values: dims[0],
                    block: ty.block_size(),
                })?;
            if tensor_index.insert(name.clone(), tensors.len()).is_some() {
                return Err(GgufError::DuplicateTensor { name, offset });
            }
            tensors.push(TensorInfo {
                name,
                dims,
                ty,
                offset: data_rel,
                n_elements,
                n_bytes,
            });
        }

        let mut gguf = Gguf {
            backing: Backing::Owned(Vec::new()),
            version,
            alignment: DEFAULT_ALIGNMENT,
            data_offset: 0,
            kvs,
            kv_index,
            tensors,
            tensor_index,
        };
        let header_end = cur.pos() as u64;
        gguf.backing = backing;
        gguf.alignment = gguf.read_alignment()?;
        gguf.data_offset = header_end.next_multiple_of(gguf.alignment);
        gguf.check_tensor_data()?;
        Ok(gguf)
    }

    fn read_alignment(&self) -> Result<u64> {
        match self.get("general.alignment") {
            None => Ok(DEFAULT_ALIGNMENT),
            Some(v) => {
                let a = v.as_u64().ok_or_else(|| GgufError::WrongValueType {
                    key: "general.alignment".into(),
                    expected: "unsigned integer",
                    found: v.value_type().name(),
                })?;
                if a == 0 || !a.is_power_of_two() {
                    return Err(GgufError::BadAlignment { alignment: a });
                }
                Ok(a)
            }
        }
    }

    fn check_tensor_data(&self) -> Result<()> {
        let file_len = self.backing.bytes().len() as u64;
        let mut spans: Vec<(u64, u64, usize)> = Vec::with_capacity(self.tensors.len());
        for (i, t) in self.tensors.iter().enumerate() {
            if t.offset % self.alignment != 0 {
                return Err(GgufError::MisalignedTensor {
                    name: t.name.clone(),
                    offset: t.offset,
                    alignment: self.alignment,
                });
            }
            let start = self.data_offset.checked_add(t.offset);
            let end = start.and_then(|s| s.checked_add(t.n_bytes));
            match (start, end) {
                (Some(start), Some(end)) if end <= file_len => spans.push((start, end, i)),
                _ => {
                    return Err(GgufError::TensorOutOfBounds {
                        name: t.name.clone(),
                        start: start.unwrap_or(u64::MAX),
                        end: end.unwrap_or(u64::MAX),
                        file_len,
                    })
                }
            }
        }
        spans.sort_unstable();
        for w in spans.windows(2) {
            let (a, b) = (w[0], w[1]);
            if b.0 < a.1 {
                return Err(GgufError::TensorOverlap {
                    name: self.tensors[b.2].name.clone(),
                    other: self.tensors[a.2].name.clone(),
                    start: b.0,
                    end: b.1,
                });
            }
        }
        Ok(())
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute file offset where tensor data begins.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    pub fn file_len(&self) -> u64 {
        self.backing.bytes().len() as u64
    }

    /// Metadata keys in file order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.kvs.iter().map(|kv| kv.key.as_str())
    }

    /// All metadata in file order.
    pub fn metadata(&self) -> impl Iterator<Item = (&str, ValueRef<'_>)> {
        self.kvs.iter().map(|kv| (kv.key.as_str(), self.decode(kv)))
    }

    pub fn get(&self, key: &str) -> Option<ValueRef<'_>> {
        self.kv_index.get(key).map(|&i| self.decode(&self.kvs[i]))
    }

    fn decode(&self, kv: &KvEntry) -> ValueRef<'_> {
        let bytes = self.backing.bytes();
        let mut cur = Cursor::new(&bytes[kv.value_offset..], kv.value_offset as u64);
        // Validated at open.
        cur.value(kv.ty, 0).expect("metadata validated at open")
    }

    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The tensor's bytes, borrowed from the map. Bounds were checked at open.
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let start = (self.data_offset + t.offset) as usize;
        &self.backing.bytes()[start..start + t.n_bytes as usize]
    }

    /// Tells the kernel the tensor's pages are not needed any more (after a
    /// device upload), so they stop counting as resident memory. Reading the
    /// tensor again later faults the pages back in from the file.
    pub fn release_pages(&self, t: &TensorInfo) {
        #[cfg(unix)]
        if let Backing::Mmap(m) = &self.backing {
            let page = 4096u64;
            let start = (self.data_offset + t.offset).next_multiple_of(page);
            let end = (self.data_offset + t.offset + t.n_bytes) / page * page;
            if end > start {
                // SAFETY: the map is private and read-only and file-backed, so
                // dropped pages are re-read from the file on the next access;
                // no reference observes different contents. Failure only means
                // the pages stay resident.
                let _ = unsafe {
                    m.unchecked_advise_range(
                        memmap2::UncheckedAdvice::DontNeed,
                        start as usize,
                        (end - start) as usize,
                    )
                };
            }
        }
        #[cfg(not(unix))]
        let _ = t;
    }
}
