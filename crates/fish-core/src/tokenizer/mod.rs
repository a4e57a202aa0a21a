//! The tokenizer stored in a GGUF file, reproducing llama.cpp's token ids.
//!
//! Two algorithms are supported: byte-level BPE (`tokenizer.ggml.model =
//! "gpt2"`, with the pre-tokenizer that `tokenizer.ggml.pre` names) and
//! SentencePiece-style scored BPE with byte fallback (`"llama"`, e.g. Gemma 3).
//! Prompts are first cut at special tokens, then each text fragment is
//! tokenized on its own, exactly as llama.cpp's `llama_tokenize` does.

mod bpe;
mod byte_level;
mod decode;
mod error;
mod hash;
mod metadata;
mod pretokenize;
mod specials;
mod spm;
mod vocab;

use fish_gguf::Gguf;

use bpe::BpeModel;
use decode::Pieces;
use specials::{Fragment, SpecialMatcher};
use spm::{SpmModel, SPACE_MARKER};
use vocab::Vocab;

pub use decode::Utf8Stream;
pub use error::TokenizerError;
pub use metadata::TokenizerModel;
pub use pretokenize::PreTokenizerKind;
pub use specials::SpecialIds;
pub use vocab::TokenKind;

/// How to tokenize a text.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EncodeOptions {
    /// Add BOS (and EOS) as the model's metadata asks.
    pub add_special: bool,
    /// Recognise control tokens such as `<|im_start|>` written in the text.
    /// User-defined tokens are always recognised.
    pub parse_special: bool,
}

impl EncodeOptions {
    /// A prompt as llama.cpp's tools tokenize it: BOS per metadata, specials parsed.
    pub const PROMPT: EncodeOptions = EncodeOptions {
        add_special: true,
        parse_special: true,
    };
    /// Plain text: no BOS/EOS, control-token texts tokenized as ordinary text.
    pub const PLAIN: EncodeOptions = EncodeOptions {
        add_special: false,
        parse_special: false,
    };
}

/// Both engines carry 256-entry byte tables, so they live behind a box.
enum Engine {
    Bpe(Box<BpeModel>),
    Spm(Box<SpmModel>),
}

/// A tokenizer built from a model file; immutable and shareable across threads.
pub struct Tokenizer {
    vocab: Vocab,
    engine: Engine,
    ids: SpecialIds,
    /// Sorted ids that end generation.
    eog: Vec<u32>,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
    specials: SpecialMatcher,
    pieces: Pieces,
}

impl Tokenizer {
    /// Builds the tokenizer from the `tokenizer.*` metadata of a GGUF file.
    pub fn from_gguf(g: &Gguf) -> Result<Tokenizer, TokenizerError> {
        let model = metadata::model(g)?;
        let tokens =
            metadata::string_array(g, metadata::TOKENS)?.ok_or(TokenizerError::MissingKey {
                key: metadata::TOKENS,
            })?;
        let n = tokens.len();
        if n == 0 {
            return Err(TokenizerError::EmptyVocab);
        }
        // Ids are u32 and u32::MAX marks "no token" inside the engines.
        let max = (u32::MAX - 1) as usize;
        if n > max {
            return Err(TokenizerError::VocabTooLarge { n, max });
        }
        let kinds = metadata::kinds(g, n)?;
        let scores = metadata::scores(g, n)?;
        let texts = tokens.strings().into_iter().flatten();
        let mut vocab = Vocab::new(texts, n, kinds, scores);

        let mut ids = metadata::special_ids(g, model, n)?;
        let pre_name = g.opt_str(metadata::PRE)?;
        let (engine, default_add_bos, default_space_prefix) = match model {
            TokenizerModel::ByteLevelBpe => {
                let merges = metadata::string_array(g, metadata::MERGES)?.ok_or(
                    TokenizerError::MissingKey {
                        key: metadata::MERGES,
                    },
                )?;
                let pre = pretokenize::PreTokenizerConfig::from_name(pre_name);
                let lines = merges.strings().into_iter().flatten();
                let bpe = BpeModel::new(&vocab, lines, merges.len(), pre)?;
                (Engine::Bpe(Box::new(bpe)), pre.default_add_bos, false)
            }
            TokenizerModel::SentencePiece => (
                Engine::Spm(Box::new(SpmModel::new(&vocab, ids.unknown))),
                true,
                true,
            ),
        };
        let add_bos = g.opt_bool(metadata::ADD_BOS)?.unwrap_or(default_add_bos);
        let add_eos = g.opt_bool(metadata::ADD_EOS)?.unwrap_or(false);
        let add_space_prefix = g
            .opt_bool(metadata::ADD_SPACE_PREFIX)?
            .unwrap_or(default_space_prefix);
        if add_bos && ids.bos.is_none() {
            return Err(TokenizerError::MissingSpecialToken {
                key: metadata::ADD_BOS,
            });
        }
        if add_eos && ids.eos.is_none() {
            return Err(TokenizerError::MissingSpecialToken {
                key: metadata::ADD_EOS,
            });
        }

        let eog = specials::end_of_generation(&mut vocab, &mut ids);
        let specials = SpecialMatcher::new(&vocab);
        let pieces = Pieces::build(n, |id, out| render_piece(&vocab, &engine, id, out));
        Ok(Tokenizer {
            vocab,
            engine,
            ids,
            eog,
            add_bos,
            add_eos,
            add_space_prefix,
            specials,
            pieces,
        })
    }

