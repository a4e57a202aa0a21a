//! Reading the `tokenizer.ggml.*` keys, with every shape problem reported.

use fish_gguf::{ArrayRef, Gguf};

use super::error::TokenizerError;
use super::specials::SpecialIds;
use super::vocab::TokenKind;

pub(crate) const MODEL: &str = "tokenizer.ggml.model";
pub(crate) const PRE: &str = "tokenizer.ggml.pre";
pub(crate) const TOKENS: &str = "tokenizer.ggml.tokens";
pub(crate) const TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
pub(crate) const SCORES: &str = "tokenizer.ggml.scores";
pub(crate) const MERGES: &str = "tokenizer.ggml.merges";
pub(crate) const ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
pub(crate) const ADD_EOS: &str = "tokenizer.ggml.add_eos_token";
pub(crate) const ADD_SPACE_PREFIX: &str = "tokenizer.ggml.add_space_prefix";

/// Which tokenizer algorithm the file asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenizerModel {
    /// Byte-level BPE with merges (`gpt2`).
    ByteLevelBpe,
    /// SentencePiece-style scored BPE with byte fallback (`llama`).
    SentencePiece,
}

pub(crate) fn model(g: &Gguf) -> Result<TokenizerModel, TokenizerError> {
    match g.opt_str(MODEL)? {
        None => Err(TokenizerError::MissingKey { key: MODEL }),
        Some("gpt2") => Ok(TokenizerModel::ByteLevelBpe),
        Some("llama") => Ok(TokenizerModel::SentencePiece),
        Some(other) => Err(TokenizerError::UnsupportedModel(other.to_string())),
    }
}

pub(crate) fn string_array<'g>(
    g: &'g Gguf,
    key: &'static str,
) -> Result<Option<ArrayRef<'g>>, TokenizerError> {
    let Some(a) = g.opt_array(key)? else {
        return Ok(None);
    };
    if a.strings().is_none() {
        return Err(TokenizerError::WrongType {
            key,
            expected: "array of strings",
        });
    }
    Ok(Some(a))
}

/// Token kinds, all `Normal` when the file has no type array.
pub(crate) fn kinds(g: &Gguf, n: usize) -> Result<Vec<TokenKind>, TokenizerError> {
    let Some(a) = g.opt_array(TOKEN_TYPE)? else {
        return Ok(vec![TokenKind::Normal; n]);
    };
    let codes = a.to_i64_vec().ok_or(TokenizerError::WrongType {
        key: TOKEN_TYPE,
        expected: "array of integers",
    })?;
    check_len(TOKEN_TYPE, codes.len(), n)?;
    Ok(codes.into_iter().map(TokenKind::from_code).collect())
}

/// Token scores, all zero when the file has none.
pub(crate) fn scores(g: &Gguf, n: usize) -> Result<Vec<f32>, TokenizerError> {
    let Some(a) = g.opt_array(SCORES)? else {
        return Ok(vec![0.0; n]);
    };
    let scores = a.to_f32_vec().ok_or(TokenizerError::WrongType {
        key: SCORES,
        expected: "array of numbers",
    })?;
    check_len(SCORES, scores.len(), n)?;
    Ok(scores)
}

fn check_len(key: &'static str, found: usize, expected: usize) -> Result<(), TokenizerError> {
    if found == expected {
        Ok(())
    } else {
        Err(TokenizerError::LengthMismatch {
            key,
            found,
            expected,
        })
    }
}

/// One role id: the file's value (which must be in range), else the model
/// family's default where that is in range.
fn special_id(
    g: &Gguf,
    key: &'static str,
    default: Option<u32>,
    n_vocab: usize,
) -> Result<Option<u32>, TokenizerError> {
    match g.opt_u64(key)? {
        Some(id) if id < n_vocab as u64 => Ok(Some(id as u32)),
        Some(id) => Err(TokenizerError::SpecialIdOutOfRange { key, id, n_vocab }),
        None => Ok(default.filter(|&d| (d as usize) < n_vocab)),
    }
}

/// Reads the role ids. Defaults follow llama.cpp: SentencePiece models use
/// bos 1, eos 2, unk 0; byte-level BPE models use 11 for bos and eos.
pub(crate) fn special_ids(
    g: &Gguf,
    model: TokenizerModel,
    n_vocab: usize,
) -> Result<SpecialIds, TokenizerError> {
    let (bos, eos, unk) = match model {
        TokenizerModel::SentencePiece => (Some(1), Some(2), Some(0)),
        TokenizerModel::ByteLevelBpe => (Some(11), Some(11), None),
    };
    Ok(SpecialIds {
        bos: special_id(g, "tokenizer.ggml.bos_token_id", bos, n_vocab)?,
        eos: special_id(g, "tokenizer.ggml.eos_token_id", eos, n_vocab)?,
        eot: special_id(g, "tokenizer.ggml.eot_token_id", None, n_vocab)?,
        eom: special_id(g, "tokenizer.ggml.eom_token_id", None, n_vocab)?,
        unknown: special_id(g, "tokenizer.ggml.unknown_token_id", unk, n_vocab)?,
        padding: special_id(g, "tokenizer.ggml.padding_token_id", None, n_vocab)?,
    })
}
