//! Compatibility with gguf-py (PyPI `gguf`), the reference Python implementation:
//! a file written by `GgufWriter` must read back in gguf-py's `GGUFReader`
//! with the same keys, values, tensor names, shapes, types and bytes, and a
//! file written by gguf-py's `GGUFWriter` must read back here.
//!
//! The fixture is defined identically in `tests/gguf_py_check.py`. The test
//! fails (never skips) when python3 or the `gguf` module is missing.

use std::path::{Path, PathBuf};
use std::process::Command;

use fish_gguf::{GgmlType, Gguf, GgufWriter, TensorSpec, Value, ValueType};

const INSTALL_HINT: &str = "run `python3 -m pip install gguf`";

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/gguf_py_check.py")
}

fn fixture_kvs() -> Vec<(&'static str, Value)> {
    vec![
        ("general.architecture", "llama".into()),
        ("general.name", "fixture \u{fc}\u{2603}".into()),
        ("test.u8", Value::U8(200)),
        ("test.i8", Value::I8(-100)),
        ("test.u16", Value::U16(60000)),
        ("test.i16", Value::I16(-30000)),
        ("test.u32", Value::U32(4_000_000_000)),
        ("test.i32", Value::I32(-2_000_000_000)),
        ("test.f32", Value::F32(1.5)),
        ("test.bool", Value::Bool(true)),
        ("test.u64", Value::U64((1 << 40) + 3)),
        ("test.i64", Value::I64(-(1 << 40))),
        ("test.f64", Value::F64(3.25)),
        ("test.strings", Value::string_array(["a", "", "h\u{e9}llo"])),
        ("test.i32s", Value::i32_array([1, -2, 3])),
        ("test.f32s", Value::f32_array([0.5, -0.25])),
        (
            "test.nested",
            Value::Array(
                ValueType::Array,
                vec![Value::i32_array([1, 2]), Value::i32_array([3])],
            ),
        ),
    ]
}

/// Written only from Rust: gguf-py's writer refuses empty arrays.
fn rust_only_kvs() -> Vec<(&'static str, Value)> {
    vec![("rust.empty", Value::Array(ValueType::U32, vec![]))]
}

fn fixture_tensors() -> Vec<TensorSpec> {
    vec![
        TensorSpec::new("tok.f32", &[4, 3], GgmlType::F32),
        TensorSpec::new("tok.f16", &[8], GgmlType::F16),
        TensorSpec::new("blk.0.q8_0", &[64, 2], GgmlType::Q8_0),
        TensorSpec::new("blk.0.q4_k", &[256], GgmlType::Q4_K),
        TensorSpec::new("blk.0.i32", &[5], GgmlType::I32),
        TensorSpec::new("blk.0.four_d", &[2, 2, 2, 2], GgmlType::F32),
    ]
}

/// Bytes 1..=61 in a fixed pattern (as floats they are small and finite).
fn tensor_bytes(index: usize, spec: &TensorSpec) -> Vec<u8> {
    let n = spec.n_bytes().expect("fixture tensors are whole blocks") as usize;
    (0..n)
        .map(|i| ((i * 7 + index * 13) % 61 + 1) as u8)
        .collect()
}

fn write_fixture(path: &Path) {
    let mut w = GgufWriter::new();
    for (k, v) in fixture_kvs().into_iter().chain(rust_only_kvs()) {
        w.kv(k, v);
    }
    let tensors = fixture_tensors();
    for t in &tensors {
        w.tensor(t.clone());
    }
    let data: Vec<Vec<u8>> = tensors
        .iter()
        .enumerate()
        .map(|(i, t)| tensor_bytes(i, t))
        .collect();
    let slices: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    let file = std::fs::File::create(path).expect("create fixture file");
    w.write_with_data(std::io::BufWriter::new(file), &slices)
        .expect("write fixture");
}

fn check_fixture(g: &Gguf, kvs: &[(&str, Value)]) {
    let keys: Vec<&str> = g.keys().collect();
    let want_keys: Vec<&str> = kvs.iter().map(|(k, _)| *k).collect();
    assert_eq!(keys, want_keys);
    for (key, want) in kvs {
        let got = g.get(key).expect("key present").to_owned_value();
        assert_eq!(&got, want, "{key}");
    }
    let tensors = fixture_tensors();
    assert_eq!(g.tensors().len(), tensors.len());
    for (i, (got, want)) in g.tensors().iter().zip(&tensors).enumerate() {
        assert_eq!(got.name, want.name);
        assert_eq!(got.dims, want.dims, "{}", want.name);
        assert_eq!(got.ty, want.ty, "{}", want.name);
        assert_eq!(g.tensor_data(got), tensor_bytes(i, want), "{}", want.name);
    }
}

/// Runs the check script; panics with the install hint when gguf-py is unavailable.
fn run_script(mode: &str, path: &Path) {
    let output = Command::new("python3")
        .arg(script())
        .arg(mode)
        .arg(path)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run python3 ({e}): install python3, then {INSTALL_HINT}")
        });
    let stderr = String::from_utf8_lossy(&output.stderr);
    // The script exits with 3 when `import gguf` fails.
    assert_ne!(
        output.status.code(),
        Some(3),
        "gguf-py is not installed: {INSTALL_HINT}\n{stderr}"
    );
    assert!(
        output.status.success(),
        "gguf_py_check.py {mode} failed ({}):\n{stderr}",
        output.status
    );
}

#[test]
fn gguf_py_reads_what_the_writer_wrote() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("from_rust.gguf");
    write_fixture(&path);
    // The file must also read back here before gguf-py is asked.
    let all: Vec<_> = fixture_kvs().into_iter().chain(rust_only_kvs()).collect();
    check_fixture(&Gguf::open(&path).expect("own file opens"), &all);
    run_script("read", &path);
}

#[test]
fn the_reader_reads_what_gguf_py_wrote() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("from_python.gguf");
    run_script("write", &path);
    let g = Gguf::open(&path).expect("gguf-py's file opens");
    check_fixture(&g, &fixture_kvs());
}
