"""Quantized SmolLM2-135M (the real model): int8 keeps fp32's greedy tokens, int4 its loss, and
the GGUF's own Q4_1 blocks, kept as lamina int4, give the dequantized model's logits."""

from __future__ import annotations

import copy

import pytest
import torch

from lamina import cpu, quant
from lamina.generation import generate
from lamina.quant import Int4Linear, Int8Embedding, Int8Linear, quantize

STEPS = 32
PROMPT = "The capital of France is"
# int8 keeps fp32's greedy tokens where fp32's choice is clear; the instruct model answering a
# chat question is (on plain-text prompts that ramble into dates or stories, per-row int8 flips
# near-ties of 0.06-0.2 logits after 3-30 steps, as any rounding of the weights may)
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def real(smollm2_gguf):
    from lamina.interop.gguf import load_gguf
    from lamina.tokenizers.pretrained import PretrainedTokenizer

    model, meta = load_gguf(smollm2_gguf)
    tok = PretrainedTokenizer.from_gguf_metadata(meta)
    return model, tok, smollm2_gguf


def _greedy(model, ids: list[int]) -> list[int]:
    return generate(model, torch.tensor(ids), STEPS)[0, len(ids) :].tolist()


def _loss_per_char(model, ids: list[int], n_chars: int) -> float:
    x = torch.tensor([ids])
    with torch.no_grad():
        logits = model(x[:, :-1])
    nll = torch.nn.functional.cross_entropy(logits[0], x[0, 1:], reduction="sum")
    return nll.item() / n_chars


def test_int8_greedy_tokens_equal_fp32s(real):
    model, tok, _ = real
    ids = tok.render_chat(QUESTION)
    q = quantize(copy.deepcopy(model), "int8")
    assert isinstance(q.head, Int8Linear) and q.head.qweight is q.embed.wte.qweight
    assert _greedy(q, ids) == _greedy(model, ids)


def test_int4_loss_per_character_within_2_percent_of_fp32(real):
    from lamina.data.builtin import builtin_corpus

    model, tok, _ = real
    try:
        text = builtin_corpus()[-300:]
    except Exception as e:  # the corpus package is optional
        pytest.skip(f"built-in corpus unavailable: {e}")
    ids = tok.encode(text)
    q = quantize(copy.deepcopy(model), "int4", group_size=32)
    ref, got = _loss_per_char(model, ids, len(text)), _loss_per_char(q, ids, len(text))
    assert abs(got - ref) / ref < 0.02, f"int4 {got:.4f} vs fp32 {ref:.4f} nats/char"


def test_q4_1_kept_as_is_gives_the_dequantized_models_logits(real, monkeypatch):
    from lamina.interop.gguf import load_gguf

    model, tok, path = real
    q, _ = load_gguf(path, quantized=True)
    assert quant.scheme_of(q) == {"scheme": "gguf", "types": ["Q4_1", "Q8_0"]}
    assert isinstance(q.blocks[0].ff.fc, Int4Linear) and q.blocks[0].ff.fc.group_size == 32
    assert isinstance(q.embed.wte, Int8Embedding)  # Q8_0 table, also the tied head
    assert q.head.qweight is q.embed.wte.qweight
    ids = torch.tensor([tok.encode(PROMPT + " Paris, and the capital of Italy is")])
    with torch.no_grad():
        ref, fast = model(ids), q(ids)
        with cpu.using("dequantize"):  # the blocks' exact values
            exact = q(ids)
    assert (exact - ref).abs().max().item() < 1e-4
    rel = ((fast - ref).norm() / ref.norm()).item()
    assert rel < 0.03, f"kernel path vs dequantized: relative logit error {rel:.4f}"
    assert torch.equal(fast[0, -1].argmax(), ref[0, -1].argmax())
