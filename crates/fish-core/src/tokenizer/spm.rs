//! SentencePiece-style BPE (`tokenizer.ggml.model = "llama"`), as used by
//! Llama 1/2 and Gemma.
//!
//! Spaces are written as `▁`, the text is split into characters, and the
//! adjacent pair whose concatenation is the highest-scoring token is merged
//! until no pair forms a token (ties go to the leftmost pair). Characters that
//! never became a token are emitted as byte-fallback tokens `<0xNN>`.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::vocab::Vocab;

/// The SentencePiece whitespace marker.
pub(crate) const SPACE_MARKER: &str = "\u{2581}";

pub(crate) struct SpmModel {
    /// `<0xNN>` token per byte, or the token spelled as that single byte.
    byte_tokens: [Option<u32>; 256],
    unknown: Option<u32>,
}

impl SpmModel {
    pub(crate) fn new(vocab: &Vocab, unknown: Option<u32>) -> Self {
        let mut byte_tokens = [None; 256];
        for (b, slot) in byte_tokens.iter_mut().enumerate() {
            let hex = format!("<0x{b:02X}>");
            *slot = vocab
                .lookup(hex.as_bytes())
                .or_else(|| vocab.lookup(&[b as u8]));
        }
        SpmModel {
            byte_tokens,
            unknown,
        }
    }

    /// The token that stands for one raw byte.
    pub(crate) fn byte_token(&self, b: u8) -> Option<u32> {
        self.byte_tokens[b as usize].or(self.unknown)
    }

    /// Tokenizes one fragment whose spaces are already escaped to `▁`.
    pub(crate) fn encode(&self, vocab: &Vocab, text: &str, out: &mut Vec<u32>) {
        let mut symbols: Vec<Symbol> = text
            .char_indices()
            .map(|(start, c)| Symbol {
                start,
                len: c.len_utf8(),
                id: None,
                prev: NONE,
                next: NONE,
            })
            .collect();
        let n = symbols.len();
        for (i, s) in symbols.iter_mut().enumerate() {
            s.prev = if i == 0 { NONE } else { i - 1 };
            s.next = if i + 1 == n { NONE } else { i + 1 };
        }
        let mut queue = BinaryHeap::new();
        for i in 1..n {
            push_pair(vocab, text, &symbols, &mut queue, i - 1, i);
        }
        while let Some(pair) = queue.pop() {
            let (l, r) = (pair.left, pair.right);
            if symbols[l].len == 0
                || symbols[r].len == 0
                || symbols[l].len + symbols[r].len != pair.len
            {
                continue;
            }
            let right = symbols[r];
            symbols[l].len += right.len;
            symbols[l].id = Some(pair.id);
            symbols[l].next = right.next;
            symbols[r].len = 0;
            if right.next != NONE {
                symbols[right.next].prev = l;
            }
            let prev = symbols[l].prev;
            if prev != NONE {
                push_pair(vocab, text, &symbols, &mut queue, prev, l);
            }
            if right.next != NONE {
                push_pair(vocab, text, &symbols, &mut queue, l, right.next);
            }
        }
        let mut i = if n == 0 { NONE } else { 0 };
        while i != NONE {
            let sym = symbols[i];
            let bytes = &text.as_bytes()[sym.start..sym.start + sym.len];
            match sym.id.or_else(|| vocab.lookup(bytes)) {
                Some(id) => out.push(id),
                None => out.extend(bytes.iter().filter_map(|&b| self.byte_token(b))),
            }
            i = sym.next;
        }
    }
}

fn push_pair(
    vocab: &Vocab,
    text: &str,
    symbols: &[Symbol],
    queue: &mut BinaryHeap<Pair>,
    left: usize,
    right: usize,
) {
    let start = symbols[left].start;
    let len = symbols[left].len + symbols[right].len;
    // Adjacent live symbols are contiguous in the text.
    let Some(id) = vocab.lookup(&text.as_bytes()[start..start + len]) else {
        return;
    };
    queue.push(Pair {
        score: vocab.score(id),
        left,
        right,
        len,
        id,
    });
}

const NONE: usize = usize::MAX;

#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    id: Option<u32>,
    prev: usize,
    next: usize,
}

#[derive(Clone, Copy)]
struct Pair {
    score: f32,
    left: usize,
    right: usize,
    len: usize,
    id: u32,
}

impl PartialEq for Pair {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Pair {}

impl Ord for Pair {
    /// Highest score first, then leftmost. NaN scores compare as equal.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .partial_cmp(&other.score)
            .unwrap_or(Ordering::Equal)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Pair {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
