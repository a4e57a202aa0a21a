//! Pre-tokenization of byte-level BPE models: text is cut into words with the
//! split patterns that `tokenizer.ggml.pre` names, and BPE runs inside each word.
//!
//! A pre-tokenizer is a chain of patterns. Each stage cuts every piece from
//! the previous stage further; text between two matches becomes a piece of its
//! own, so no byte is ever dropped. The patterns are those llama.cpp uses for
//! each pre-tokenizer name (with `(?i:...)` spelled out as character classes,
//! as llama.cpp does), which keeps token ids identical to llama.cpp's.

use fancy_regex::Regex;

use super::error::TokenizerError;

/// GPT-2's word pattern: contractions, letters, digits, other symbols, spaces.
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";

/// Llama 3's pattern: case-insensitive contractions, up to three digits per word,
/// newlines kept with the punctuation or whitespace before them.
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen 2's pattern: like Llama 3's but every digit is a word of its own.
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The pre-tokenizer families. Several `tokenizer.ggml.pre` names share one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreTokenizerKind {
    /// llama.cpp's fallback for unknown names: punctuation runs, GPT-2 words,
    /// digit runs, then groups of three ASCII digits.
    Default,
    /// GPT-2 words (gpt-2, phi-2, mpt, olmo, ...).
    Gpt2,
    /// Every digit alone, then GPT-2 words (smollm, starcoder, refact, command-r, ...).
    StarCoder,
    /// Llama 3's pattern (llama-bpe, llama3, dbrx, smaug-bpe, ...).
    Llama3,
    /// Qwen 2's pattern (qwen2, stablelm2, deepseek-r1-qwen, ...).
    Qwen2,
}

/// What a `tokenizer.ggml.pre` name implies besides the split patterns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PreTokenizerConfig {
    pub(crate) kind: PreTokenizerKind,
    /// A word that is already a token is emitted whole, without merging.
    pub(crate) ignore_merges: bool,
    /// BOS is added unless `tokenizer.ggml.add_bos_token` says otherwise.
    pub(crate) default_add_bos: bool,
}

impl PreTokenizerConfig {
    /// Maps a `tokenizer.ggml.pre` value to its family; unknown or missing
    /// names get the default family, as in llama.cpp.
    pub(crate) fn from_name(name: Option<&str>) -> Self {
        use PreTokenizerKind::*;
        let plain = |kind| PreTokenizerConfig {
            kind,
            ignore_merges: false,
            default_add_bos: false,
        };
        match name.unwrap_or("default") {
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral"
            | "midm-2.0" | "lfm2" => PreTokenizerConfig {
                kind: Llama3,
                ignore_merges: true,
                default_add_bos: true,
            },
            "dbrx" | "smaug-bpe" => plain(Llama3),
            "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es"
            | "jina-v2-de" | "a.x-4.0" | "mellum" | "modern-bert" | "mpt" | "olmo" | "jais"
            | "trillion" | "granite-docling" | "exaone4" => plain(Gpt2),
            "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone"
            | "minerva-7b" => plain(StarCoder),
            "qwen2" | "deepseek-r1-qwen" | "kormo" | "stablelm2" | "megrez" | "hunyuan"
            | "solar-open" => plain(Qwen2),
            _ => plain(Default),
        }
    }
}

impl PreTokenizerKind {
    fn patterns(self) -> &'static [&'static str] {
        match self {
            PreTokenizerKind::Default => {
                &[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"]
            }
            PreTokenizerKind::Gpt2 => &[GPT2],
            PreTokenizerKind::StarCoder => &[r"\p{N}", GPT2],
            PreTokenizerKind::Llama3 => &[LLAMA3],
            PreTokenizerKind::Qwen2 => &[QWEN2],
        }
    }
}

pub(crate) struct PreTokenizer {
    kind: PreTokenizerKind,
    stages: Vec<Regex>,
}

impl PreTokenizer {
    pub(crate) fn new(kind: PreTokenizerKind) -> Result<Self, TokenizerError> {
        let stages = kind
            .patterns()
            .iter()
            .map(|p| {
                Regex::new(p).map_err(|e| TokenizerError::BadPattern {
                    pattern: (*p).to_string(),
                    message: e.to_string(),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(PreTokenizer { kind, stages })
    }

    pub(crate) fn kind(&self) -> PreTokenizerKind {
        self.kind
    }

    /// Cuts `text` into words; the words concatenate back to `text`.
    pub(crate) fn split<'t>(&self, text: &'t str) -> Vec<&'t str> {
        let mut pieces = vec![text];
        let mut next = Vec::new();
        for stage in &self.stages {
            next.clear();
            for piece in &pieces {
                split_one(stage, piece, &mut next);
            }
            std::mem::swap(&mut pieces, &mut next);
        }
        pieces
    }
}

/// Splits one piece at the matches of `re`, keeping the text between matches.
fn split_one<'t>(re: &Regex, piece: &'t str, out: &mut Vec<&'t str>) {
    let mut last = 0;
    for m in re.find_iter(piece) {
        // A matcher error (backtracking limit) cannot happen with these
        // patterns; if it ever did, the rest of the piece stays one word.
        let Ok(m) = m else { break };
        if m.start() > last {
            out.push(&piece[last..m.start()]);
        }
        if m.end() > m.start() {
            out.push(m.as_str());
        }
        last = m.end();
    }
    if last < piece.len() {
        out.push(&piece[last..]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(kind: PreTokenizerKind, text: &str) -> Vec<String> {
        let p = PreTokenizer::new(kind).expect("patterns compile");
        let words = p.split(text);
        assert_eq!(words.concat(), text, "words must cover the text");
        words.into_iter().map(str::to_string).collect()
    }

    #[test]
    fn gpt2_words() {
        assert_eq!(
            split(PreTokenizerKind::Gpt2, "Hello world's  end!\n"),
            ["Hello", " world", "'s", " ", " end", "!", "\n"]
        );
    }

    #[test]
    fn starcoder_isolates_digits() {
        assert_eq!(
            split(PreTokenizerKind::StarCoder, "abc 1234"),
            ["abc", " ", "1", "2", "3", "4"]
        );
    }

    #[test]
    fn llama3_groups_three_digits_and_keeps_newlines() {
        assert_eq!(
            split(PreTokenizerKind::Llama3, "x 12345\n\nWe'RE"),
            ["x", " ", "123", "45", "\n\n", "We", "'RE"]
        );
    }

    #[test]
    fn qwen2_single_digits() {
        assert_eq!(
            split(PreTokenizerKind::Qwen2, "a 42."),
            ["a", " ", "4", "2", "."]
        );
    }

    #[test]
    fn default_family_for_unknown_names() {
        let c = PreTokenizerConfig::from_name(Some("no-such-pre"));
        assert_eq!(c.kind, PreTokenizerKind::Default);
        assert_eq!(
            split(PreTokenizerKind::Default, "a+b 12345"),
            ["a", "+", "b", " ", "123", "45"]
        );
        let l = PreTokenizerConfig::from_name(Some("llama-bpe"));
        assert!(l.ignore_merges && l.default_add_bos);
    }
}
