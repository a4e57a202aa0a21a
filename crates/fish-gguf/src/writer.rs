//! The GGUF writer: metadata and tensor infos first, then the tensor data
//! streamed in order, so multi-GB synthetic models never sit in memory.

use std::io::{self, Write};

use crate::reader::{DEFAULT_ALIGNMENT, GGUF_MAGIC};
use crate::tensor_info::MAX_DIMS;
use crate::value::Value;
use crate::GgmlType;

/// A tensor to be written: its header entry; data is supplied later in order.
#[derive(Clone, Debug)]
pub struct TensorSpec {
    pub name: String,
    /// ggml order: row length first.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
}

impl TensorSpec {
    pub fn new(name: impl Into<String>, dims: &[u64], ty: GgmlType) -> Self {
        TensorSpec {
            name: name.into(),
            dims: dims.to_vec(),
            ty,
        }
    }

    /// Bytes of data this tensor needs; an error for any shape the reader
    /// would refuse (no dims or more than four, a zero dim, rows that are not
    /// whole blocks, an element count past i64).
    pub fn n_bytes(&self) -> io::Result<u64> {
        let bad = |why: String| invalid_input(format!("tensor {:?}: {why}", self.name));
        if self.dims.is_empty() || self.dims.len() > MAX_DIMS {
            return Err(bad(format!(
                "{} dims (1 to {MAX_DIMS} allowed)",
                self.dims.len()
            )));
        }
        if self.dims.contains(&0) {
            return Err(bad(format!("zero dimension in {:?}", self.dims)));
        }
        let block = self.ty.block_size() as u64;
        if self.dims[0] % block != 0 {
            return Err(bad(format!(
                "rows of {} values are not whole {} blocks of {block}",
                self.dims[0], self.ty
            )));
        }
        self.dims
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul(d))
            .filter(|&n| n <= i64::MAX as u64)
            .and_then(|n| self.ty.bytes_for(n))
            .ok_or_else(|| bad(format!("{:?} overflows", self.dims)))
    }
}

fn invalid_input(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, message)
}

/// Builds a GGUF v3 file.
#[derive(Default)]
pub struct GgufWriter {
    kvs: Vec<(String, Value)>,
    tensors: Vec<TensorSpec>,
}

