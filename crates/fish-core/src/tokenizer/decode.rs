//! Turning token ids back into text: the bytes each token prints as, and a
//! streaming decoder that holds back incomplete UTF-8 between tokens.

/// The printed bytes of every token, back to back.
pub(crate) struct Pieces {
    bytes: Vec<u8>,
    /// `starts[i]..starts[i + 1]` is token i's piece; `n + 1` entries.
    starts: Vec<usize>,
}

impl Pieces {
    /// Builds the table by asking `render` for each token's bytes.
    pub(crate) fn build(n: usize, mut render: impl FnMut(u32, &mut Vec<u8>)) -> Self {
        let mut bytes = Vec::new();
        let mut starts = Vec::with_capacity(n + 1);
        starts.push(0);
        for id in 0..n as u32 {
            render(id, &mut bytes);
            starts.push(bytes.len());
        }
        Pieces { bytes, starts }
    }

    pub(crate) fn get(&self, id: u32) -> Option<&[u8]> {
        let i = id as usize;
        let end = *self.starts.get(i + 1)?;
        Some(&self.bytes[self.starts[i]..end])
    }
}

/// Accumulates token bytes and releases only complete UTF-8 text, so that a
/// character split across tokens (emoji, CJK via byte tokens) prints whole.
#[derive(Debug, Default, Clone)]
pub struct Utf8Stream {
    pending: Vec<u8>,
}

impl Utf8Stream {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds bytes and returns the text that is now complete. Invalid
    /// sequences come out as U+FFFD; an incomplete tail waits for more bytes.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    // The prefix was just validated; this cannot fail.
                    out.push_str(std::str::from_utf8(valid).unwrap_or_default());
                    match e.error_len() {
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &after[bad..];
                        }
                        None => {
                            rest = after;
                            break;
                        }
                    }
                }
            }
        }
        let keep = rest.len();
        let drop = self.pending.len() - keep;
        self.pending.drain(..drop);
        out
    }

    /// Whether bytes are waiting for the rest of a character.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Flushes what is left; an incomplete character becomes U+FFFD.
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_character_is_held_back_until_complete() {
        let euro = "€".as_bytes();
        let mut s = Utf8Stream::new();
        assert_eq!(s.push(b"a"), "a");
        assert_eq!(s.push(&euro[..1]), "");
        assert!(s.has_pending());
        assert_eq!(s.push(&euro[1..2]), "");
        assert_eq!(s.push(&[euro[2], b'b']), "€b");
        assert!(!s.has_pending());
    }

    #[test]
    fn invalid_bytes_become_replacement_characters() {
        let mut s = Utf8Stream::new();
        assert_eq!(s.push(b"x\xffy"), "x\u{FFFD}y");
        assert_eq!(s.push(b"\xe2\x82"), "");
        assert_eq!(s.finish(), "\u{FFFD}");
        assert_eq!(s.finish(), "");
    }
}
