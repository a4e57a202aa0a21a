//! Byte-level BPE (`tokenizer.ggml.model = "gpt2"`).
//!
//! Each pre-tokenized word is spelled in the byte-level alphabet, split into
//! characters, and the adjacent pair with the lowest merge rank is merged
//! until no listed merge applies (ties go to the leftmost pair). Merges are
//! keyed by the ids of their two halves, so the hot loop hashes integers, not strings.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use super::byte_level::ByteLevel;
use super::error::TokenizerError;
use super::hash::IntBuildHasher;
use super::pretokenize::{PreTokenizer, PreTokenizerConfig};
use super::vocab::Vocab;

/// Marks a symbol whose text is not a token (possible only in malformed vocabularies).
const NO_TOKEN: u32 = u32::MAX;

pub(crate) struct BpeModel {
    /// Merge rank by the ids of the two halves.
    merges: HashMap<u64, u32, IntBuildHasher>,
    byte_level: ByteLevel,
    pre: PreTokenizer,
    ignore_merges: bool,
}

fn pair_key(left: u32, right: u32) -> u64 {
    (u64::from(left) << 32) | u64::from(right)
}

impl BpeModel {
    /// Builds the merge table from `tokenizer.ggml.merges` ("left right" per
    /// line, rank = line number). A merge whose halves are not tokens can never
    /// apply and is skipped; for duplicate pairs the first (lowest) rank wins.
    /// The token a pair becomes is looked up only when a merge happens, which
    /// keeps loading to one table insert per merge.
    pub(crate) fn new<'a>(
        vocab: &Vocab,
        merges: impl Iterator<Item = &'a str>,
        n_merges: usize,
        pre: PreTokenizerConfig,
    ) -> Result<Self, TokenizerError> {
        let mut table = HashMap::with_capacity_and_hasher(n_merges, IntBuildHasher::default());
        for (rank, line) in merges.enumerate() {
            // The separator is the first space after the first character, so a
            // left half may itself start with a space.
            let Some(sep) = line.bytes().skip(1).position(|b| b == b' ').map(|p| p + 1) else {
                continue;
            };
            let (left, right) = (&line[..sep], &line[sep + 1..]);
            let (Some(l), Some(r)) = (
                vocab.lookup(left.as_bytes()),
                vocab.lookup(right.as_bytes()),
            ) else {
                continue;
            };
            table.entry(pair_key(l, r)).or_insert(rank as u32);
        }
        Ok(BpeModel {
            merges: table,
            byte_level: ByteLevel::new(),
            pre: PreTokenizer::new(pre.kind)?,
            ignore_merges: pre.ignore_merges,
        })
    }

    pub(crate) fn byte_level(&self) -> &ByteLevel {
        &self.byte_level
    }

    pub(crate) fn pre_tokenizer(&self) -> &PreTokenizer {
        &self.pre
    }

    /// Tokenizes one fragment of plain text (no special tokens inside).
    pub(crate) fn encode(&self, vocab: &Vocab, text: &str, out: &mut Vec<u32>) {
        let mut scratch = Scratch::default();
        let mut spelled = String::new();
        for word in self.pre.split(text) {
            spelled.clear();
            self.byte_level.encode_into(word.as_bytes(), &mut spelled);
            self.encode_word(vocab, &spelled, &mut scratch, out);
        }
    }

    fn encode_word(&self, vocab: &Vocab, word: &str, s: &mut Scratch, out: &mut Vec<u32>) {
        if self.ignore_merges {
            if let Some(id) = vocab.lookup(word.as_bytes()) {
                out.push(id);
                return;
            }
        }
        s.symbols.clear();
        s.queue.clear();
        for (start, c) in word.char_indices() {
            let len = c.len_utf8();
            let id = vocab
                .lookup(&word.as_bytes()[start..start + len])
                .unwrap_or(NO_TOKEN);
            s.symbols.push(Symbol {
                start,
                len,
                id,
                prev: NONE,
                next: NONE,
            });
        }
        let n = s.symbols.len();
        for i in 0..n {
            s.symbols[i].prev = if i == 0 { NONE } else { i - 1 };
            s.symbols[i].next = if i + 1 == n { NONE } else { i + 1 };
        }
        for i in 1..n {
            self.push_pair(s, i - 1, i);
        }
        while let Some(pair) = s.queue.pop() {
            let (l, r) = (pair.left, pair.right);
            // Skip pairs made stale by an earlier merge of either side.
            if s.symbols[l].len == 0
                || s.symbols[r].len == 0
                || s.symbols[l].len + s.symbols[r].len != pair.len
            {
                continue;
            }
            let right = s.symbols[r];
            let left = &mut s.symbols[l];
            left.len += right.len;
            let merged = &word.as_bytes()[left.start..left.start + left.len];
            left.id = vocab.lookup(merged).unwrap_or(NO_TOKEN);
            left.next = right.next;
            s.symbols[r].len = 0;
            if right.next != NONE {
                s.symbols[right.next].prev = l;
            }
            let prev = s.symbols[l].prev;
            if prev != NONE {
                self.push_pair(s, prev, l);
            }
            if right.next != NONE {
                self.push_pair(s, l, right.next);
            }
        }
        let mut i = if n == 0 { NONE } else { 0 };
        while i != NONE {
            let sym = s.symbols[i];
            if sym.id != NO_TOKEN {
                out.push(sym.id);
            } else {
                // Not a token: fall back to single-byte tokens where they exist.
                for &b in &word.as_bytes()[sym.start..sym.start + sym.len] {
                    if let Some(id) = vocab.lookup(&[b]) {
                        out.push(id);
                    }
                }
            }
            i = sym.next;
        }
    }

    fn push_pair(&self, s: &mut Scratch, left: usize, right: usize) {
        let (a, b) = (s.symbols[left].id, s.symbols[right].id);
        if a == NO_TOKEN || b == NO_TOKEN {
            return;
        }
        if let Some(&rank) = self.merges.get(&pair_key(a, b)) {
            s.queue.push(Pair {
                rank,
                left,
                right,
                len: s.symbols[left].len + s.symbols[right].len,
            });
        }
    }
}

const NONE: usize = usize::MAX;

#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    /// Length in bytes; 0 once merged into its left neighbour.
    len: usize,
    id: u32,
    prev: usize,
    next: usize,
}

#[derive(Clone, Copy, PartialEq, Eq)]
struct Pair {
    rank: u32,
    left: usize,
    right: usize,
    len: usize,
}

impl Ord for Pair {
    /// The heap pops the greatest element: lowest rank first, then leftmost.
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .rank
            .cmp(&self.rank)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Pair {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

#[derive(Default)]
struct Scratch {
    symbols: Vec<Symbol>,
    queue: BinaryHeap<Pair>,
}
