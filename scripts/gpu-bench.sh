#!/usr/bin/env bash
# The GPU benchmark set of docs/BENCHMARKS.md on one Vulkan device: the
# `fish-cli synth` llama-1b and llama-8b Q4_K_M shapes, the device and
# kernel choices FISH_GPU_VERBOSE=1 reports (check the `gpu:` line first:
# without it the run measured the CPU), then decode (tg128) and prefill
# (pp512) in alternating rounds (each `fish-cli bench` discards its own
# warm-up run; compare rounds, not single runs), and one decode and one
# prefill profile of llama-8b, prefill and decode kernel variants, and the
# registers of the normed decode kernels.
#
#   scripts/gpu-bench.sh [FISH_CLI] [MODEL_DIR] [ROUNDS]
#
# FISH_CLI defaults to target/release/fish-cli, MODEL_DIR (where the synth
# models are written, ~5.6 GB) to /tmp, ROUNDS to 2. Extra environment
# (FISH_VK_*, FISH_GPU_*) passes through to every run.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cli="${1:-$root/target/release/fish-cli}"
dir="${2:-/tmp}"
rounds="${3:-2}"

for shape in llama-1b llama-8b; do
    model="$dir/fish-$shape-q4_k_m.gguf"
    [ -f "$model" ] || "$cli" synth --shape "$shape" --type q4_k_m "$model" >/dev/null
done
l1b="$dir/fish-llama-1b-q4_k_m.gguf"
l8b="$dir/fish-llama-8b-q4_k_m.gguf"

echo "## device"
FISH_GPU_VERBOSE=1 "$cli" bench "$l8b" -p 64 -n 4 -r 1 2>&1 | grep -E "^(fish-vk|gpu):" || true

row() { # label model args...
    local label="$1" model="$2"
    shift 2
    printf '%-8s %-9s %s\n' "$label" "$(basename "$model" .gguf | cut -d- -f2,3)" \
        "$("$cli" bench "$model" "$@" 2>&1 | grep -E '\| (tg|pp)[0-9]+ ' | tr -s ' ')"
}

for r in $(seq 1 "$rounds"); do
    echo "## round $r"
    for model in "$l8b" "$l1b"; do
        row tg128 "$model" -p 0 -n 128 -r 1
        row pp512 "$model" -p 512 -n 0 -r 3
    done
done

echo "## prefill kernels (pp512)"
for model in "$l8b" "$l1b"; do
    FISH_VK_FRAGS=0 row staged "$model" -p 512 -n 0 -r 3
    row frags "$model" -p 512 -n 0 -r 3
    FISH_VK_FRAGS_GATE_UP=0 row frags-act "$model" -p 512 -n 0 -r 3
    FISH_VK_FRAGS=q4_k row frags-q4k "$model" -p 512 -n 0 -r 3
    FISH_VK_FRAGS_AHEAD=1 row ahead "$model" -p 512 -n 0 -r 3
    # q/k/v (192 wide tiles on llama-8b) on the 64 x 64 tile instead.
    FISH_VK_WIDE_MIN=200 row wide200 "$model" -p 512 -n 0 -r 3
done

echo "## decode kernels (tg128)"
for model in "$l8b" "$l1b"; do
    # Rows per workgroup of the pre-quantised K-quant matvecs (wo, down,
    # the output projection): 2 by default, 4 before (H100: -1% / -3%).
    for rows in 2 4; do
        FISH_VK_MATVEC_ROWS=$rows row "rows$rows" "$model" -p 0 -n 128 -r 2
    done
done
echo "## registers of the normed decode kernels"
FISH_VK_PIPELINE_STATS=1 "$cli" bench "$l8b" -p 0 -n 2 -r 1 2>&1 |
    grep -oE "matvec_i8x_(gateup_)?norm_q[46]_k\[[0-9, ]*\]|Register Count=[0-9]+" | paste - - || true

echo "## llama-8b profiles"
FISH_GPU_PROFILE=3 "$cli" bench "$l8b" -p 0 -n 32 -r 1 2>&1 | grep -E "span profile" || true
FISH_GPU_PROFILE=3 "$cli" bench "$l8b" -p 512 -n 0 -r 1 2>&1 | grep -E "span profile" || true
