"""Random rows of ggml quantized blocks for kernel tests: random bytes are valid blocks of these
types once each block's float16 scales are set to small finite values."""

from __future__ import annotations

import numpy as np

from lamina.quant.kquant import BLOCKS

# where each type's fp16 scales sit in a block: random bytes elsewhere are valid blocks
SCALES = {
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
    "Q8_0": (0,),
    "Q5_0": (0,),
    "Q5_1": (0, 2),
}


def random_rows(qtype: str, n: int, k: int, seed: int = 0) -> np.ndarray:
    """(n, k / block * block bytes) uint8: n rows of k weights in `qtype`'s blocks."""
    rng = np.random.default_rng(seed)
    per, size = BLOCKS[qtype]
    raw = rng.integers(0, 256, (n, k // per * size), dtype=np.uint8)
    blocks = raw.reshape(n, -1, size)
    for at in SCALES[qtype]:
        d = rng.uniform(0.001, 0.004, blocks.shape[:2]).astype(np.float16)
        blocks[..., at : at + 2] = d[..., None].view(np.uint8)
    return raw
