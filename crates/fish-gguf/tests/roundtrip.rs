//! Writer -> reader round trips: every metadata value type (nested and empty
//! arrays included) and tensors of several types come back exactly; every
//! prefix of a valid file and every single-byte corruption of its header is
//! an error or a valid file, never a panic.

use fish_gguf::{GgmlType, Gguf, GgufWriter, TensorSpec, Value, ValueRef, ValueType};

fn all_value_kinds() -> Vec<(&'static str, Value)> {
    vec![
        ("general.architecture", "llama".into()),
        ("v.u8", Value::U8(u8::MAX)),
        ("v.i8", Value::I8(i8::MIN)),
        ("v.u16", Value::U16(u16::MAX)),
        ("v.i16", Value::I16(i16::MIN)),
        ("v.u32", Value::U32(u32::MAX)),
        ("v.i32", Value::I32(i32::MIN)),
        ("v.f32", Value::F32(-0.1)),
        ("v.bool_true", Value::Bool(true)),
        ("v.bool_false", Value::Bool(false)),
        ("v.string", "tab\tnewline\n\u{1f41f}".into()),
        ("v.empty_string", "".into()),
        ("v.u64", Value::U64(u64::MAX)),
        ("v.i64", Value::I64(i64::MIN)),
        ("v.f64", Value::F64(std::f64::consts::PI)),
        ("v.f64_inf", Value::F64(f64::NEG_INFINITY)),
        ("v.strings", Value::string_array(["", "x", "y\u{e9}"])),
        // Strings of 128 bytes and more have length prefixes that are not
        // ASCII, which splits the reader's fast UTF-8 check into runs.
        (
            "v.long_strings",
            Value::string_array([
                "\u{20ac}".repeat(50),
                "\u{e9}".into(),
                "x".repeat(300),
                "\u{1f41f}".into(),
            ]),
        ),
        ("v.empty_strings", Value::Array(ValueType::String, vec![])),
        ("v.empty_u8s", Value::Array(ValueType::U8, vec![])),
        (
            "v.bools",
            Value::Array(ValueType::Bool, vec![Value::Bool(true), Value::Bool(false)]),
        ),
        (
            "v.u64s",
            Value::Array(ValueType::U64, vec![Value::U64(1), Value::U64(u64::MAX)]),
        ),
        (
            "v.f64s",
            Value::Array(ValueType::F64, vec![Value::F64(0.5), Value::F64(-2.0)]),
        ),
        ("v.i32s", Value::i32_array([i32::MIN, 0, i32::MAX])),
        ("v.f32s", Value::f32_array([1.0, -1.0, 0.25])),
        (
            "v.nested",
            Value::Array(
                ValueType::Array,
                vec![
                    Value::string_array(["a", "b"]),
                    Value::Array(ValueType::I64, vec![]),
                    Value::Array(
                        ValueType::Array,
                        vec![Value::Array(ValueType::F64, vec![Value::F64(1.0)])],
                    ),
                ],
            ),
        ),
        ("general.alignment", Value::U32(64)),
    ]
}

fn tensor_specs() -> Vec<TensorSpec> {
    vec![
        TensorSpec::new("f32", &[3, 5], GgmlType::F32),
        TensorSpec::new("f16", &[7], GgmlType::F16),
        TensorSpec::new("bf16", &[2, 2, 3], GgmlType::BF16),
        TensorSpec::new("q4_0", &[64, 3], GgmlType::Q4_0),
        TensorSpec::new("q4_1", &[32, 2], GgmlType::Q4_1),
        TensorSpec::new("q8_0", &[32, 1, 1, 2], GgmlType::Q8_0),
        TensorSpec::new("q6_k", &[256, 2], GgmlType::Q6_K),
        TensorSpec::new("i8", &[9], GgmlType::I8),
    ]
}

fn pattern(seed: usize, n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 31 + seed * 17 + 5) as u8).collect()
}

fn write(kvs: &[(&str, Value)], specs: &[TensorSpec]) -> (Vec<u8>, Vec<Vec<u8>>) {
    let mut w = GgufWriter::new();
    for (k, v) in kvs {
        w.kv(*k, v.clone());
    }
    for s in specs {
        w.tensor(s.clone());
    }
    let data: Vec<Vec<u8>> = specs
        .iter()
        .enumerate()
        .map(|(i, s)| pattern(i, s.n_bytes().expect("whole blocks") as usize))
        .collect();
    let slices: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    let mut out = Vec::new();
    w.write_with_data(&mut out, &slices)
        .expect("write to memory");
    (out, data)
}

/// Decodes everything a consumer could ask for, so a latent panic surfaces.
fn touch_everything(g: &Gguf) -> usize {
    fn walk(v: ValueRef<'_>) -> usize {
        match v {
            ValueRef::Array(a) => a.iter().map(walk).sum::<usize>() + 1,
            ValueRef::String(s) => s.len(),
            _ => 1,
        }
    }
    let meta: usize = g.metadata().map(|(_, v)| walk(v)).sum();
    let data: usize = g.tensors().iter().map(|t| g.tensor_data(t).len()).sum();
    meta + data
}