impl GgufWriter {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) a metadata entry, keeping first-insertion order.
    pub fn kv(&mut self, key: impl Into<String>, value: impl Into<Value>) -> &mut Self {
        let key = key.into();
        let value = value.into();
        match self.kvs.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => self.kvs.push((key, value)),
        }
        self
    }

    pub fn tensor(&mut self, spec: TensorSpec) -> &mut Self {
        self.tensors.push(spec);
        self
    }

    pub fn tensors(&self) -> &[TensorSpec] {
        &self.tensors
    }

    /// `general.alignment` as the reader will see it (any integer type).
    fn alignment(&self) -> io::Result<u64> {
        let Some((_, v)) = self.kvs.iter().find(|(k, _)| k == "general.alignment") else {
            return Ok(DEFAULT_ALIGNMENT);
        };
        let a = match *v {
            Value::U8(a) => Some(a as u64),
            Value::U16(a) => Some(a as u64),
            Value::U32(a) => Some(a as u64),
            Value::U64(a) => Some(a),
            Value::I8(a) => u64::try_from(a).ok(),
            Value::I16(a) => u64::try_from(a).ok(),
            Value::I32(a) => u64::try_from(a).ok(),
            Value::I64(a) => u64::try_from(a).ok(),
            _ => None,
        };
        match a {
            Some(a) if a.is_power_of_two() => Ok(a),
            _ => Err(invalid_input(format!(
                "general.alignment {v:?} is not a power-of-two integer"
            ))),
        }
    }

    fn check_unique_names(&self) -> io::Result<()> {
        let mut seen = std::collections::HashSet::with_capacity(self.tensors.len());
        match self.tensors.iter().find(|t| !seen.insert(t.name.as_str())) {
            Some(t) => Err(invalid_input(format!("duplicate tensor name {:?}", t.name))),
            None => Ok(()),
        }
    }

    /// Writes the whole file; `data(i, spec, out)` must write exactly the bytes of tensor `i`.
    pub fn write<W: Write>(
        &self,
        out: W,
        mut data: impl FnMut(usize, &TensorSpec, &mut dyn Write) -> io::Result<()>,
    ) -> io::Result<()> {
        let mut out = CountingWriter {
            inner: out,
            written: 0,
        };
        // Everything the reader would refuse is refused before the first byte.
        let align = self.alignment()?;
        self.check_unique_names()?;
        let sizes = self
            .tensors
            .iter()
            .map(TensorSpec::n_bytes)
            .collect::<io::Result<Vec<u64>>>()?;
        out.write_all(&GGUF_MAGIC)?;
        out.write_all(&3u32.to_le_bytes())?;
        out.write_all(&(self.tensors.len() as u64).to_le_bytes())?;
        out.write_all(&(self.kvs.len() as u64).to_le_bytes())?;
        for (k, v) in &self.kvs {
            write_string(&mut out, k)?;
            out.write_all(&(v.value_type() as u32).to_le_bytes())?;
            write_value(&mut out, v)?;
        }
        let mut offset = 0u64;
        for (t, &n_bytes) in self.tensors.iter().zip(&sizes) {
            write_string(&mut out, &t.name)?;
            out.write_all(&(t.dims.len() as u32).to_le_bytes())?;
            for d in &t.dims {
                out.write_all(&d.to_le_bytes())?;
            }
            out.write_all(&t.ty.id().to_le_bytes())?;
            out.write_all(&offset.to_le_bytes())?;
            offset = offset
                .checked_add(n_bytes)
                .and_then(|end| end.checked_next_multiple_of(align))
                .ok_or_else(|| invalid_input("tensor data exceeds 64-bit offsets".into()))?;
        }
        pad_to(&mut out, align)?;
        for (i, t) in self.tensors.iter().enumerate() {
            let before = out.written;
            data(i, t, &mut out)?;
            if out.written - before != sizes[i] {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "tensor {}: wrote {} bytes, expected {}",
                        t.name,
                        out.written - before,
                        sizes[i]
                    ),
                ));
            }
            pad_to(&mut out, align)?;
        }
        out.flush()
    }

    /// Writes a file whose tensor data are given as whole byte slices.
    pub fn write_with_data<W: Write>(&self, out: W, data: &[&[u8]]) -> io::Result<()> {
        if data.len() != self.tensors.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "one data slice per tensor",
            ));
        }
        self.write(out, |i, _, w| w.write_all(data[i]))
    }
}

struct CountingWriter<W> {
    inner: W,
    written: u64,
}

impl<W: Write> Write for CountingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

fn pad_to<W: Write>(out: &mut CountingWriter<W>, align: u64) -> io::Result<()> {
    let pad = out.written.next_multiple_of(align) - out.written;
    out.write_all(&vec![0u8; pad as usize])
}

fn write_string(out: &mut impl Write, s: &str) -> io::Result<()> {
    out.write_all(&(s.len() as u64).to_le_bytes())?;
    out.write_all(s.as_bytes())
}

fn write_value(out: &mut impl Write, v: &Value) -> io::Result<()> {
    match v {
        Value::U8(x) => out.write_all(&[*x]),
        Value::I8(x) => out.write_all(&x.to_le_bytes()),
        Value::U16(x) => out.write_all(&x.to_le_bytes()),
        Value::I16(x) => out.write_all(&x.to_le_bytes()),
        Value::U32(x) => out.write_all(&x.to_le_bytes()),
        Value::I32(x) => out.write_all(&x.to_le_bytes()),
        Value::F32(x) => out.write_all(&x.to_le_bytes()),
        Value::Bool(x) => out.write_all(&[*x as u8]),
        Value::String(s) => write_string(out, s),
        Value::U64(x) => out.write_all(&x.to_le_bytes()),
        Value::I64(x) => out.write_all(&x.to_le_bytes()),
        Value::F64(x) => out.write_all(&x.to_le_bytes()),
        Value::Array(elem, items) => {
            out.write_all(&(*elem as u32).to_le_bytes())?;
            out.write_all(&(items.len() as u64).to_le_bytes())?;
            for item in items {
                if item.value_type() != *elem {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("array of {elem} holds a {}", item.value_type()),
                    ));
                }
                write_value(out, item)?;
            }
            Ok(())
        }
    }
}
