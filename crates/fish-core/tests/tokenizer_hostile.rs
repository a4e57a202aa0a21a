//! Tokenizers built from small synthetic GGUF files: malformed metadata is a
//! typed error, and the SentencePiece path (spaces, byte fallback, specials)
//! behaves as llama.cpp's does.

use fish_core::tokenizer::{EncodeOptions, TokenKind, Tokenizer, TokenizerError, TokenizerModel};
use fish_gguf::{Gguf, GgufWriter, Value};

fn build(kvs: Vec<(&str, Value)>) -> Result<Tokenizer, TokenizerError> {
    let mut w = GgufWriter::new();
    for (k, v) in kvs {
        w.kv(k, v);
    }
    let mut bytes = Vec::new();
    w.write(&mut bytes, |_, _, _| Ok(())).expect("writes");
    let g = Gguf::from_bytes(bytes).expect("reads back");
    Tokenizer::from_gguf(&g)
}

/// A tiny SentencePiece vocabulary: control tokens, scored pieces, a
/// user-defined newline and byte fallback for 'x' only.
fn spm_kvs() -> Vec<(&'static str, Value)> {
    let tokens = [
        "<unk>",
        "<s>",
        "</s>",
        "<0x78>",
        "\n",
        "\u{2581}",
        "a",
        "b",
        "ab",
        "\u{2581}ab",
        "<turn>",
    ];
    let types = [2, 3, 3, 6, 4, 1, 1, 1, 1, 1, 3];
    let scores = [0.0, 0.0, 0.0, 0.0, 0.0, -1.0, -2.0, -2.0, -0.5, -0.1, 0.0];
    vec![
        ("tokenizer.ggml.model", "llama".into()),
        ("tokenizer.ggml.tokens", Value::string_array(tokens)),
        ("tokenizer.ggml.token_type", Value::i32_array(types)),
        ("tokenizer.ggml.scores", Value::f32_array(scores)),
    ]
}

