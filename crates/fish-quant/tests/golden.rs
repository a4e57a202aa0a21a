//! Decoding (and, where gguf-py has a quantiser, encoding) against golden
//! vectors made by gguf-py's `gguf.quants` (see tests/golden/gen.py).

use fish_quant::{dequant_row, quantize_row, GgmlType};
use std::path::PathBuf;

fn read(name: &str) -> Vec<u8> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn floats(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

const DECODED: [GgmlType; 12] = [
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

#[test]
fn dequant_matches_gguf_py_bit_for_bit() {
    for ty in DECODED {
        let bytes = read(&format!("{ty}.bytes"));
        let expected = floats(&read(&format!("{ty}.f32")));
        let mut got = vec![0f32; expected.len()];
        dequant_row(ty, &bytes, &mut got).unwrap();
        for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
            assert_eq!(
                g.to_bits(),
                e.to_bits(),
                "{ty} value {i}: {g} vs gguf-py {e}"
            );
        }
    }
}

#[test]
fn quantize_matches_gguf_py_byte_for_byte() {
    let x = floats(&read("input.f32"));
    for ty in [
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
    ] {
        let expected = read(&format!("{ty}.bytes"));
        let mut got = vec![0u8; expected.len()];
        quantize_row(ty, &x, &mut got).unwrap();
        let first_diff = got.iter().zip(&expected).position(|(a, b)| a != b);
        assert_eq!(first_diff, None, "{ty}: first differing byte");
    }
}
