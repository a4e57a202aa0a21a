#!/usr/bin/env python3
"""Writes the malformed GGUF corpus: one small file per hostile case.

Run from anywhere: `python3 crates/fish-gguf/tests/malformed/generate.py`.
The files land next to this script as `<case>.gguf`; the Rust test
`tests/malformed.rs` holds the error kind and byte offset each must produce.
`--table` prints `name kind offset` for every case (the offsets are where each
file is broken, worked out while it is built). No dependencies beyond python3.
"""

import os
import struct
import sys

# Metadata value type ids.
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
# Tensor type ids.
T_F32, T_F16, T_Q4_0, T_F64 = 0, 1, 2, 28
ALIGN = 32


class File:
    """Appends little-endian fields and remembers where interesting ones start."""

    def __init__(self):
        self.buf = bytearray()
        self.bad = None  # absolute offset the reader should report

    def here(self):
        return len(self.buf)

    def mark(self):
        self.bad = self.here()
        return self

    def raw(self, b):
        self.buf += b
        return self

    def u32(self, v):
        return self.raw(struct.pack("<I", v))

    def u64(self, v):
        return self.raw(struct.pack("<Q", v))

    def string(self, s):
        b = s.encode() if isinstance(s, str) else s
        return self.u64(len(b)).raw(b)

    def header(self, n_tensors, n_kv, version=3):
        return self.raw(b"GGUF").u32(version).u64(n_tensors).u64(n_kv)

    def kv(self, key, ty, payload):
        return self.string(key).u32(ty).raw(payload)

    def tensor(self, name, dims, ty, offset):
        self.string(name).u32(len(dims))
        for d in dims:
            self.u64(d)
        return self.u32(ty).u64(offset)

    def pad(self):
        while len(self.buf) % ALIGN:
            self.buf.append(0)
        return self

    def zeros(self, n):
        return self.raw(bytes(n))


def s(text):
    return struct.pack("<Q", len(text)) + text.encode()


