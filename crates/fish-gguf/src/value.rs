//! Metadata values: the 13 GGUF value types, borrowed views for reading and
//! owned values for writing.

use std::fmt;

/// The type tag of a metadata value, numbered as in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl ValueType {
    pub fn from_id(id: u32) -> Option<Self> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// Size in bytes of one value of a fixed-size type; `None` for strings and arrays.
    pub fn fixed_size(self) -> Option<usize> {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => Some(1),
            U16 | I16 => Some(2),
            U32 | I32 | F32 => Some(4),
            U64 | I64 | F64 => Some(8),
            String | Array => None,
        }
    }

    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A metadata value borrowed from a mapped file. Arrays stay unparsed bytes
/// until iterated, so a 150k-entry vocabulary costs nothing at open.
#[derive(Clone, Copy, Debug)]
pub enum ValueRef<'a> {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(&'a str),
    Array(ArrayRef<'a>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl<'a> ValueRef<'a> {
    pub fn value_type(&self) -> ValueType {
        match self {
            ValueRef::U8(_) => ValueType::U8,
            ValueRef::I8(_) => ValueType::I8,
            ValueRef::U16(_) => ValueType::U16,
            ValueRef::I16(_) => ValueType::I16,
            ValueRef::U32(_) => ValueType::U32,
            ValueRef::I32(_) => ValueType::I32,
            ValueRef::F32(_) => ValueType::F32,
            ValueRef::Bool(_) => ValueType::Bool,
            ValueRef::String(_) => ValueType::String,
            ValueRef::Array(_) => ValueType::Array,
            ValueRef::U64(_) => ValueType::U64,
            ValueRef::I64(_) => ValueType::I64,
            ValueRef::F64(_) => ValueType::F64,
        }
    }

    /// Any integer type that fits in u64 (negative values do not).
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            ValueRef::U8(v) => Some(v as u64),
            ValueRef::U16(v) => Some(v as u64),
            ValueRef::U32(v) => Some(v as u64),
            ValueRef::U64(v) => Some(v),
            ValueRef::I8(v) => u64::try_from(v).ok(),
            ValueRef::I16(v) => u64::try_from(v).ok(),
            ValueRef::I32(v) => u64::try_from(v).ok(),
            ValueRef::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer type as i64 (u64 values above i64::MAX do not fit).
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            ValueRef::I8(v) => Some(v as i64),
            ValueRef::I16(v) => Some(v as i64),
            ValueRef::I32(v) => Some(v as i64),
            ValueRef::I64(v) => Some(v),
            _ => self.as_u64().and_then(|v| i64::try_from(v).ok()),
        }
    }

    /// Any float or integer as f64.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            ValueRef::F32(v) => Some(v as f64),
            ValueRef::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&'a str> {
        match *self {
            ValueRef::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            ValueRef::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<ArrayRef<'a>> {
        match *self {
            ValueRef::Array(a) => Some(a),
            _ => None,
        }
    }

    /// Copies the value out of the file (used to carry metadata into a new file).
    pub fn to_owned_value(&self) -> Value {
        match *self {
            ValueRef::U8(v) => Value::U8(v),
            ValueRef::I8(v) => Value::I8(v),
            ValueRef::U16(v) => Value::U16(v),
            ValueRef::I16(v) => Value::I16(v),
            ValueRef::U32(v) => Value::U32(v),
            ValueRef::I32(v) => Value::I32(v),
            ValueRef::F32(v) => Value::F32(v),
            ValueRef::Bool(v) => Value::Bool(v),
            ValueRef::String(s) => Value::String(s.to_owned()),
            ValueRef::U64(v) => Value::U64(v),
            ValueRef::I64(v) => Value::I64(v),
            ValueRef::F64(v) => Value::F64(v),
            ValueRef::Array(a) => Value::Array(
                a.elem_type(),
                a.iter().map(|v| v.to_owned_value()).collect(),
            ),
        }
    }
}

/// An array whose bytes were validated at open (lengths, nesting, UTF-8) and
/// are decoded on iteration.
#[derive(Clone, Copy, Debug)]
pub struct ArrayRef<'a> {
    pub(crate) elem: ValueType,
    pub(crate) len: u64,
    /// The encoded elements, exactly `len` of them.
    pub(crate) bytes: &'a [u8],
}

impl<'a> ArrayRef<'a> {
    pub fn elem_type(&self) -> ValueType {
        self.elem
    }

    pub fn len(&self) -> usize {
        // Validated at open: every element takes at least one byte of the file.
        self.len as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Iterates the elements. The bytes were validated when the file was opened,
    /// so decoding cannot fail here.
    pub fn iter(&self) -> ArrayIter<'a> {
        ArrayIter {
            elem: self.elem,
            left: self.len,
            bytes: self.bytes,
        }
    }

    /// The elements as strings, or `None` if this is not a string array.
    pub fn strings(&self) -> Option<impl Iterator<Item = &'a str> + 'a> {
        (self.elem == ValueType::String).then(|| self.iter().map(|v| v.as_str().unwrap_or("")))
    }

    /// Numeric elements converted to f32 (ints and floats), or `None` for other element types.
    pub fn to_f32_vec(&self) -> Option<Vec<f32>> {
        self.elem.fixed_size()?;
        self.iter().map(|v| v.as_f64().map(|x| x as f32)).collect()
    }

    /// Integer elements as i64, or `None` for other element types.
    pub fn to_i64_vec(&self) -> Option<Vec<i64>> {
        self.elem.fixed_size()?;
        self.iter().map(|v| v.as_i64()).collect()
    }
}

pub struct ArrayIter<'a> {
    elem: ValueType,
    left: u64,
    bytes: &'a [u8],
}

impl<'a> Iterator for ArrayIter<'a> {
    type Item = ValueRef<'a>;

    fn next(&mut self) -> Option<ValueRef<'a>> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let mut cur = crate::cursor::Cursor::new(self.bytes, 0);
        // Validated at open; an error here would mean the file changed under the map.
        let v = cur.value(self.elem, 0).ok()?;
        self.bytes = &self.bytes[cur.pos()..];
        Some(v)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left as usize, Some(self.left as usize))
    }
}

/// An owned metadata value, for writing files.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    /// Element type and elements; every element must have that type.
    Array(ValueType, Vec<Value>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Value {
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(..) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// A string array from anything iterable of string-likes.
    pub fn string_array<S: Into<String>>(items: impl IntoIterator<Item = S>) -> Value {
        Value::Array(
            ValueType::String,
            items.into_iter().map(|s| Value::String(s.into())).collect(),
        )
    }

    pub fn f32_array(items: impl IntoIterator<Item = f32>) -> Value {
        Value::Array(ValueType::F32, items.into_iter().map(Value::F32).collect())
    }

    pub fn i32_array(items: impl IntoIterator<Item = i32>) -> Value {
        Value::Array(ValueType::I32, items.into_iter().map(Value::I32).collect())
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Value {
        Value::String(s.to_owned())
    }
}
impl From<String> for Value {
    fn from(s: String) -> Value {
        Value::String(s)
    }
}
impl From<u32> for Value {
    fn from(v: u32) -> Value {
        Value::U32(v)
    }
}
impl From<f32> for Value {
    fn from(v: f32) -> Value {
        Value::F32(v)
    }
}
impl From<bool> for Value {
    fn from(v: bool) -> Value {
        Value::Bool(v)
    }
}
