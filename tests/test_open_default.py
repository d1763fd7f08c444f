"""The fast path is the default: lamina.open keeps a GGUF's blocks where a kernel runs them,
the run-only verbs take --keep-quantized as the default and --dequantize as its opposite, and a
verb notes once where PyTorch will run the decode step."""

from __future__ import annotations

import argparse

import pytest

import lamina
import lamina.cpu as cpu
from lamina import GPT, GPTConfig, quant
from lamina.cli.flags import add_keep_quantized, note_kernel


def test_a_gguf_opens_quantized_by_default_and_float_on_request(smollm2_gguf):
    kept = lamina.open(smollm2_gguf)
    if cpu.keeps_quantized("cpu"):
        assert quant.scheme_of(kept.model) == {"scheme": "gguf", "types": ["Q4_1", "Q8_0"]}
        assert lamina.native.unsupported(kept.model) is None  # the native step covers it
    else:
        assert quant.scheme_of(kept.model) is None
    assert quant.scheme_of(lamina.open(smollm2_gguf, quantized=False).model) is None
    with cpu.using("dequantize"):  # no kernel runs quantized layers: fp32 on load
        assert quant.scheme_of(lamina.open(smollm2_gguf).model) is None


def _parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser(exit_on_error=False)
    add_keep_quantized(p)
    return p.parse_args(list(argv))


def test_keep_quantized_is_the_default_and_dequantize_its_opposite():
    assert _parse().keep_quantized is None  # lamina.open's choice
    assert _parse("--keep-quantized").keep_quantized is True
    assert _parse("--dequantize").keep_quantized is False
    with pytest.raises((argparse.ArgumentError, SystemExit)):
        _parse("--keep-quantized", "--dequantize")


def _tiny() -> GPT:
    cfg = GPTConfig(vocab_size=64, block_size=16, d_model=32, n_heads=2, n_layers=1)
    return GPT(cfg).eval()


def test_a_verb_notes_once_where_native_cannot_run(monkeypatch, capsys):
    monkeypatch.setattr(cpu, "native_missing", lambda: "no C compiler (set CC, or install gcc)")
    note_kernel("chat", _tiny())
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "lamina chat: note: PyTorch runs the decode step: no C compiler (set CC, or install gcc)"
    ]
    with cpu.using("torch"):  # a kernel the user chose: nothing to note
        note_kernel("chat", _tiny())
    assert capsys.readouterr().err == ""


def test_a_verb_notes_a_model_the_native_step_does_not_cover(monkeypatch, capsys):
    monkeypatch.setattr(cpu, "native_missing", lambda: None)
    note_kernel("sample", _tiny())
    assert capsys.readouterr().err == ""
    post = GPT(GPTConfig(vocab_size=64, block_size=16, d_model=32, n_heads=2, n_layers=1,
                         norm_first=False)).eval()  # fmt: skip
    note_kernel("sample", post)
    assert capsys.readouterr().err.strip() == (
        "lamina sample: note: PyTorch runs the decode step: lamina.native does not cover this "
        "model (post-LN blocks)"
    )