def cases():
    """Yields (name, expected kind, file)."""
    f = File().mark()
    yield "empty", "Truncated", f

    f = File().mark().raw(b"GGML").u32(3).u64(0).u64(0)
    yield "bad_magic", "BadMagic", f

    f = File().raw(b"GGUF").mark().raw(b"\x03\x00")
    yield "truncated_version", "Truncated", f

    f = File().raw(b"GGUF").mark().u32(1).u64(0).u64(0)
    yield "version_1", "UnsupportedVersion", f

    f = File().raw(b"GGUF").mark().u32(4).u64(0).u64(0)
    yield "version_4", "UnsupportedVersion", f

    f = File().raw(b"GGUF").mark().raw(struct.pack(">I", 3)).u64(0).u64(0)
    yield "big_endian_version", "UnsupportedVersion", f

    f = File().raw(b"GGUF").u32(3).u64(0).mark().raw(b"\x01\x00\x00")
    yield "truncated_kv_count", "Truncated", f

    f = File().raw(b"GGUF").u32(3).mark().u64(2**40).u64(0)
    yield "tensor_count_past_end", "CountTooLarge", f

    f = File().raw(b"GGUF").u32(3).u64(0).mark().u64(2**64 - 1)
    yield "kv_count_u64_max", "CountTooLarge", f

    # Two entries announced; the second would need more bytes than remain.
    f = File().header(0, 2).kv("a", U64, struct.pack("<Q", 7)).raw(s("b")).mark()
    yield "kv_count_past_end", "Truncated", f

    f = File().header(0, 1).mark().u64(1000).raw(b"general.name").u32(STRING)
    yield "key_length_past_end", "StringTooLong", f

    f = File().header(0, 1)
    key_at = f.here()
    f.string(b"bad\xff\xfekey").u32(U8).raw(b"\x01")
    f.bad = key_at + 8
    yield "key_invalid_utf8", "InvalidUtf8", f

    f = File().header(0, 1).string("general.name").u32(STRING).mark().u64(64).raw(b"short")
    yield "string_value_past_end", "StringTooLong", f

    f = File().header(0, 1).string("general.name").u32(STRING).mark().u64(2**64 - 1).zeros(8)
    yield "string_length_u64_max", "StringTooLong", f

    f = File().header(0, 1).string("x").mark().u32(13).u64(0)
    yield "unknown_value_type", "UnknownValueType", f

    f = File().header(0, 1).string("x").u32(ARRAY).mark().u32(0xFFFF).u64(1).zeros(8)
    yield "unknown_array_element_type", "UnknownValueType", f

    f = File().header(0, 1).string("x").u32(ARRAY).u32(U32).mark().u64(100).zeros(16)
    yield "array_length_past_end", "CountTooLarge", f

    f = File().header(0, 1).string("x").u32(ARRAY).u32(U64).mark().u64(2**64 - 1).zeros(16)
    yield "array_length_u64_max", "CountTooLarge", f

    f = File().header(0, 1).string("tokens").u32(ARRAY).u32(STRING).u64(2).raw(s("ab"))
    f.mark().u64(500).raw(b"cd")
    yield "string_array_element_past_end", "StringTooLong", f

    # A two-byte character split across two strings: the bytes of the whole
    # array would be valid UTF-8 without the length prefix between them.
    f = File().header(0, 1).string("tokens").u32(ARRAY).u32(STRING).u64(2)
    first = f.here()
    f.string(b"ab\xc3").string(b"\xa9cd")
    f.bad = first + 8
    yield "string_array_split_character", "InvalidUtf8", f

    # Invalid UTF-8 inside a string of 200 bytes (its length prefix is not ASCII).
    f = File().header(0, 1).string("tokens").u32(ARRAY).u32(STRING).u64(3).string("ok")
    long_at = f.here()
    f.string(b"\xe2\x82\xac" * 60 + b"\xff" + b"x" * 19).string("fine")
    f.bad = long_at + 8
    yield "long_string_invalid_utf8", "InvalidUtf8", f

    # Nine levels of arrays of arrays; the reader allows eight.
    f = File().header(0, 1).string("deep").u32(ARRAY)
    for _ in range(8):
        f.u32(ARRAY).u64(1)
    f.mark().u32(U8).u64(1).raw(b"\x00")
    yield "nested_array_too_deep", "NestingTooDeep", f

    f = File().header(0, 1).string("x").u32(U64).mark().raw(b"\x01\x02\x03\x04")
    yield "truncated_value", "Truncated", f

    f = File().header(0, 2).kv("general.name", STRING, s("a"))
    f.mark().kv("general.name", STRING, s("b"))
    yield "duplicate_key", "DuplicateKey", f

    f = File().header(0, 1).string("general.alignment").u32(U32).mark().u32(0)
    yield "alignment_zero", "BadAlignment", f

    f = File().header(0, 1).string("general.alignment").u32(U32).mark().u32(48)
    yield "alignment_not_power_of_two", "BadAlignment", f

    f = File().header(0, 1).string("general.alignment").u32(STRING).mark().raw(s("32"))
    yield "alignment_wrong_type", "WrongValueType", f

    # Two tensors announced, enough bytes for the count check, but the second entry stops short.
    f = File().header(2, 0).tensor("w", [4], T_F32, 0)
    f.string("abc").u32(1).mark().raw(b"\x04\x00\x00")
    yield "tensor_info_past_end", "Truncated", f

    f = File().header(1, 0).mark().u64(4096).raw(b"weight").zeros(20)
    yield "tensor_name_past_end", "StringTooLong", f

    f = File().header(1, 0).mark().tensor("w", [1, 1, 1, 1, 1], T_F32, 0).pad().zeros(4)
    yield "too_many_dims", "TooManyDims", f

    f = File().header(1, 0).mark().string("w").u32(2**32 - 1).zeros(40)
    yield "dim_count_u32_max", "TooManyDims", f

    f = File().header(1, 0).mark().tensor("w", [4, 0], T_F32, 0).pad().zeros(16)
    yield "zero_dim", "ZeroDim", f

    f = File().header(1, 0).mark().tensor("w", [2**32, 2**32], T_F32, 0).pad().zeros(32)
    yield "dim_product_overflow", "DimOverflow", f

    f = File().header(1, 0).mark().tensor("w", [2**62, 3], T_F32, 0).pad().zeros(32)
    yield "dim_product_past_i64", "DimOverflow", f

    f = File().header(1, 0).mark().tensor("w", [2**62], T_F64, 0).pad().zeros(32)
    yield "data_size_overflow", "DataSizeOverflow", f

    f = File().header(1, 0).mark().tensor("w", [32], 4, 0).pad().zeros(32)
    yield "removed_tensor_type", "UnknownTensorType", f

    f = File().header(1, 0).mark().tensor("w", [32], 1000, 0).pad().zeros(32)
    yield "unknown_tensor_type", "UnknownTensorType", f

    f = File().header(1, 0).mark().tensor("w", [33, 2], T_Q4_0, 0).pad().zeros(64)
    yield "partial_block", "PartialBlock", f

    f = File().header(1, 0).mark().tensor("w", [64], T_F32, 0).pad().zeros(128)
    f.buf = f.buf[: len(f.buf) - 8]
    yield "tensor_data_past_end", "TensorOutOfBounds", f

    f = File().header(1, 0).mark().tensor("w", [1024], T_F32, 0)
    yield "tensor_data_missing", "TensorOutOfBounds", f

    f = File().header(1, 0).mark().tensor("w", [8], T_F32, 2**64 - 32).pad().zeros(32)
    yield "tensor_offset_u64_max", "TensorOutOfBounds", f

    f = File().header(1, 0).mark().tensor("w", [4], T_F32, 4).pad().zeros(64)
    yield "misaligned_tensor", "MisalignedTensor", f

    f = File().header(2, 0).tensor("a", [64], T_F32, 0)
    f.mark().tensor("b", [8], T_F32, 128).pad().zeros(256)
    yield "overlapping_tensors", "TensorOverlap", f

    f = File().header(2, 0).tensor("w", [8], T_F32, 0)
    f.mark().tensor("w", [8], T_F32, 32).pad().zeros(64)
    yield "duplicate_tensor_name", "DuplicateTensor", f

    # A long name keeps the count check satisfied; the file stops inside the type field.
    f = File().header(1, 0).string("blk.0.attn_q.weight").u32(1).u64(8)
    f.mark().raw(b"\x00\x00")
    yield "truncated_tensor_type", "Truncated", f


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    table = "--table" in sys.argv[1:]
    for old in os.listdir(here):
        if old.endswith(".gguf"):
            os.remove(os.path.join(here, old))
    n = 0
    for name, kind, f in cases():
        with open(os.path.join(here, name + ".gguf"), "wb") as out:
            out.write(bytes(f.buf))
        if table:
            print(f'("{name}", "{kind}", {f.bad}),')
        n += 1
    if not table:
        print(f"wrote {n} files to {here}")


if __name__ == "__main__":
    main()
