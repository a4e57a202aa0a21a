#!/usr/bin/env python3
"""Golden vectors for fish-quant, made by gguf-py's reference codecs.

Run from this directory: `pip install gguf numpy && python3 gen.py`.
Writes, for each type T:
  T.bytes  the encoded blocks (quantised from input.f32 where gguf-py has a
           quantiser, else deterministic random blocks with sane scales)
  T.f32    gguf-py's decoding of T.bytes (little-endian f32)
and input.f32 (the values that were quantised). The Rust test
`tests/golden.rs` checks dequant_row against T.f32 bit for bit, and
quantize_row against T.bytes for the types listed in QUANTISED.
"""

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import quants

N = 1024  # four 256-value super-blocks, 32 small blocks
QUANTISED = ["F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"]
# Encoded-only types: block bytes, offsets of their f16 scale fields.
RANDOM_BLOCKS = {
    "Q2_K": (84, [80, 82]),
    "Q3_K": (110, [108]),
    "Q4_K": (144, [0, 2]),
    "Q5_K": (176, [0, 2]),
    "Q6_K": (210, [208]),
}


def main():
    rng = np.random.RandomState(20261129)
    x = (rng.standard_normal(N) * 0.05).astype(np.float32)
    x[7] = 0.9  # an outlier, so scales differ between blocks
    x.tofile("input.f32")
    for name in QUANTISED:
        qt = Q[name]
        data = quants.quantize(x.reshape(1, N), qt)
        data.tofile(f"{name}.bytes")
        quants.dequantize(data, qt).astype(np.float32).tofile(f"{name}.f32")
    for name, (block_bytes, scale_offsets) in RANDOM_BLOCKS.items():
        nb = N // 256
        raw = rng.randint(0, 256, size=(nb, block_bytes)).astype(np.uint8)
        for off in scale_offsets:
            scales = (rng.uniform(0.001, 0.02, size=nb)).astype(np.float16)
            raw[:, off:off + 2] = scales.view(np.uint8).reshape(nb, 2)
        raw = raw.reshape(1, nb * block_bytes)
        raw.tofile(f"{name}.bytes")
        quants.dequantize(raw, Q[name]).astype(np.float32).tofile(f"{name}.f32")


if __name__ == "__main__":
    main()
