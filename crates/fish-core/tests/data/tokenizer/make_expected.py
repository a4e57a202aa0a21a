#!/usr/bin/env python3
"""Writes the expected token ids for the tokenizer tests, from independent
tokenizer implementations fed with each GGUF file's own vocabulary:

- byte-level BPE models (SmolLM2, Qwen 2.5) through Hugging Face `tokenizers`,
  with the pre-tokenizer of the model's original tokenizer.json;
- the SentencePiece model (Gemma 3) through `sentencepiece`, from a model
  proto built from the GGUF pieces, scores and types.

Usage (from the repository root; needs `pip install tokenizers sentencepiece protobuf gguf`):

    python3 crates/fish-core/tests/data/tokenizer/make_expected.py [smollm2|qwen05|gemma3 ...]

The JSON files it writes are committed, so the Rust tests need no Python.
Special tokens inside a text are cut out longest-first before the rest is
tokenized, the way llama.cpp's tokenizer does (user-defined tokens always,
control tokens when specials are parsed); the pieces between them are what
the reference libraries tokenize.
"""
import hashlib
import json
import sys
from pathlib import Path

import gguf

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[4]

MODELS = {
    "smollm2": ("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2.json"),
    "qwen05": ("qwen2.5-coder-0.5b-instruct.gguf", "qwen2.json"),
    "gemma3": ("gemma-3-270m-q4_k_m.gguf", "gemma3.json"),
}

# Hugging Face's split pattern for Qwen 2 (tokenizer.json), case-insensitive group included.
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

CONTROL, USER_DEFINED, UNKNOWN = 3, 4, 2

# Texts for every model: whitespace runs, newlines, digits, contractions,
# accents, scripts, emoji, code, control characters.
COMMON_TEXTS = [
    "The capital of France is",
    "Hello world",
    "a",
    " ",
    "\n",
    "   leading spaces and trailing   ",
    "mixed   spaces    between     words",
    "tabs\tand\t\ttabs\t",
    "line one\nline two\n\nline four\r\nwindows\r\n",
    "multiple\n\n\n\nnewlines\n\n",
    "digits 1234567890 and 3.14159, 1,000,000 or 42nd",
    "contractions: I'm, you're, he's, we've, they'll, I'd, can't, WE'RE, It'S",
    "unicode: caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00c6r\u00f8sk\u00f8bing, Stra\u00dfe",
    "\u00dcn\u00efc\u00f6d\u00e9 and \u00fcmlauts \u00c4\u00d6\u00dc",
    "\u4e2d\u6587\u5b57\u7b26\u6d4b\u8bd5\uff0c\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3001\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8",
    "emoji: \U0001F600\U0001F389\U0001F44D\U0001F3FD \U0001F468\u200d\U0001F469\u200d\U0001F467",
    "math \u2211 \u222b \u221a \u2260 \u2264 \u2265 and arrows \u2192 \u21d2",
    "\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac \u0438 \u0440\u0443\u0441\u0441\u043a\u0438\u0439 \u0442\u0435\u043a\u0441\u0442",
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
    "code: fn main() { println!(\"{}\", x + 1); }",
    "    indented python:\n        return x**2  # comment\n",
    "URL https://example.com/path?q=1&r=2#frag",
    "control \x01\x02 bytes \x7f and nbsp\u00a0here, em\u2003space",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "!!!??? ... --- ***",
    # Combining marks inside words (decomposed accents, Devanagari, Thai).
    "cafe\u0301 \u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e \u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35",
    "\u00bd \u00b2 \u2163 \u0663\u0664 fullwidth \uff11\uff12\uff13 \uff21\uff22",
]

CHATML_SPECIAL_TEXTS = [
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "text before<|im_end|>text after <|endoftext|>",
    "<|im_start|><|im_start|> doubled",
]

GEMMA_SPECIAL_TEXTS = [
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    "text before<end_of_turn>text after <eos>",
]


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_vocab(path):
    r = gguf.GGUFReader(str(path))

    def strings(key):
        f = r.fields.get(key)
        return None if f is None else [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    def numbers(key):
        f = r.fields.get(key)
        return None if f is None else [f.parts[i][0].item() for i in f.data]

    def scalar(key):
        f = r.fields.get(key)
        return None if f is None else f.parts[-1][0].item()

    return {
        "tokens": strings("tokenizer.ggml.tokens"),
        "types": numbers("tokenizer.ggml.token_type"),
        "scores": numbers("tokenizer.ggml.scores"),
        "merges": strings("tokenizer.ggml.merges"),
        "bos": scalar("tokenizer.ggml.bos_token_id"),
        "add_bos": bool(scalar("tokenizer.ggml.add_bos_token") or False),
    }


def split_specials(text, specials):
    """Cuts special-token texts out of `text`, longest first; returns a list
    of str (plain text) and int (token id) items."""
    parts = [text]
    for tok_text, tok_id in sorted(specials, key=lambda s: (-len(s[0].encode()), s[1])):
        out = []
        for p in parts:
            if not isinstance(p, str):
                out.append(p)
                continue
            pieces = p.split(tok_text)
            for i, piece in enumerate(pieces):
                if i:
                    out.append(tok_id)
                if piece:
                    out.append(piece)
        parts = out
    return parts


def hf_byte_level(v, pre):
    from tokenizers import AddedToken, Regex, Tokenizer, models, pre_tokenizers

    vocab = {}
    for i, t in enumerate(v["tokens"]):
        vocab[t] = i  # a later duplicate wins, as in llama.cpp
    merges = []
    for line in v["merges"]:
        sep = line.find(" ", 1)
        if sep > 0:
            merges.append((line[:sep], line[sep + 1:]))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    if pre == "smollm":
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ])
    elif pre == "qwen2":
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    else:
        raise ValueError(pre)
    user_defined = [AddedToken(t, special=False, normalized=False)
                    for t, ty in zip(v["tokens"], v["types"]) if ty == USER_DEFINED]
    if user_defined:
        tok.add_tokens(user_defined)
    return lambda text: tok.encode(text, add_special_tokens=False).ids