    /// Tokenizes `text`. Never fails: every byte is representable.
    pub fn encode(&self, text: &str, opts: EncodeOptions) -> Vec<u32> {
        let mut out = Vec::new();
        if opts.add_special && self.add_bos {
            out.extend(self.ids.bos);
        }
        let fragments = self
            .specials
            .partition(&self.vocab, text, opts.parse_special);
        match &self.engine {
            Engine::Bpe(bpe) => {
                for fragment in fragments {
                    match fragment {
                        Fragment::Text(t) => bpe.encode(&self.vocab, t, &mut out),
                        Fragment::Token(id) => out.push(id),
                    }
                }
            }
            Engine::Spm(spm) => self.encode_spm(spm, &fragments, &mut out),
        }
        if opts.add_special && self.add_eos {
            out.extend(self.ids.eos);
        }
        out
    }

    fn encode_spm(&self, spm: &SpmModel, fragments: &[Fragment<'_>], out: &mut Vec<u32>) {
        // A fragment at the start or right after a special token gets the
        // leading space SentencePiece models were trained with, if they ask for it.
        let mut after_special = true;
        let mut escaped = String::new();
        for fragment in fragments {
            match *fragment {
                Fragment::Text(t) => {
                    escaped.clear();
                    if self.add_space_prefix && after_special {
                        escaped.push_str(SPACE_MARKER);
                    }
                    escaped.push_str(&t.replace(' ', SPACE_MARKER));
                    spm.encode(&self.vocab, &escaped, out);
                    after_special = false;
                }
                Fragment::Token(id) => {
                    out.push(id);
                    after_special = true;
                }
            }
        }
    }

    /// The bytes a token prints as in generated text: byte-level and `<0xNN>`
    /// tokens become raw bytes, `▁` a space, control tokens nothing.
    /// `None` for an id outside the vocabulary.
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        self.pieces.get(id)
    }

    /// Decodes generated ids to text (invalid UTF-8 becomes U+FFFD).
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        let mut bytes = Vec::new();
        for &id in ids {
            bytes.extend_from_slice(self.token_bytes(id).ok_or_else(|| self.out_of_range(id))?);
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// A decoder for tokens arriving one at a time.
    pub fn stream(&self) -> TokenStream<'_> {
        TokenStream {
            tokenizer: self,
            utf8: Utf8Stream::new(),
        }
    }

    fn out_of_range(&self, id: u32) -> TokenizerError {
        TokenizerError::IdOutOfRange {
            id,
            n_vocab: self.n_vocab(),
        }
    }

