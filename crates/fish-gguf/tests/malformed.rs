//! Opens every file of the malformed corpus (`tests/malformed/*.gguf`, written
//! by `tests/malformed/generate.py`) and checks each is rejected with the
//! expected error kind at the expected byte offset.

use std::collections::BTreeSet;
use std::path::PathBuf;

use fish_gguf::{Gguf, GgufError};

/// The corpus must stay at least this large.
const MIN_CORPUS_FILES: usize = 20;

/// File name (without `.gguf`) -> expected error variant and byte offset.
const EXPECTED: &[(&str, &str, u64)] = &[
    ("empty", "Truncated", 0),
    ("bad_magic", "BadMagic", 0),
    ("truncated_version", "Truncated", 4),
    ("version_1", "UnsupportedVersion", 4),
    ("version_4", "UnsupportedVersion", 4),
    ("big_endian_version", "UnsupportedVersion", 4),
    ("truncated_kv_count", "Truncated", 16),
    ("tensor_count_past_end", "CountTooLarge", 8),
    ("kv_count_u64_max", "CountTooLarge", 16),
    ("kv_count_past_end", "Truncated", 54),
    ("key_length_past_end", "StringTooLong", 24),
    ("key_invalid_utf8", "InvalidUtf8", 32),
    ("string_value_past_end", "StringTooLong", 48),
    ("string_length_u64_max", "StringTooLong", 48),
    ("unknown_value_type", "UnknownValueType", 33),
    ("unknown_array_element_type", "UnknownValueType", 37),
    ("array_length_past_end", "CountTooLarge", 41),
    ("array_length_u64_max", "CountTooLarge", 41),
    ("string_array_element_past_end", "StringTooLong", 64),
    ("string_array_split_character", "InvalidUtf8", 62),
    ("long_string_invalid_utf8", "InvalidUtf8", 72),
    ("nested_array_too_deep", "NestingTooDeep", 136),
    ("truncated_value", "Truncated", 37),
    ("duplicate_key", "DuplicateKey", 57),
    ("alignment_zero", "BadAlignment", 53),
    ("alignment_not_power_of_two", "BadAlignment", 53),
    ("alignment_wrong_type", "WrongValueType", 53),
    ("tensor_info_past_end", "Truncated", 72),
    ("tensor_name_past_end", "StringTooLong", 24),
    ("too_many_dims", "TooManyDims", 24),
    ("dim_count_u32_max", "TooManyDims", 24),
    ("zero_dim", "ZeroDim", 24),
    ("dim_product_overflow", "DimOverflow", 24),
    ("dim_product_past_i64", "DimOverflow", 24),
    ("data_size_overflow", "DataSizeOverflow", 24),
    ("removed_tensor_type", "UnknownTensorType", 24),
    ("unknown_tensor_type", "UnknownTensorType", 24),
    ("partial_block", "PartialBlock", 24),
    ("tensor_data_past_end", "TensorOutOfBounds", 24),
    ("tensor_data_missing", "TensorOutOfBounds", 24),
    ("tensor_offset_u64_max", "TensorOutOfBounds", 24),
    ("misaligned_tensor", "MisalignedTensor", 24),
    ("overlapping_tensors", "TensorOverlap", 57),
    ("duplicate_tensor_name", "DuplicateTensor", 57),
    ("truncated_tensor_type", "Truncated", 63),
];

fn corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/malformed")
}

fn variant(e: &GgufError) -> &'static str {
    match e {
        GgufError::Io { .. } => "Io",
        GgufError::Truncated { .. } => "Truncated",
        GgufError::BadMagic { .. } => "BadMagic",
        GgufError::UnsupportedVersion { .. } => "UnsupportedVersion",
        GgufError::CountTooLarge { .. } => "CountTooLarge",
        GgufError::StringTooLong { .. } => "StringTooLong",
        GgufError::InvalidUtf8 { .. } => "InvalidUtf8",
        GgufError::UnknownValueType { .. } => "UnknownValueType",
        GgufError::NestingTooDeep { .. } => "NestingTooDeep",
        GgufError::DuplicateKey { .. } => "DuplicateKey",
        GgufError::WrongValueType { .. } => "WrongValueType",
        GgufError::BadAlignment { .. } => "BadAlignment",
        GgufError::UnknownTensorType { .. } => "UnknownTensorType",
        GgufError::TooManyDims { .. } => "TooManyDims",
        GgufError::ZeroDim { .. } => "ZeroDim",
        GgufError::DimOverflow { .. } => "DimOverflow",
        GgufError::PartialBlock { .. } => "PartialBlock",
        GgufError::DataSizeOverflow { .. } => "DataSizeOverflow",
        GgufError::DuplicateTensor { .. } => "DuplicateTensor",
        GgufError::MisalignedTensor { .. } => "MisalignedTensor",
        GgufError::TensorOutOfBounds { .. } => "TensorOutOfBounds",
        GgufError::TensorOverlap { .. } => "TensorOverlap",
        GgufError::MissingKey { .. } => "MissingKey",
    }
}

fn corpus_names() -> BTreeSet<String> {
    std::fs::read_dir(corpus_dir())
        .expect("corpus folder exists")
        .map(|e| e.expect("readable entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "gguf"))
        .map(|p| {
            p.file_stem()
                .expect("file name")
                .to_string_lossy()
                .into_owned()
        })
        .collect()
}

#[test]
fn corpus_is_large_enough_and_matches_the_table() {
    let on_disk = corpus_names();
    assert!(
        on_disk.len() >= MIN_CORPUS_FILES,
        "only {} malformed files; run tests/malformed/generate.py",
        on_disk.len()
    );
    let in_table: BTreeSet<String> = EXPECTED.iter().map(|(n, ..)| n.to_string()).collect();
    assert_eq!(
        on_disk, in_table,
        "corpus files and the expected table differ"
    );
}

#[test]
fn every_malformed_file_is_rejected_with_the_expected_error() {
    let mut failures = Vec::new();
    for &(name, kind, offset) in EXPECTED {
        let path = corpus_dir().join(format!("{name}.gguf"));
        let bytes = std::fs::read(&path).expect("corpus file readable");
        for (how, result) in [
            ("open", Gguf::open(&path)),
            ("from_bytes", Gguf::from_bytes(bytes)),
        ] {
            match result {
                Ok(_) => failures.push(format!("{name} ({how}): accepted")),
                Err(e) => {
                    let message = e.to_string();
                    if variant(&e) != kind || e.offset() != Some(offset) {
                        failures.push(format!(
                            "{name} ({how}): expected {kind} at {offset}, got {} at {:?}: {message}",
                            variant(&e),
                            e.offset()
                        ));
                    }
                    if !message.contains(&format!("byte {offset}")) {
                        failures.push(format!(
                            "{name} ({how}): message lacks the offset: {message}"
                        ));
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
