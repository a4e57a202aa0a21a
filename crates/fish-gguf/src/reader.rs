//! The GGUF reader: validates the whole header at open and then hands out
//! zero-copy views of metadata and tensor data.

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;

use memmap2::Mmap;

use crate::cursor::Cursor;
use crate::error::{GgufError, Result};
use crate::tensor_info::{read_tensor_info, TensorInfo};
use crate::value::{ValueRef, ValueType};

pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Entries preallocated before parsing: counts were checked against the bytes
/// left, but a large file could still claim tens of millions of entries, so
/// the tables grow with what actually parses instead.
const PREALLOC_LIMIT: usize = 4096;

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
    /// Absolute file offset of each tensor's header entry, for error messages.
    tensor_info_offsets: Vec<u64>,
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

        let n_kv_alloc = (n_kv as usize).min(PREALLOC_LIMIT);
        let mut kvs = Vec::with_capacity(n_kv_alloc);
        let mut kv_index = HashMap::with_capacity(n_kv_alloc);
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

        let n_tensors_alloc = (n_tensors as usize).min(PREALLOC_LIMIT);
        let mut tensors = Vec::with_capacity(n_tensors_alloc);
        let mut tensor_info_offsets = Vec::with_capacity(n_tensors_alloc);
        let mut tensor_index = HashMap::with_capacity(n_tensors_alloc);
        for _ in 0..n_tensors {
            let offset = cur.offset();
            let info = read_tensor_info(&mut cur)?;
            if tensor_index
                .insert(info.name.clone(), tensors.len())
                .is_some()
            {
                return Err(GgufError::DuplicateTensor {
                    name: info.name,
                    offset,
                });
            }
            tensors.push(info);
            tensor_info_offsets.push(offset);
        }

        let mut gguf = Gguf {
            backing: Backing::Owned(Vec::new()),
            version,
            alignment: DEFAULT_ALIGNMENT,
            data_offset: 0,
            kvs,
            kv_index,
            tensors,
            tensor_info_offsets,
            tensor_index,
        };
        let header_end = cur.pos() as u64;
        gguf.backing = backing;
        gguf.alignment = gguf.read_alignment()?;
        // The alignment is at most 2^63 and the header far shorter, so this cannot overflow.
        gguf.data_offset = header_end.next_multiple_of(gguf.alignment);
        gguf.check_tensor_data()?;
        Ok(gguf)
    }

    fn read_alignment(&self) -> Result<u64> {
        let key = "general.alignment";
        let (Some(v), Some(offset)) = (self.get(key), self.value_offset(key)) else {
            return Ok(DEFAULT_ALIGNMENT);
        };
        let a = v.as_u64().ok_or_else(|| GgufError::WrongValueType {
            key: key.into(),
            expected: "unsigned integer",
            found: v.value_type().name(),
            offset,
        })?;
        if a == 0 || !a.is_power_of_two() {
            return Err(GgufError::BadAlignment {
                alignment: a,
                offset,
            });
        }
        Ok(a)
    }

    /// Checks that every tensor's data is aligned, inside the file and
    /// overlaps no other tensor's data.
    fn check_tensor_data(&self) -> Result<()> {
        let file_len = self.backing.bytes().len() as u64;
        let mut spans: Vec<(u64, u64, usize)> = Vec::with_capacity(self.tensors.len());
        for (i, t) in self.tensors.iter().enumerate() {
            let offset = self.tensor_info_offsets[i];
            if t.offset % self.alignment != 0 {
                return Err(GgufError::MisalignedTensor {
                    name: t.name.clone(),
                    data_offset: t.offset,
                    alignment: self.alignment,
                    offset,
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
                        offset,
                    })
                }
            }
        }
        // Sorted by start, any overlap shows up between neighbours: if X
        // overlaps a later Y, the span right after X starts inside X too.
        spans.sort_unstable();
        for w in spans.windows(2) {
            let (a, b) = (w[0], w[1]);
            if b.0 < a.1 {
                return Err(GgufError::TensorOverlap {
                    name: self.tensors[b.2].name.clone(),
                    other: self.tensors[a.2].name.clone(),
                    start: b.0,
                    end: b.1,
                    offset: self.tensor_info_offsets[b.2],
                });
            }
        }
        Ok(())
    }

    /// Absolute file offset of a metadata value's encoding.
    pub(crate) fn value_offset(&self, key: &str) -> Option<u64> {
        self.kv_index
            .get(key)
            .map(|&i| self.kvs[i].value_offset as u64)
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