def sentencepiece_model(v):
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as pb

    m = pb.ModelProto()
    m.trainer_spec.model_type = pb.TrainerSpec.BPE
    m.trainer_spec.byte_fallback = True
    m.trainer_spec.vocab_size = len(v["tokens"])
    # Gemma's own model keeps runs of spaces together (its vocabulary has
    # whitespace-only pieces for indentation); SentencePiece's default would
    # cut the text at every space first.
    m.trainer_spec.split_by_whitespace = False
    m.trainer_spec.allow_whitespace_only_pieces = True
    m.normalizer_spec.name = "identity"
    m.normalizer_spec.add_dummy_prefix = False
    m.normalizer_spec.remove_extra_whitespaces = False
    m.normalizer_spec.escape_whitespaces = True
    unk_text = "<unk>"
    for i, (t, score, ty) in enumerate(zip(v["tokens"], v["scores"], v["types"])):
        p = m.pieces.add()
        p.piece = t
        p.score = score
        # SentencePiece wants exactly one UNKNOWN piece; GGUF marks <unk> as control.
        p.type = UNKNOWN if t == unk_text else ty
        if t == unk_text:
            m.trainer_spec.unk_id = i
    m.trainer_spec.bos_id = -1
    m.trainer_spec.eos_id = -1
    m.trainer_spec.pad_id = -1
    sp = spm.SentencePieceProcessor(model_proto=m.SerializeToString())
    return lambda text: sp.encode(text)


def expected_cases(encode_plain, v, special_texts):
    def of_type(wanted):
        return [(t, i) for i, (t, ty) in enumerate(zip(v["tokens"], v["types"])) if ty == wanted]

    controls, user_defined = of_type(CONTROL), of_type(USER_DEFINED)

    def encode(text, parse_special, add_special):
        ids = [v["bos"]] if add_special and v["add_bos"] else []
        # User-defined tokens (Gemma's runs of spaces, tabs and newlines) are
        # matched in the raw text always, control tokens only when parsing specials.
        parts = split_specials(text, user_defined + (controls if parse_special else []))
        for p in parts:
            ids.extend([p] if isinstance(p, int) else encode_plain(p))
        return ids

    cases = []
    for text in COMMON_TEXTS + [""]:
        cases.append({"text": text, "parse_special": False, "add_special": False,
                      "ids": encode(text, False, False)})
    for text in special_texts:
        cases.append({"text": text, "parse_special": True, "add_special": True,
                      "ids": encode(text, True, True)})
        # Unparsed, control-token texts are ordinary text.
        cases.append({"text": text, "parse_special": False, "add_special": False,
                      "ids": encode(text, False, False)})
    return cases


def main(which):
    for key in which:
        model_file, out_name = MODELS[key]
        path = ROOT / "models" / model_file
        if not path.exists():
            print(f"skip {key}: {path} missing (scripts/fetch-model.sh {key})")
            continue
        v = read_vocab(path)
        if key == "smollm2":
            encode_plain, specials, source = hf_byte_level(v, "smollm"), CHATML_SPECIAL_TEXTS, "tokenizers"
        elif key == "qwen05":
            encode_plain, specials, source = hf_byte_level(v, "qwen2"), CHATML_SPECIAL_TEXTS, "tokenizers"
        else:
            encode_plain, specials, source = sentencepiece_model(v), GEMMA_SPECIAL_TEXTS, "sentencepiece"
        lib = __import__(source)
        doc = {
            "model_file": model_file,
            "model_sha256": sha256(path),
            "generated_by": f"make_expected.py with {source} {lib.__version__}",
            "cases": expected_cases(encode_plain, v, specials),
        }
        (HERE / out_name).write_text(json.dumps(doc, ensure_ascii=True, indent=1) + "\n")
        print(f"wrote {out_name}: {len(doc['cases'])} cases")


if __name__ == "__main__":
    main(sys.argv[1:] or list(MODELS))
