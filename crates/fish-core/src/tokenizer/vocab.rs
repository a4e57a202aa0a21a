//! The vocabulary: token texts, kinds and scores, and a text -> id index.
//!
//! Texts live in one buffer with an offset table, so a 262k-token vocabulary
//! costs two allocations instead of 262k small strings.

use super::hash::hash_bytes;

/// What a token is, from `tokenizer.ggml.token_type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TokenKind {
    /// An ordinary piece of text.
    Normal,
    /// The unknown-token placeholder.
    Unknown,
    /// A control token (`<|im_start|>`, `<eos>`): cut out of prompts only when
    /// specials are parsed, never printed in generated text.
    Control,
    /// A user-defined token: always cut out of prompts as a unit, printed verbatim.
    UserDefined,
    /// A reserved slot that never appears in real text.
    Unused,
    /// A SentencePiece byte-fallback token `<0xNN>`.
    Byte,
    /// Type 0 or any code this reader does not know.
    Undefined,
}

impl TokenKind {
    /// Decodes a GGUF token type code (the values llama.cpp's converters write).
    pub(crate) fn from_code(code: i64) -> Self {
        match code {
            1 => TokenKind::Normal,
            2 => TokenKind::Unknown,
            3 => TokenKind::Control,
            4 => TokenKind::UserDefined,
            5 => TokenKind::Unused,
            6 => TokenKind::Byte,
            _ => TokenKind::Undefined,
        }
    }

    /// Tokens that the special-token pass may cut out of prompt text.
    pub(crate) fn is_special(self) -> bool {
        matches!(
            self,
            TokenKind::Control | TokenKind::UserDefined | TokenKind::Unknown
        )
    }
}

const EMPTY_SLOT: u64 = u64::MAX;
/// The hash bits stored beside an id; ids stay below `u32::MAX`, so a stored
/// slot never equals `EMPTY_SLOT`.
const TAG_MASK: u64 = 0xFFFF_FFFF_0000_0000;

pub(crate) struct Vocab {
    /// All token texts back to back.
    text: String,
    /// `starts[i]..starts[i + 1]` is token i's text; `n + 1` entries.
    starts: Vec<usize>,
    pub(crate) kinds: Vec<TokenKind>,
    /// One score per token (zeros when the file has none).
    scores: Vec<f32>,
    /// Open-addressing table keyed by text: each slot holds a token id in the
    /// low half and the high half of its text's hash above it, so most probes
    /// are decided without touching the text; `EMPTY_SLOT` is free.
    slots: Vec<u64>,
}

impl Vocab {
    /// Builds the vocabulary. `texts`, `kinds` and `scores` have equal lengths
    /// (checked by the caller). Empty texts are renamed `[EMPTY_i]` so that every
    /// token stays addressable by text.
    pub(crate) fn new<'a>(
        texts: impl Iterator<Item = &'a str>,
        n: usize,
        kinds: Vec<TokenKind>,
        scores: Vec<f32>,
    ) -> Self {
        let mut text = String::new();
        let mut starts = Vec::with_capacity(n + 1);
        starts.push(0);
        for (i, t) in texts.enumerate() {
            if t.is_empty() {
                text.push_str(&format!("[EMPTY_{i}]"));
            } else {
                text.push_str(t);
            }
            starts.push(text.len());
        }
        let capacity = (starts.len() * 2).next_power_of_two().max(16);
        let mut vocab = Vocab {
            text,
            starts,
            kinds,
            scores,
            slots: vec![EMPTY_SLOT; capacity],
        };
        for id in 0..vocab.len() as u32 {
            vocab.index_insert(id);
        }
        vocab
    }

    pub(crate) fn len(&self) -> usize {
        self.starts.len() - 1
    }

    /// The stored text of a token; `id` must be in range.
    pub(crate) fn text(&self, id: u32) -> &str {
        let i = id as usize;
        &self.text[self.starts[i]..self.starts[i + 1]]
    }

    pub(crate) fn kind(&self, id: u32) -> TokenKind {
        self.kinds[id as usize]
    }

    pub(crate) fn score(&self, id: u32) -> f32 {
        self.scores[id as usize]
    }

    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    /// Inserts `id`; a later token with the same text replaces an earlier one,
    /// as in the reference implementation's map.
    fn index_insert(&mut self, id: u32) {
        let key = self.text(id).as_bytes();
        let hash = hash_bytes(key);
        let tag = hash & TAG_MASK;
        let mask = self.mask();
        let mut pos = hash as usize & mask;
        loop {
            let slot = self.slots[pos];
            if slot == EMPTY_SLOT
                || (slot & TAG_MASK == tag && self.text(slot as u32).as_bytes() == key)
            {
                self.slots[pos] = tag | u64::from(id);
                return;
            }
            pos = (pos + 1) & mask;
        }
    }

    /// The id of the token whose text is exactly `key`.
    pub(crate) fn lookup(&self, key: &[u8]) -> Option<u32> {
        let hash = hash_bytes(key);
        let tag = hash & TAG_MASK;
        let mask = self.mask();
        let mut pos = hash as usize & mask;
        loop {
            let slot = self.slots[pos];
            if slot == EMPTY_SLOT {
                return None;
            }
            let id = slot as u32;
            if slot & TAG_MASK == tag && self.text(id).as_bytes() == key {
                return Some(id);
            }
            pos = (pos + 1) & mask;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab(texts: &[&str]) -> Vocab {
        let n = texts.len();
        Vocab::new(
            texts.iter().copied(),
            n,
            vec![TokenKind::Normal; n],
            vec![0.0; n],
        )
    }

    #[test]
    fn lookup_finds_every_token_and_nothing_else() {
        let v = vocab(&["a", "b", "ab", "abc", "<s>"]);
        for id in 0..5 {
            assert_eq!(v.lookup(v.text(id).as_bytes()), Some(id));
        }
        assert_eq!(v.lookup(b"abcd"), None);
        assert_eq!(v.lookup(b""), None);
    }

    #[test]
    fn duplicate_texts_resolve_to_the_last_id_and_empty_texts_are_renamed() {
        let v = vocab(&["x", "", "x"]);
        assert_eq!(v.lookup(b"x"), Some(2));
        assert_eq!(v.text(1), "[EMPTY_1]");
    }
}
