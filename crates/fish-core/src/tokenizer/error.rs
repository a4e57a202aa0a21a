//! Why a tokenizer could not be built from a file, or could not serve a request.

use thiserror::Error;

/// Every way the tokenizer rejects its input. Built from untrusted files, so
/// each problem is reported instead of panicking.
#[derive(Debug, Error)]
pub enum TokenizerError {
    #[error("tokenizer metadata: {0}")]
    Metadata(#[from] fish_gguf::GgufError),
    #[error("tokenizer metadata key {key:?} is missing")]
    MissingKey { key: &'static str },
    #[error("tokenizer metadata key {key:?} has the wrong type: expected {expected}")]
    WrongType {
        key: &'static str,
        expected: &'static str,
    },
    #[error("unsupported tokenizer model {0:?} (supported: gpt2, llama)")]
    UnsupportedModel(String),
    #[error("the vocabulary is empty")]
    EmptyVocab,
    #[error("the vocabulary has {n} tokens; at most {max} are supported")]
    VocabTooLarge { n: usize, max: usize },
    #[error("{key} has {found} entries but the vocabulary has {expected} tokens")]
    LengthMismatch {
        key: &'static str,
        found: usize,
        expected: usize,
    },
    #[error("{key} = {id} is not a token id (the vocabulary has {n_vocab} tokens)")]
    SpecialIdOutOfRange {
        key: &'static str,
        id: u64,
        n_vocab: usize,
    },
    #[error("{key} is set but the model has no such token to add")]
    MissingSpecialToken { key: &'static str },
    #[error("pre-tokenizer pattern {pattern:?} failed to compile: {message}")]
    BadPattern { pattern: String, message: String },
    #[error("token id {id} is out of range (the vocabulary has {n_vocab} tokens)")]
    IdOutOfRange { id: u32, n_vocab: usize },
}
