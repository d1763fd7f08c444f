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
        assert not cpu.keeps_quantized("cpu")
    assert not cpu.keeps_quantized("cuda")


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


@pytest.mark.parametrize("scheme", ["int8", "int4"])
@pytest.mark.parametrize("tie", [True, False])
def test_a_hf_folder_opens_quantized_as_its_tensors_are_read(scheme, tie, tmp_path):
    import torch

    torch.manual_seed(0)
    cfg = GPTConfig.preset("llama-tiny", vocab_size=96, n_layers=2, tie_weights=tie)
    model = GPT(cfg).eval()
    lamina.save_hf(model, tmp_path / "hf")
    opened = lamina.open(tmp_path / "hf", quantized=scheme).model
    want = quant.quantize(model, scheme)  # the same quantization of the float model
    assert quant.scheme_of(opened) == quant.scheme_of(want)
    floats = [n for n, p in opened.named_parameters() if p.dim() == 2 and p.is_floating_point()]
    assert floats == ([] if tie else ["embed.wte.weight"])  # an untied table stays exact
    ids = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(opened(ids), want(ids), atol=0, rtol=0)
    with pytest.raises(lamina.LaminaError, match="quantized must be one of int8, int4"):
        lamina.open(tmp_path / "hf", quantized="q4")


def test_open_hands_freed_pages_back_where_glibc_can():
    import platform

    from lamina.libc import trim_freed_memory

    glibc = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
    assert trim_freed_memory() is glibc
