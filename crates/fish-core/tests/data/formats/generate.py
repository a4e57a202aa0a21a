#!/usr/bin/env python3
"""Regenerates the per-format reference files of this folder.

For each weight type, the default model (SmolLM2-135M-Instruct Q4_1) is
re-quantised with `fish-cli quantize`, and llama.cpp's greedy program decodes
two prompts from that file. Each <type>.json records the file's sha256 (so the
expected tokens apply to exactly those bytes) and llama.cpp's token ids.

Usage (from the repository root):
  cargo build --release -p fish-cli
  python3 crates/fish-core/tests/data/formats/generate.py \
      --fish-cli target/release/fish-cli --greedy /path/to/greedy [TYPE ...]

`greedy` is built from greedy.cpp in this folder against llama.cpp b11312's
libllama (CPU); see README.md.
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile

TYPES = ["f32", "f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0",
         "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "q4_k_m"]
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "../../../../.."))
HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = "models/SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPTS = {
    "raw": "The capital of France is",
    # Case no_system of ../reference/q4_1_chat_capital_of_france.json.
    "chat": "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
}


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fish-cli", required=True)
    ap.add_argument("--greedy", required=True)
    ap.add_argument("types", nargs="*", default=TYPES)
    args = ap.parse_args()
    source = os.path.join(ROOT, SOURCE)
    with tempfile.TemporaryDirectory() as tmp:
        for ty in args.types:
            out = os.path.join(tmp, f"{ty}.gguf")
            q = subprocess.run([args.fish_cli, "quantize", source, out, ty],
                               check=True, capture_output=True, text=True)
            cases = {}
            for name, prompt in PROMPTS.items():
                r = subprocess.run([args.greedy, out, prompt, "32"],
                                   check=True, capture_output=True, text=True)
                cases[name] = dict(prompt=prompt, **json.loads(r.stdout))
            record = {
                "type": ty,
                "source_model": SOURCE,
                "source_sha256": sha256(source),
                "command": f"fish-cli quantize {SOURCE} OUT {ty}",
                "fish_cli_summary": q.stderr.strip().split(": ", 1)[-1],
                "sha256": sha256(out),
                "size_bytes": os.path.getsize(out),
                "llama_cpp_release": "b11312",
                "llama_cpp_commit": "0c1e57098bba43ac29e6e3b677cdceebdd22334f",
                "method": "greedy.cpp against libllama (CPU): llama_tokenize(add_special=true, "
                          "parse_special=true); one llama_decode of the prompt; argmax greedy "
                          "(no sampler) for 32 tokens, stopping after an end-of-generation token; "
                          "n_ctx=512, n_threads=2",
                "cases": cases,
            }
            with open(os.path.join(HERE, f"{ty}.json"), "w") as f:
                json.dump(record, f, indent=1)
                f.write("\n")
            print(ty, record["sha256"][:16], {k: v["greedy_token_ids"][:8] for k, v in cases.items()},
                  file=sys.stderr)


if __name__ == "__main__":
    main()