    /// The token's text as stored in the vocabulary (byte-level or `▁` spelling).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        ((id as usize) < self.n_vocab()).then(|| self.vocab.text(id))
    }

    pub fn token_kind(&self, id: u32) -> Option<TokenKind> {
        ((id as usize) < self.n_vocab()).then(|| self.vocab.kind(id))
    }

    /// The id of the token whose stored text is exactly `text`.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.vocab.lookup(text.as_bytes())
    }

    pub fn n_vocab(&self) -> usize {
        self.vocab.len()
    }

    pub fn bos(&self) -> Option<u32> {
        self.ids.bos
    }

    pub fn eos(&self) -> Option<u32> {
        self.ids.eos
    }

    /// All role ids (bos, eos, eot, eom, unknown, padding).
    pub fn special_ids(&self) -> &SpecialIds {
        &self.ids
    }

    /// Whether generating this token ends the turn (eos, eot, eom and the
    /// end-of-text tokens a model's vocabulary is known to use).
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    /// The end-of-generation ids, sorted.
    pub fn eog_ids(&self) -> &[u32] {
        &self.eog
    }

    /// Whether `EncodeOptions::add_special` adds a BOS token.
    pub fn adds_bos(&self) -> bool {
        self.add_bos && self.ids.bos.is_some()
    }

    /// Whether `EncodeOptions::add_special` adds an EOS token.
    pub fn adds_eos(&self) -> bool {
        self.add_eos && self.ids.eos.is_some()
    }

    pub fn model(&self) -> TokenizerModel {
        match self.engine {
            Engine::Bpe(_) => TokenizerModel::ByteLevelBpe,
            Engine::Spm(_) => TokenizerModel::SentencePiece,
        }
    }

    /// The pre-tokenizer family in use (byte-level BPE only).
    pub fn pre_tokenizer(&self) -> Option<PreTokenizerKind> {
        match &self.engine {
            Engine::Bpe(bpe) => Some(bpe.pre_tokenizer().kind()),
            Engine::Spm(_) => None,
        }
    }
}

/// What one token prints as in generated text.
fn render_piece(vocab: &Vocab, engine: &Engine, id: u32, out: &mut Vec<u8>) {
    let text = vocab.text(id);
    match (vocab.kind(id), engine) {
        (TokenKind::UserDefined, _) => out.extend_from_slice(text.as_bytes()),
        (TokenKind::Normal, Engine::Bpe(bpe)) => bpe.byte_level().decode_into(text, out),
        (TokenKind::Normal, Engine::Spm(_)) => {
            let mut pieces = text.split(SPACE_MARKER);
            out.extend_from_slice(pieces.next().unwrap_or_default().as_bytes());
            for piece in pieces {
                out.push(b' ');
                out.extend_from_slice(piece.as_bytes());
            }
        }
        (TokenKind::Byte, Engine::Spm(_)) => out.extend(parse_byte_token(text)),
        // Control, unknown, unused and undefined tokens print nothing.
        _ => {}
    }
}

/// The byte of a `<0xNN>` token.
fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// Decodes generated tokens one at a time, releasing only complete characters.
pub struct TokenStream<'a> {
    tokenizer: &'a Tokenizer,
    utf8: Utf8Stream,
}

impl TokenStream<'_> {
    /// Adds one token and returns the text it completes (possibly empty).
    pub fn push(&mut self, id: u32) -> Result<String, TokenizerError> {
        let bytes = self
            .tokenizer
            .token_bytes(id)
            .ok_or_else(|| self.tokenizer.out_of_range(id))?;
        Ok(self.utf8.push(bytes))
    }

    /// Flushes any incomplete character as U+FFFD.
    pub fn finish(&mut self) -> String {
        self.utf8.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::parse_byte_token;

    #[test]
    fn byte_tokens_parse_only_when_well_formed() {
        assert_eq!(parse_byte_token("<0x0A>"), Some(b'\n'));
        assert_eq!(parse_byte_token("<0xFF>"), Some(0xFF));
        assert_eq!(parse_byte_token("<0x0>"), None);
        assert_eq!(parse_byte_token("<0xZZ>"), None);
        assert_eq!(parse_byte_token("0x0A"), None);
    }
}
