//! A bounds-checked little-endian reader over the header bytes. Every read
//! either succeeds or returns an error carrying the absolute file offset.

use crate::error::{GgufError, Result};
use crate::value::{ArrayRef, ValueRef, ValueType};

/// Deeper nesting than this is rejected, so hostile files cannot exhaust the stack.
pub const MAX_ARRAY_NESTING: usize = 8;

/// Offsets in errors are absolute file offsets (`base` + position).
pub(crate) struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
    base: u64,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(bytes: &'a [u8], base: u64) -> Self {
        Cursor {
            bytes,
            pos: 0,
            base,
        }
    }

    pub(crate) fn pos(&self) -> usize {
        self.pos
    }

    pub(crate) fn offset(&self) -> u64 {
        self.base + self.pos as u64
    }

    fn remaining(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: &'static str) -> Result<&'a [u8]> {
        let remaining = self.remaining();
        if n > remaining {
            return Err(GgufError::Truncated {
                offset: self.offset(),
                needed: n - remaining,
                what,
            });
        }
        // `n <= remaining`, so it fits in usize and the slice is in bounds.
        let s = &self.bytes[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    pub(crate) fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N]> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    pub(crate) fn u32(&mut self, what: &'static str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    pub(crate) fn u64(&mut self, what: &'static str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A count that must be able to fit in the rest of the file at `min_size` bytes per item.
    pub(crate) fn count(&mut self, what: &'static str, min_size: u64) -> Result<u64> {
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

    pub(crate) fn value_type(&mut self) -> Result<ValueType> {
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
            ValueType::I8 => ValueRef::I8(i8::from_le_bytes(self.array(W)?)),
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

    /// Walks `len` strings (a vocabulary: ~100k of them), checking lengths and UTF-8.
    ///
    /// Fast path: in valid UTF-8 an ASCII byte is a whole character, so when a
    /// run of strings is separated only by length prefixes whose eight bytes
    /// are all ASCII (lengths below 128), every string in it starts and ends on
    /// a character boundary and one validation of the whole run proves each
    /// string valid. Runs break at the rare longer strings. If any run fails,
    /// the strings are validated one by one to report the bad one.
    fn string_elements(&mut self, len: u64) -> Result<()> {
        const NON_ASCII: u64 = 0x8080_8080_8080_8080;
        let start = self.pos;
        let mut run_start = self.pos;
        let mut runs_valid = true;
        for _ in 0..len {
            let prefix_at = self.pos;
            let offset = self.offset();
            let n = self.u64("string length")?;
            if n > self.remaining() {
                return Err(GgufError::StringTooLong { len: n, offset });
            }
            if n & NON_ASCII != 0 {
                runs_valid &= is_utf8(&self.bytes[run_start..prefix_at]);
                run_start = self.pos;
            }
            // `n <= remaining`, so this stays inside the slice.
            self.pos += n as usize;
        }
        if runs_valid && is_utf8(&self.bytes[run_start..self.pos]) {
            return Ok(());
        }
        let mut each = Cursor {
            bytes: self.bytes,
            pos: start,
            base: self.base,
        };
        for _ in 0..len {
            each.string()?;
        }
        Ok(())
    }

    fn array_value(&mut self, depth: usize) -> Result<ArrayRef<'a>> {
        if depth >= MAX_ARRAY_NESTING {
            return Err(GgufError::NestingTooDeep {
                max: MAX_ARRAY_NESTING,
                offset: self.offset(),
            });
        }
        let elem = self.value_type()?;
        // The smallest encoding of one element: a string is its length, an
        // array its element type and length.
        let min_size = match elem {
            ValueType::String => 8,
            ValueType::Array => 12,
            t => t.fixed_size().unwrap_or(1) as u64,
        };
        let len = self.count("array element", min_size)?;
        let start = self.pos;
        match elem.fixed_size() {
            // `count` bounded `len * sz` by the remaining bytes, so it cannot overflow.
            Some(sz) => {
                self.take(len * sz as u64, "array elements")?;
            }
            None if elem == ValueType::String => self.string_elements(len)?,
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

/// simdutf8 validates mixed-script vocabularies several times faster than
/// `std::str::from_utf8`, which dominated the open time of real models.
fn is_utf8(bytes: &[u8]) -> bool {
    simdutf8::basic::from_utf8(bytes).is_ok()
}
