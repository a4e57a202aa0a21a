//! The GGUF writer: metadata and tensor infos first, then the tensor data
//! streamed in order, so multi-GB synthetic models never sit in memory.

use std::io::{self, Write};

use crate::reader::{DEFAULT_ALIGNMENT, GGUF_MAGIC};
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

    /// Bytes of data this tensor needs.
    pub fn n_bytes(&self) -> io::Result<u64> {
        let n: u64 = self.dims.iter().product();
        self.ty.bytes_for(n).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "tensor {}: {} values are not whole {} blocks",
                    self.name, n, self.ty
                ),
            )
        })
    }
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

    fn alignment(&self) -> u64 {
        self.kvs
            .iter()
            .find(|(k, _)| k == "general.alignment")
            .and_then(|(_, v)| match v {
                Value::U32(a) => Some(*a as u64),
                Value::U64(a) => Some(*a),
                _ => None,
            })
            .unwrap_or(DEFAULT_ALIGNMENT)
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
        let align = self.alignment();
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
        let mut sizes = Vec::with_capacity(self.tensors.len());
        for t in &self.tensors {
            let n_bytes = t.n_bytes()?;
            write_string(&mut out, &t.name)?;
            out.write_all(&(t.dims.len() as u32).to_le_bytes())?;
            for d in &t.dims {
                out.write_all(&d.to_le_bytes())?;
            }
            out.write_all(&t.ty.id().to_le_bytes())?;
            out.write_all(&offset.to_le_bytes())?;
            sizes.push(n_bytes);
            offset = (offset + n_bytes).next_multiple_of(align);
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