#[test]
fn every_value_type_and_tensor_type_round_trips() {
    let kvs = all_value_kinds();
    let specs = tensor_specs();
    let (bytes, data) = write(&kvs, &specs);
    let g = Gguf::from_bytes(bytes).expect("writer output parses");

    assert_eq!(g.version(), 3);
    assert_eq!(g.alignment(), 64);
    assert_eq!(g.data_offset() % 64, 0);
    let keys: Vec<&str> = g.keys().collect();
    assert_eq!(keys, kvs.iter().map(|(k, _)| *k).collect::<Vec<_>>());
    for (k, v) in &kvs {
        let got = g.get(k).expect("key present");
        assert_eq!(got.value_type(), v.value_type(), "{k}");
        assert_eq!(&got.to_owned_value(), v, "{k}");
    }
    let nested = g.get("v.nested").and_then(|v| v.as_array()).expect("array");
    assert_eq!(nested.len(), 3);
    assert!(nested
        .iter()
        .nth(1)
        .and_then(|v| v.as_array())
        .expect("inner")
        .is_empty());

    assert_eq!(g.tensors().len(), specs.len());
    for ((t, spec), want) in g.tensors().iter().zip(&specs).zip(&data) {
        assert_eq!(t.name, spec.name);
        assert_eq!(t.dims, spec.dims);
        assert_eq!(t.ty, spec.ty);
        assert_eq!(t.offset % 64, 0, "{} aligned", t.name);
        assert_eq!(t.n_elements, spec.dims.iter().product::<u64>());
        assert_eq!(g.tensor_data(t), want.as_slice(), "{}", t.name);
        assert_eq!(g.tensor(&t.name), Some(t));
    }
}

#[test]
fn a_file_on_disk_reads_like_one_in_memory() {
    let (bytes, _) = write(&all_value_kinds(), &tensor_specs());
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("rt.gguf");
    std::fs::write(&path, &bytes).expect("write file");
    let mapped = Gguf::open(&path).expect("mapped file parses");
    let owned = Gguf::from_bytes(bytes).expect("bytes parse");
    assert_eq!(mapped.tensors(), owned.tensors());
    assert_eq!(touch_everything(&mapped), touch_everything(&owned));
}

/// A small valid file whose last tensor ends exactly at the end of the file,
/// so that every proper prefix is missing something.
fn small_valid_file() -> Vec<u8> {
    let kvs = vec![
        ("general.architecture", "llama".into()),
        ("v.strings", Value::string_array(["ab", "c"])),
        (
            "v.nested",
            Value::Array(ValueType::Array, vec![Value::i32_array([1, 2])]),
        ),
        ("v.f64", Value::F64(1.0)),
    ];
    let specs = vec![
        TensorSpec::new("a", &[8], GgmlType::F32),
        TensorSpec::new("b", &[32, 2], GgmlType::Q8_0),
        TensorSpec::new("c", &[8], GgmlType::F32),
    ];
    let (bytes, _) = write(&kvs, &specs);
    assert_eq!(bytes.len() % 32, 0, "the last tensor fills its alignment");
    bytes
}

#[test]
fn every_prefix_of_a_valid_file_is_an_error() {
    let bytes = small_valid_file();
    Gguf::from_bytes(bytes.clone()).expect("the whole file parses");
    for len in 0..bytes.len() {
        match Gguf::from_bytes(bytes[..len].to_vec()) {
            Ok(_) => panic!("prefix of {len} of {} bytes was accepted", bytes.len()),
            Err(e) => assert!(e.offset().is_some(), "prefix {len}: {e} has no offset"),
        }
    }
}

#[test]
fn corrupting_any_header_byte_never_panics() {
    let bytes = small_valid_file();
    let header_len = Gguf::from_bytes(bytes.clone())
        .expect("parses")
        .data_offset() as usize;
    let mut rejected = 0;
    for at in 0..header_len {
        for value in [0x00, 0x01, 0x7f, 0x80, 0xff] {
            let mut bad = bytes.clone();
            if bad[at] == value {
                continue;
            }
            bad[at] = value;
            match Gguf::from_bytes(bad) {
                Ok(g) => {
                    touch_everything(&g);
                }
                Err(_) => rejected += 1,
            }
        }
    }
    assert!(
        rejected > header_len,
        "most corruptions must be rejected ({rejected})"
    );
}

#[test]
fn the_writer_refuses_what_the_reader_would_refuse() {
    let q4 = GgmlType::Q4_0;
    let bad_specs = [
        vec![TensorSpec::new(
            "five_dims",
            &[1, 1, 1, 1, 1],
            GgmlType::F32,
        )],
        vec![TensorSpec::new("no_dims", &[], GgmlType::F32)],
        vec![TensorSpec::new("zero", &[4, 0], GgmlType::F32)],
        // 64 values are whole Q4_0 blocks, but rows of 16 are not.
        vec![TensorSpec::new("partial_rows", &[16, 4], q4)],
        vec![TensorSpec::new(
            "overflow",
            &[1 << 32, 1 << 32],
            GgmlType::F32,
        )],
        vec![
            TensorSpec::new("twice", &[8], GgmlType::F32),
            TensorSpec::new("twice", &[8], GgmlType::F32),
        ],
    ];
    for specs in bad_specs {
        let mut w = GgufWriter::new();
        for s in &specs {
            w.tensor(s.clone());
        }
        let mut out = Vec::new();
        let result = w.write(&mut out, |_, s, o| {
            o.write_all(&vec![0; s.n_bytes()? as usize])
        });
        assert!(result.is_err(), "{specs:?} was written");
        assert!(out.is_empty(), "{specs:?}: bytes written before the error");
    }
    for alignment in [Value::U32(0), Value::U32(48), Value::I32(-32), "32".into()] {
        let mut w = GgufWriter::new();
        w.kv("general.alignment", alignment.clone());
        let mut out = Vec::new();
        assert!(w.write_with_data(&mut out, &[]).is_err(), "{alignment:?}");
    }
}
