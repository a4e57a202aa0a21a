#!/usr/bin/env bash
# Installs what the test suite needs on a fresh Debian 12 machine, fetches the
# test models, and runs every test of the workspace. Safe to run repeatedly.
set -euo pipefail
cd "$(dirname "$0")/.."

sudo_() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

need_pkgs=()
for p in mesa-vulkan-drivers libvulkan1 vulkan-validationlayers; do
    dpkg -s "$p" >/dev/null 2>&1 || need_pkgs+=("$p")
done
if [ ${#need_pkgs[@]} -gt 0 ]; then
    sudo_ apt-get update -qq
    sudo_ env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_pkgs[@]}"
fi

# gguf-py reads back the files fish-gguf writes (compatibility test).
python3 -c "import gguf" 2>/dev/null || python3 -m pip install --quiet gguf

scripts/fetch-model.sh >/dev/null
export FISH_TEST_MODELS="${FISH_TEST_MODELS-qwen05 gemma3}"
for m in $FISH_TEST_MODELS; do scripts/fetch-model.sh "$m" >/dev/null; done

# A two-layer Q4_K_M model of 256-value rows (random weights), for the span
# tests of the K-quant prefill kernels that the default model's 576-value
# rows cannot hold.
mkdir -p models
cargo run --release --locked -q -p fish-cli -- synth --shape tiny --type q4_k_m \
    models/tiny-q4_k_m.gguf
export FISH_TEST_TINY_Q4K="$PWD/models/tiny-q4_k_m.gguf"
# Two layers of 2048-value rows: decode matrices whose rows outrun one round
# of the kernels' loads.
cargo run --release --locked -q -p fish-cli -- synth --shape tiny-wide --type q4_k_m \
    models/tiny-wide-q4_k_m.gguf
export FISH_TEST_TINY_WIDE_Q4K="$PWD/models/tiny-wide-q4_k_m.gguf"

# GPU tests run on lavapipe (Mesa's CPU Vulkan) and must fail, not skip, without a device.
export FISH_GPU=cpu
export FISH_REQUIRE_GPU=1
# The validation layer checks every GPU test; they assert zero messages.
export FISH_VK_VALIDATE=1
export VK_DRIVER_FILES="${VK_DRIVER_FILES:-/usr/share/vulkan/icd.d/lvp_icd.x86_64.json}"
cargo test --workspace --release --locked "$@"