fn replace(
    mut kvs: Vec<(&'static str, Value)>,
    key: &'static str,
    v: Value,
) -> Vec<(&'static str, Value)> {
    kvs.retain(|(k, _)| *k != key);
    kvs.push((key, v));
    kvs
}

#[test]
fn sentencepiece_merges_by_score_and_falls_back_to_bytes() {
    let tok = build(spm_kvs()).expect("builds");
    assert_eq!(tok.model(), TokenizerModel::SentencePiece);
    // Defaults without metadata: BOS added, space prefix on, bos = 1, eos = 2.
    assert!(tok.adds_bos());
    assert_eq!(tok.encode("ab", EncodeOptions::PROMPT), [1, 9]);
    assert_eq!(tok.encode("ab ab", EncodeOptions::PLAIN), [9, 9]);
    // 'x' is a byte token, 'y' has none and becomes <unk>.
    assert_eq!(tok.encode("xy", EncodeOptions::PLAIN), [5, 3, 0]);
    // The user-defined newline is cut out even without parse_special, and
    // the text after any special token gets the space prefix again.
    assert_eq!(tok.encode("ab\nab", EncodeOptions::PLAIN), [9, 4, 9]);
    assert_eq!(tok.encode("<turn>ab", EncodeOptions::PROMPT), [1, 10, 9]);
    assert_eq!(
        tok.encode("<turn>", EncodeOptions::PLAIN).len(),
        7,
        "plain text, byte by byte"
    );
    assert_eq!(tok.decode(&[9, 4, 3, 8]).expect("in range"), " ab\nxab");
    assert_eq!(tok.token_kind(3), Some(TokenKind::Byte));
    assert!(tok.is_eog(2));
}

#[test]
fn metadata_flags_are_honoured() {
    let kvs = replace(spm_kvs(), "tokenizer.ggml.add_bos_token", false.into());
    let kvs = replace(kvs, "tokenizer.ggml.add_eos_token", true.into());
    let kvs = replace(kvs, "tokenizer.ggml.add_space_prefix", false.into());
    let tok = build(kvs).expect("builds");
    assert_eq!(tok.encode("ab", EncodeOptions::PROMPT), [8, 2]);
}

#[test]
fn malformed_metadata_is_a_typed_error() {
    let cases: Vec<(&str, Vec<(&str, Value)>)> = vec![
        (
            "missing model",
            spm_kvs()
                .into_iter()
                .filter(|(k, _)| *k != "tokenizer.ggml.model")
                .collect(),
        ),
        (
            "unknown model",
            replace(spm_kvs(), "tokenizer.ggml.model", "wordpiece-9".into()),
        ),
        (
            "model not a string",
            replace(spm_kvs(), "tokenizer.ggml.model", 7u32.into()),
        ),
        (
            "missing tokens",
            spm_kvs()
                .into_iter()
                .filter(|(k, _)| *k != "tokenizer.ggml.tokens")
                .collect(),
        ),
        (
            "tokens not strings",
            replace(spm_kvs(), "tokenizer.ggml.tokens", Value::i32_array([1, 2])),
        ),
        (
            "empty vocabulary",
            replace(
                spm_kvs(),
                "tokenizer.ggml.tokens",
                Value::string_array(Vec::<String>::new()),
            ),
        ),
        (
            "short types",
            replace(
                spm_kvs(),
                "tokenizer.ggml.token_type",
                Value::i32_array([1, 1]),
            ),
        ),
        (
            "long scores",
            replace(
                spm_kvs(),
                "tokenizer.ggml.scores",
                Value::f32_array([0.0; 12]),
            ),
        ),
        (
            "scores not numbers",
            replace(
                spm_kvs(),
                "tokenizer.ggml.scores",
                Value::string_array(["a"; 11]),
            ),
        ),
        (
            "bos out of range",
            replace(spm_kvs(), "tokenizer.ggml.bos_token_id", 11u32.into()),
        ),
        (
            "eos out of range",
            replace(spm_kvs(), "tokenizer.ggml.eos_token_id", u32::MAX.into()),
        ),
        (
            "bpe without merges",
            replace(spm_kvs(), "tokenizer.ggml.model", "gpt2".into()),
        ),
    ];
    for (what, kvs) in cases {
        match build(kvs) {
            Err(e) => assert!(!e.to_string().is_empty(), "{what}"),
            Ok(_) => panic!("{what}: accepted"),
        }
    }
    // Specific variants for the most common mistakes.
    assert!(matches!(
        build(replace(
            spm_kvs(),
            "tokenizer.ggml.token_type",
            Value::i32_array([1])
        )),
        Err(TokenizerError::LengthMismatch {
            found: 1,
            expected: 11,
            ..
        })
    ));
    assert!(matches!(
        build(replace(
            spm_kvs(),
            "tokenizer.ggml.bos_token_id",
            99u32.into()
        )),
        Err(TokenizerError::SpecialIdOutOfRange { id: 99, .. })
    ));
}

#[test]
fn out_of_range_ids_are_errors_when_decoding() {
    let tok = build(spm_kvs()).expect("builds");
    assert!(matches!(
        tok.decode(&[6, 11]),
        Err(TokenizerError::IdOutOfRange {
            id: 11,
            n_vocab: 11
        })
    ));
    assert!(tok.stream().push(u32::MAX).is_err());
    assert_eq!(tok.token_bytes(11), None);
    assert_eq!(tok.token_text(11), None);
    assert!(!tok.is_eog(11));
}

#[test]
fn byte_level_bpe_from_a_tiny_vocabulary() {
    // Byte-level spelling: 'Ġ' is the space byte.
    let tokens = ["a", "b", "\u{120}", "ab", "\u{120}ab", "<|end|>"];
    let merges = ["a b", "\u{120} ab"];
    let tok = build(vec![
        ("tokenizer.ggml.model", "gpt2".into()),
        ("tokenizer.ggml.pre", "gpt-2".into()),
        ("tokenizer.ggml.tokens", Value::string_array(tokens)),
        (
            "tokenizer.ggml.token_type",
            Value::i32_array([1, 1, 1, 1, 1, 3]),
        ),
        ("tokenizer.ggml.merges", Value::string_array(merges)),
        ("tokenizer.ggml.eos_token_id", 5u32.into()),
    ])
    .expect("builds");
    assert_eq!(tok.encode("ab ab", EncodeOptions::PLAIN), [3, 4]);
    assert_eq!(tok.encode("ab<|end|>", EncodeOptions::PROMPT), [3, 5]);
    // Bytes with no token are dropped, as llama.cpp drops them.
    assert_eq!(tok.encode("a!b", EncodeOptions::PLAIN), [0, 1]);
    assert_eq!(tok.decode(&[4, 5, 3]).expect("in range"), " abab");
    assert!(tok.is_eog(5));
}

#[test]
fn llama3_words_that_are_tokens_skip_merging_and_get_bos() {
    let kvs = |pre: &str| {
        vec![
            ("tokenizer.ggml.model", "gpt2".into()),
            ("tokenizer.ggml.pre", pre.into()),
            (
                "tokenizer.ggml.tokens",
                Value::string_array(["a", "b", "c", "ab", "bc", "abc", "<|begin_of_text|>"]),
            ),
            (
                "tokenizer.ggml.token_type",
                Value::i32_array([1, 1, 1, 1, 1, 1, 3]),
            ),
            ("tokenizer.ggml.merges", Value::string_array(["b c"])),
            ("tokenizer.ggml.bos_token_id", 6u32.into()),
        ]
    };
    let llama3 = build(kvs("llama-bpe")).expect("builds");
    assert_eq!(llama3.encode("abc", EncodeOptions::PROMPT), [6, 5]);
    let gpt2 = build(kvs("gpt-2")).expect("builds");
    assert_eq!(gpt2.encode("abc", EncodeOptions::PROMPT), [0, 4]);
}

#[test]
fn tokenizer_and_template_can_be_shared_across_threads() {
    fn shareable<T: Send + Sync>() {}
    shareable::<Tokenizer>();
    shareable::<fish_core::chat::ChatTemplate>();
}
