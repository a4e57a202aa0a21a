//! A small, fast, non-cryptographic hash for vocabulary lookups.
//!
//! Vocabularies come from files, not from an adversary who times the
//! tokenizer, so a multiply-rotate hash in the style of FxHash is enough and
//! keeps building the tables for a 150k-token vocabulary cheap.

use std::hash::{BuildHasherDefault, Hasher};

const SEED: u64 = 0x517c_c1b7_2722_0a95;

fn mix(h: u64, word: u64) -> u64 {
    (h.rotate_left(5) ^ word).wrapping_mul(SEED)
}

fn le_word(bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .rev()
        .fold(0u64, |acc, &b| (acc << 8) | u64::from(b))
}

/// Hashes a byte string; used by the text -> id index.
pub(crate) fn hash_bytes(bytes: &[u8]) -> u64 {
    let mut h = mix(0, bytes.len() as u64);
    let mut chunks = bytes.chunks_exact(8);
    for chunk in &mut chunks {
        h = mix(h, le_word(chunk));
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        h = mix(h, le_word(rest));
    }
    // Fold the well-mixed high bits down: the index takes the low bits.
    h ^ (h >> 32)
}

/// A `Hasher` for integer keys (merge pairs packed into a u64).
#[derive(Default, Clone, Copy)]
pub(crate) struct IntHasher(u64);

impl Hasher for IntHasher {
    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 32)
    }

    fn write(&mut self, bytes: &[u8]) {
        self.0 = mix(self.0, le_word(bytes));
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = mix(self.0, n);
    }

    fn write_u32(&mut self, n: u32) {
        self.0 = mix(self.0, u64::from(n));
    }
}

pub(crate) type IntBuildHasher = BuildHasherDefault<IntHasher>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_inputs_hash_equal_and_lengths_matter() {
        assert_eq!(hash_bytes(b"hello"), hash_bytes(b"hello"));
        assert_ne!(hash_bytes(b"a"), hash_bytes(b"a\0"));
        assert_ne!(hash_bytes(b""), hash_bytes(b"\0"));
    }
}
