#!/usr/bin/env python3
"""Cross-checks fish-gguf against gguf-py (PyPI `gguf`), used by tests/gguf_py.rs.

    gguf_py_check.py read PATH    read PATH with GGUFReader and check the fixture
    gguf_py_check.py write PATH   write the fixture to PATH with GGUFWriter

The fixture (metadata and tensors) is defined identically in tests/gguf_py.rs;
a mismatch prints what differs and exits with status 1.
"""

import sys

try:
    import numpy as np
    from gguf import GGMLQuantizationType as Q
    from gguf import GGUFReader, GGUFValueType as V, GGUFWriter
except ImportError as e:
    print(f"gguf-py is missing ({e}): run `python3 -m pip install gguf`", file=sys.stderr)
    sys.exit(3)

# key -> (value type, element type for arrays, value); general.architecture comes first.
FIXTURE_KVS = [
    ("general.architecture", V.STRING, None, "llama"),
    ("general.name", V.STRING, None, "fixture \u00fc\u2603"),
    ("test.u8", V.UINT8, None, 200),
    ("test.i8", V.INT8, None, -100),
    ("test.u16", V.UINT16, None, 60000),
    ("test.i16", V.INT16, None, -30000),
    ("test.u32", V.UINT32, None, 4000000000),
    ("test.i32", V.INT32, None, -2000000000),
    ("test.f32", V.FLOAT32, None, 1.5),
    ("test.bool", V.BOOL, None, True),
    ("test.u64", V.UINT64, None, 2**40 + 3),
    ("test.i64", V.INT64, None, -(2**40)),
    ("test.f64", V.FLOAT64, None, 3.25),
    ("test.strings", V.ARRAY, V.STRING, ["a", "", "h\u00e9llo"]),
    ("test.i32s", V.ARRAY, V.INT32, [1, -2, 3]),
    ("test.f32s", V.ARRAY, V.FLOAT32, [0.5, -0.25]),
    ("test.nested", V.ARRAY, V.ARRAY, [[1, 2], [3]]),
]

# name -> (ggml type, ggml dims with the row length first)
FIXTURE_TENSORS = [
    ("tok.f32", Q.F32, [4, 3]),
    ("tok.f16", Q.F16, [8]),
    ("blk.0.q8_0", Q.Q8_0, [64, 2]),
    ("blk.0.q4_k", Q.Q4_K, [256]),
    ("blk.0.i32", Q.I32, [5]),
    ("blk.0.four_d", Q.F32, [2, 2, 2, 2]),
]

BYTES_PER_BLOCK = {Q.F32: (1, 4), Q.F16: (1, 2), Q.I32: (1, 4), Q.Q8_0: (32, 34), Q.Q4_K: (256, 144)}

# Written only by the Rust side (gguf-py's writer cannot write empty arrays).
RUST_ONLY_KVS = [("rust.empty", V.ARRAY, V.UINT32, [])]


def n_bytes(ty, dims):
    block, size = BYTES_PER_BLOCK[ty]
    n = 1
    for d in dims:
        n *= d
    return n // block * size


def tensor_bytes(index, ty, dims):
    """Bytes 1..=61 in a fixed pattern: as floats they are small and finite."""
    return bytes((i * 7 + index * 13) % 61 + 1 for i in range(n_bytes(ty, dims)))


def check_read(path, extra_kvs):
    errors = []
    reader = GGUFReader(path)
    fields = {k: f for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    expected = FIXTURE_KVS + extra_kvs
    if list(fields) != [k for k, *_ in expected]:
        errors.append(f"keys {list(fields)} != {[k for k, *_ in expected]}")
    for key, ty, elem, want in expected:
        field = fields.get(key)
        if field is None:
            continue
        if field.types[0] != ty or (elem is not None and len(field.types) > 1 and field.types[1] != elem):
            errors.append(f"{key}: types {field.types} != {ty} of {elem}")
        got = field.contents()
        if elem == V.ARRAY:
            # gguf-py flattens nested arrays.
            want = [x for inner in want for x in inner]
        if got != want:
            errors.append(f"{key}: {got!r} != {want!r}")
    names = [t.name for t in reader.tensors]
    if names != [n for n, *_ in FIXTURE_TENSORS]:
        errors.append(f"tensor names {names}")
    for index, (tensor, (name, ty, dims)) in enumerate(zip(reader.tensors, FIXTURE_TENSORS)):
        if tensor.tensor_type != ty:
            errors.append(f"{name}: type {tensor.tensor_type!r} != {ty!r}")
        if [int(d) for d in tensor.shape] != dims:
            errors.append(f"{name}: shape {list(tensor.shape)} != {dims}")
        if tensor.data.tobytes() != tensor_bytes(index, ty, dims):
            errors.append(f"{name}: data differs")
    return errors


def write(path):
    writer = GGUFWriter(path, "llama")
    for key, ty, elem, value in FIXTURE_KVS[1:]:
        writer.add_key_value(key, value, ty, sub_type=elem)
    for index, (name, ty, dims) in enumerate(FIXTURE_TENSORS):
        raw = tensor_bytes(index, ty, dims)
        numpy_shape = list(reversed(dims))
        if ty in (Q.F32, Q.F16, Q.I32):
            dtype = {Q.F32: np.float32, Q.F16: np.float16, Q.I32: np.int32}[ty]
            array = np.frombuffer(raw, dtype=dtype).reshape(numpy_shape)
            writer.add_tensor(name, array)
        else:
            # Quantized data goes in as bytes per row; gguf-py derives the value shape.
            block, size = BYTES_PER_BLOCK[ty]
            numpy_shape[-1] = numpy_shape[-1] // block * size
            array = np.frombuffer(raw, dtype=np.uint8).reshape(numpy_shape)
            writer.add_tensor(name, array, raw_dtype=ty)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("read", "write"):
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    mode, path = sys.argv[1:]
    if mode == "write":
        write(path)
        return
    errors = check_read(path, RUST_ONLY_KVS)
    if errors:
        print("gguf-py read a different file than fish-gguf wrote:", file=sys.stderr)
        for e in errors:
            print("  " + e, file=sys.stderr)
        sys.exit(1)
    print("gguf-py read the fixture back")


if __name__ == "__main__":
    main()
