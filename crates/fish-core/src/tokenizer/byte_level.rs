//! GPT-2's byte-level alphabet: every byte maps to one printable character,
//! so BPE vocabularies can store arbitrary bytes as text.
//!
//! Printable Latin-1 bytes (`!`..`~`, `¡`..`¬`, `®`..`ÿ`) stand for
//! themselves; the other 68 bytes are assigned U+0100, U+0101, ... in byte order.

/// Every mapped code point is below this bound: the 68 moved bytes take
/// U+0100..=U+0143.
const MAX_MAPPED: usize = 256 + 68;

pub(crate) struct ByteLevel {
    to_char: [char; 256],
    /// Indexed by code point; `None` for characters outside the alphabet.
    to_byte: [Option<u8>; MAX_MAPPED],
}

fn stands_for_itself(b: u8) -> bool {
    matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF)
}

impl ByteLevel {
    pub(crate) fn new() -> Self {
        let mut to_char = ['\0'; 256];
        let mut to_byte = [None; MAX_MAPPED];
        let mut next_extra = 256u32;
        for b in 0..=255u8 {
            let cp = if stands_for_itself(b) {
                u32::from(b)
            } else {
                let cp = next_extra;
                next_extra += 1;
                cp
            };
            // Every code point here is below 0x150, so always a valid char.
            let c = char::from_u32(cp).unwrap_or('\u{FFFD}');
            to_char[b as usize] = c;
            to_byte[cp as usize] = Some(b);
        }
        ByteLevel { to_char, to_byte }
    }

    /// Appends the byte-level spelling of `bytes` to `out`.
    pub(crate) fn encode_into(&self, bytes: &[u8], out: &mut String) {
        out.extend(bytes.iter().map(|&b| self.to_char[b as usize]));
    }

    /// The byte a character stands for, if it is in the alphabet.
    pub(crate) fn byte_of(&self, c: char) -> Option<u8> {
        self.to_byte.get(c as usize).copied().flatten()
    }

    /// Decodes a byte-level token text to bytes. Characters outside the alphabet
    /// (malformed vocabularies) are kept as their UTF-8 bytes.
    pub(crate) fn decode_into(&self, text: &str, out: &mut Vec<u8>) {
        for c in text.chars() {
            match self.byte_of(c) {
                Some(b) => out.push(b),
                None => {
                    let mut buf = [0u8; 4];
                    out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_characters_of_the_alphabet() {
        let bl = ByteLevel::new();
        let mut s = String::new();
        bl.encode_into(b" \n\t!", &mut s);
        assert_eq!(s, "\u{120}\u{10A}\u{109}!");
        assert_eq!(bl.byte_of('\u{120}'), Some(b' '));
        assert_eq!(bl.byte_of('\u{144}'), None);
    }

    #[test]
    fn every_byte_round_trips() {
        let bl = ByteLevel::new();
        let all: Vec<u8> = (0..=255).collect();
        let mut s = String::new();
        bl.encode_into(&all, &mut s);
        assert_eq!(s.chars().count(), 256);
        let mut back = Vec::new();
        bl.decode_into(&s, &mut back);
        assert_eq!(back, all);
    }
}
