//! Special tokens: which ids play which role, which ids end generation, and
//! cutting special tokens out of prompt text before normal tokenization.

use super::vocab::{TokenKind, Vocab};

/// Texts that mark an end-of-turn token when `tokenizer.ggml.eot_token_id` is absent.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<\u{ff5c}end\u{2581}of\u{2581}sentence\u{ff5c}>",
    "<end_of_utterance>",
];

/// Texts of tokens that end generation wherever they appear in a vocabulary.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
];

/// Fill-in-the-middle tokens that also end generation (they are what a code
/// model emits when it wants to start another file or repository).
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REPO_TEXTS: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];
const EOM_TEXTS: &[&str] = &["<|eom_id|>"];

/// The ids of the tokens with a role, `None` where the model has none.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpecialIds {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub unknown: Option<u32>,
    pub padding: Option<u32>,
}

/// Finds the lowest id whose text is one of `texts`.
fn find_by_text(vocab: &Vocab, texts: &[&str]) -> Option<u32> {
    texts
        .iter()
        .filter_map(|t| vocab.lookup(t.as_bytes()))
        .min()
}

/// Completes the roles that metadata left open and collects the
/// end-of-generation set. Tokens recognised by text become control tokens,
/// so that they are parsed in prompts and hidden in output like other controls.
pub(crate) fn end_of_generation(vocab: &mut Vocab, ids: &mut SpecialIds) -> Vec<u32> {
    if ids.eot.is_none() {
        ids.eot = find_by_text(vocab, EOT_TEXTS);
    }
    if ids.eom.is_none() {
        ids.eom = find_by_text(vocab, EOM_TEXTS);
    }
    let mut eog: Vec<u32> = Vec::new();
    for group in [FIM_PAD_TEXTS, FIM_REPO_TEXTS, FIM_SEP_TEXTS] {
        eog.extend(find_by_text(vocab, group));
    }
    eog.extend(EOG_TEXTS.iter().filter_map(|t| vocab.lookup(t.as_bytes())));
    let found_by_text: Vec<u32> = eog.iter().copied().chain(ids.eot).chain(ids.eom).collect();
    for id in found_by_text {
        if vocab.kinds[id as usize] != TokenKind::Control {
            vocab.kinds[id as usize] = TokenKind::Control;
        }
    }
    eog.extend(ids.eos);
    eog.extend(ids.eot);
    eog.extend(ids.eom);
    eog.sort_unstable();
    eog.dedup();
    eog
}

/// One piece of a prompt after special tokens are cut out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fragment<'t> {
    Text(&'t str),
    Token(u32),
}

/// The special tokens in matching order: longest text first, so that a token
/// is never split by a shorter one that it contains.
pub(crate) struct SpecialMatcher {
    order: Vec<u32>,
}

impl SpecialMatcher {
    pub(crate) fn new(vocab: &Vocab) -> Self {
        let mut order: Vec<u32> = (0..vocab.len() as u32)
            .filter(|&id| vocab.kind(id).is_special())
            .collect();
        order.sort_by(|&a, &b| {
            vocab
                .text(b)
                .len()
                .cmp(&vocab.text(a).len())
                .then(a.cmp(&b))
        });
        SpecialMatcher { order }
    }

    /// Cuts special tokens out of `text`. Control and unknown tokens are
    /// matched only with `parse_control`; user-defined tokens always are.
    pub(crate) fn partition<'t>(
        &self,
        vocab: &Vocab,
        text: &'t str,
        parse_control: bool,
    ) -> Vec<Fragment<'t>> {
        let mut fragments = vec![Fragment::Text(text)];
        if text.is_empty() {
            return Vec::new();
        }
        let mut next = Vec::new();
        for &id in &self.order {
            if !parse_control && vocab.kind(id) != TokenKind::UserDefined {
                continue;
            }
            let needle = vocab.text(id);
            // Every match inside a fragment is a match in the whole text.
            if !text.contains(needle) {
                continue;
            }
            next.clear();
            for fragment in &fragments {
                match *fragment {
                    Fragment::Text(t) => split_at_token(t, needle, id, &mut next),
                    token => next.push(token),
                }
            }
            std::mem::swap(&mut fragments, &mut next);
        }
        fragments
    }
}

fn split_at_token<'t>(text: &'t str, needle: &str, id: u32, out: &mut Vec<Fragment<'t>>) {
    let mut rest = text;
    while let Some(pos) = rest.find(needle) {
        if pos > 0 {
            out.push(Fragment::Text(&rest[..pos]));
        }
        out.push(Fragment::Token(id));
        rest = &rest[pos + needle.len()..];
    }
    if !rest.is_empty() {
        out.push(Fragment::Text(rest));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab(entries: &[(&str, TokenKind)]) -> Vocab {
        let n = entries.len();
        Vocab::new(
            entries.iter().map(|e| e.0),
            n,
            entries.iter().map(|e| e.1).collect(),
            vec![0.0; n],
        )
    }

    #[test]
    fn longest_special_wins_and_user_defined_always_matches() {
        use TokenKind::*;
        let v = vocab(&[
            ("a", Normal),
            ("<x>", Control),
            ("<x><x>", Control),
            ("\n", UserDefined),
        ]);
        let m = SpecialMatcher::new(&v);
        assert_eq!(
            m.partition(&v, "a<x><x>b<x>\n", true),
            [
                Fragment::Text("a"),
                Fragment::Token(2),
                Fragment::Text("b"),
                Fragment::Token(1),
                Fragment::Token(3)
            ]
        );
        assert_eq!(
            m.partition(&v, "a<x>\nb", false),
            [
                Fragment::Text("a<x>"),
                Fragment::Token(3),
                Fragment::Text("b")
            ]
        );
        assert!(m.partition(&v, "", true).is_empty());
    }

    #[test]
    fn eog_collects_eos_and_known_texts_and_marks_them_control() {
        use TokenKind::*;
        let mut v = vocab(&[
            ("<|endoftext|>", Normal),
            ("<|im_end|>", Control),
            ("x", Normal),
        ]);
        let mut ids = SpecialIds {
            eos: Some(2),
            ..SpecialIds::default()
        };
        let eog = end_of_generation(&mut v, &mut ids);
        assert_eq!(eog, [0, 1, 2]);
        assert_eq!(ids.eot, Some(0));
        assert_eq!(v.kind(0), Control);
        assert_eq!(v.kind(2), Normal);
    }
}
