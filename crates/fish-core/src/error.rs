//! The engine's typed errors.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum EngineError {
    #[error(transparent)]
    Gguf(#[from] fish_gguf::GgufError),
    #[error(transparent)]
    Quant(#[from] fish_quant::QuantError),
    #[error("unsupported architecture {0:?} (supported: llama, qwen2, qwen3, gemma3)")]
    UnsupportedArch(String),
    #[error("missing tensor {0:?}")]
    MissingTensor(String),
    #[error("tensor {name:?} has shape {found:?}, expected {expected:?}")]
    TensorShape {
        name: String,
        found: Vec<u64>,
        expected: Vec<u64>,
    },
    #[error("tensor {name:?} has type {ty}, which the CPU kernels do not support")]
    UnsupportedTensorType {
        name: String,
        ty: fish_gguf::GgmlType,
    },
    #[error("inconsistent hyper-parameter: {0}")]
    BadHyperParameter(String),
    #[error("the prompt has {n_prompt} tokens but the context holds {n_ctx}")]
    PromptTooLong { n_prompt: usize, n_ctx: usize },
    #[error("position {pos} + {n_tok} tokens exceeds the context size {n_ctx}")]
    ContextFull {
        pos: usize,
        n_tok: usize,
        n_ctx: usize,
    },
    #[error("token id {id} is outside the vocabulary of {n_vocab}")]
    BadToken { id: u32, n_vocab: usize },
    /// The device span cannot continue this sequence (another sequence used
    /// it, or the device failed): the session replays its tokens.
    #[error("the GPU span needs the sequence replayed")]
    SpanReplay,
    #[error("empty input: nothing to evaluate")]
    EmptyInput,
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("chat template: {0}")]
    ChatTemplate(String),
    #[error("thread pool: {0}")]
    ThreadPool(String),
}

pub type Result<T> = std::result::Result<T, EngineError>;
