"""lamina.checks for lesson 8: the right Q4_0 quantizer, dot product and KV cache step pass,
and each classic mistake is caught with a message that names it. Tiny sizes throughout."""

from __future__ import annotations

import math

import gguf
import pytest
import torch

from lamina import checks
from lamina.errors import CheckFailed
from lamina.quant.ggml import dequantize_rows


def fails(check, *args) -> str:
    with pytest.raises(CheckFailed) as info:
        check(*args)
    return str(info.value)


# --- part 1: the Q4_0 quantizer ---------------------------------------------------------------


def quantize_q4_0(w, mistake=None):
    """A learner's Q4_0 quantizer with switchable mistakes."""
    n, k = w.shape
    blocks = w.float().reshape(n, k // 32, 32)
    m = blocks.gather(-1, blocks.abs().argmax(-1, keepdim=True))
    d = {"symmetric": blocks.abs().amax(-1, keepdim=True) / 7, "positive": m / 8}.get(
        mistake, m / -8
    )
    inv = 1 / d if mistake == "inf at zero" else torch.where(d == 0, 0.0, 1 / d)
    offset = {"no offset": 0.5, "floor": 8.0}.get(mistake, 8.5)
    q = (blocks * inv + offset).nan_to_num(0.0).trunc().clamp(0, 15).to(torch.uint8)
    if mistake == "swapped":
        packed = q[..., 16:] | (q[..., :16] << 4)
    elif mistake == "neighbours":
        packed = q[..., 0::2] | (q[..., 1::2] << 4)
    else:
        packed = q[..., :16] | (q[..., 16:] << 4)
    scale = d.half().view(torch.uint8)
    out = torch.cat([scale, packed], -1).reshape(n, -1)
    return out.long() if mistake == "int64" else out


def test_quantizer_right_passes():
    checks.check_q4_0_quantize(quantize_q4_0)


def test_quantizer_agrees_with_gguf_and_lamina_on_a_real_shape():
    """Beyond the check's rows: a 64 x 576 matrix (SmolLM2's width), bytes and reading back."""
    w = torch.randn(64, 576) * 0.05
    mine = quantize_q4_0(w)
    theirs = gguf.quants.quantize(w.numpy(), gguf.GGMLQuantizationType.Q4_0)
    assert torch.equal(mine, torch.from_numpy(theirs))
    back = dequantize_rows(mine, "Q4_0", 576)
    assert torch.equal(
        back, torch.from_numpy(gguf.quants.dequantize(theirs, gguf.GGMLQuantizationType.Q4_0))
    )


@pytest.mark.parametrize(
    "mistake, words",
    [
        ("swapped", "the nibbles are swapped"),
        ("neighbours", "packed neighbours"),
        ("no offset", "leave out the + 8"),
        ("floor", "one less than GGML's: round to the nearest code"),
        ("symmetric", "d is max|w| / 7"),
        ("positive", "the sign is wrong"),
        ("inf at zero", "take 1 / d as 0 there"),
        ("int64", "must be uint8"),
    ],
)
def test_quantizer_mistakes(mistake, words):
    assert words in fails(checks.check_q4_0_quantize, lambda w: quantize_q4_0(w, mistake))


def test_quantizer_wrong_shape_is_explained():
    message = fails(checks.check_q4_0_quantize, lambda w: quantize_q4_0(w)[:, :-2])
    assert "blocks of 18 bytes per row" in message


# --- part 2: the block dot product ------------------------------------------------------------


def q4_0_matvec(rows, x, mistake=None):
    """A learner's Q4_0 matrix-vector product with switchable mistakes."""
    blocks = rows.reshape(rows.shape[0], -1, 18)
    d = blocks[..., :2].contiguous().view(torch.float16).float()[..., 0]
    qs = blocks[..., 2:]
    if mistake == "swapped":
        q = torch.cat([qs >> 4, qs & 15], -1)
    elif mistake == "neighbours":
        q = torch.stack([qs & 15, qs >> 4], -1).flatten(-2)
    else:
        q = torch.cat([qs & 15, qs >> 4], -1)
    per_block = ((q.float() - (0 if mistake == "no offset" else 8)) * x.reshape(-1, 32)).sum(-1)
    if mistake == "no scale":
        return per_block.sum(-1)
    if mistake == "one scale":
        return (per_block * d[:, :1]).sum(-1)
    return (per_block * d).sum(-1)


def test_matvec_right_passes():
    checks.check_q4_0_matvec(q4_0_matvec)


def test_matvec_that_dequantizes_first_passes_too():
    """The check holds the result, not the method: dequantize-then-matmul is right (only slow)."""

    def dequantized(rows, x):
        return dequantize_rows(rows, "Q4_0", x.shape[0]) @ x

    checks.check_q4_0_matvec(dequantized)


@pytest.mark.parametrize(
    "mistake, words",
    [
        ("no scale", "you left out the block scales"),
        ("one scale", "every block used the first block's d"),
        ("no offset", "multiply (q - 8), not q"),
        ("swapped", "the nibbles are swapped"),
        ("neighbours", "not the neighbours 2i and 2i + 1"),
    ],
)
def test_matvec_mistakes(mistake, words):
    assert words in fails(checks.check_q4_0_matvec, lambda r, x: q4_0_matvec(r, x, mistake))


def test_matvec_wrong_shape_is_caught():
    assert "expected shape (8,)" in fails(
        checks.check_q4_0_matvec, lambda r, x: q4_0_matvec(r, x)[None]
    )


# --- part 3: a KV cache step --------------------------------------------------------------------


def cache_step(k_cache, v_cache, pos, q, k, v, mistake=None):
    """A learner's decode step over preallocated caches, with switchable mistakes."""
    slot = pos + 1 if mistake == "slot off by one" else pos
    if mistake != "not written":
        k_cache[:, :, slot] = k[:, :, 0]
        v_cache[:, :, slot] = v[:, :, 0]
    end = {"all slots": k_cache.shape[2], "no self": pos, "slot off by one": pos + 2}
    end = end.get(mistake, pos + 1)
    keys, values = k_cache[:, :, :end], v_cache[:, :, :end]
    if mistake == "not written":
        keys, values = torch.cat([keys[:, :, :pos], k], 2), torch.cat([values[:, :, :pos], v], 2)
    group = q.shape[1] // keys.shape[1]
    if mistake == "tiled heads":
        keys, values = keys.repeat(1, group, 1, 1), values.repeat(1, group, 1, 1)
    else:
        keys, values = keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1)
    scale = 1.0 if mistake == "no scale" else 1 / math.sqrt(q.shape[-1])
    return torch.softmax((q @ keys.transpose(-2, -1)) * scale, -1) @ values


def test_cache_step_right_passes():
    checks.check_cache_step(cache_step)


def test_cache_step_passes_without_gqa_and_with_one_kv_head():
    checks.check_cache_step(cache_step, 32, 4, 4)
    checks.check_cache_step(cache_step, 32, 4, 1)


@pytest.mark.parametrize(
    "mistake, words",
    [
        ("all slots", "also those not written yet"),
        ("no self", "the new token sees its own key too"),
        ("slot off by one", "wrote the new k at slot 1"),
        ("not written", "did not write the new k into the cache"),
        ("tiled heads", "not h % 2 (repeat)"),
        ("no scale", "by 1 / sqrt(head_dim)"),
    ],
)
def test_cache_step_mistakes(mistake, words):
    step = lambda *a: cache_step(*a, mistake=mistake)  # noqa: E731
    assert words in fails(checks.check_cache_step, step)
