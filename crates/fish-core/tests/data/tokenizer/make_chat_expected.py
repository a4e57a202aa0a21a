#!/usr/bin/env python3
"""Writes chat_templates.json: chat templates rendered by Python's jinja2 with
the settings Hugging Face's apply_chat_template uses (sandboxed environment,
trim_blocks, lstrip_blocks, raise_exception), as the reference for fish's
minijinja renderer.

The templates are the `.jinja` files beside this script: SmolLM2's and
Qwen 2.5 Coder's as stored in their GGUF files (written here with
`--extract` when the models are present), and Gemma 3's from its
tokenizer_config.json (the Gemma 3 270M GGUF carries none).

    python3 crates/fish-core/tests/data/tokenizer/make_chat_expected.py [--extract]
"""
import json
import sys
from pathlib import Path

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[4]

TEMPLATES = {
    "smollm2_chat_template.jinja": ("SmolLM2-135M-Instruct.Q4_1.gguf", "<|im_start|>", "<|im_end|>"),
    "qwen2_5_chat_template.jinja": ("qwen2.5-coder-0.5b-instruct.gguf", "<|endoftext|>", "<|im_end|>"),
    "gemma3_chat_template.jinja": (None, "<bos>", "<eos>"),
}

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are terse."},
     {"role": "user", "content": "  Hi there!  "}],
    [{"role": "user", "content": "2+2?"},
     {"role": "assistant", "content": "4"},
     {"role": "user", "content": "And 3+3?\nExplain."}],
    # Gemma's template refuses two user turns in a row.
    [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
]


def extract():
    import gguf
    for name, (model, _, _) in TEMPLATES.items():
        if model is None:
            continue
        path = ROOT / "models" / model
        if not path.exists():
            print(f"skip {name}: {path} missing")
            continue
        field = gguf.GGUFReader(str(path)).fields["tokenizer.chat_template"]
        (HERE / name).write_text(bytes(field.parts[-1]).decode("utf-8"))
        print(f"extracted {name}")


class TemplateRaised(Exception):
    pass


def raise_exception(message):
    raise TemplateRaised(message)


def main():
    if "--extract" in sys.argv:
        extract()
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    cases = []
    for name, (_, bos, eos) in TEMPLATES.items():
        template = env.from_string((HERE / name).read_text())
        for messages in CONVERSATIONS:
            for gen in (True, False):
                case = {"template": name, "bos_token": bos, "eos_token": eos,
                        "messages": messages, "add_generation_prompt": gen}
                try:
                    case["expected"] = template.render(messages=messages, add_generation_prompt=gen,
                                                       bos_token=bos, eos_token=eos)
                except (TemplateRaised, TemplateError) as e:
                    case["raises"] = str(e)
                cases.append(case)
    out = {"generated_by": "make_chat_expected.py with jinja2", "cases": cases}
    (HERE / "chat_templates.json").write_text(json.dumps(out, ensure_ascii=True, indent=1) + "\n")
    print(f"wrote chat_templates.json: {len(cases)} cases")


if __name__ == "__main__":
    main()
