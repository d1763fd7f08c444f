"""`lamina quantize` and `lamina sample --quantize`: folders written whole, read back, refused."""

from __future__ import annotations

import json

import pytest
import torch

import lamina
from lamina import GPT, GPTConfig
from lamina.cli import main
from lamina.tokenizers.kinds import CharTokenizer


@pytest.fixture
def model_dir(tmp_path):
    tok = CharTokenizer.from_text("abcdefgh \n")
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=tok.vocab_size, block_size=32, d_model=64, n_heads=4, n_layers=2)
    lamina.save(tmp_path / "m", GPT(cfg), tok)
    return tmp_path / "m"


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_quantize_then_sample_and_eval_read_it(model_dir, tmp_path, capsys, scheme):
    out = tmp_path / f"m-{scheme}"
    args = ["quantize", str(model_dir), "--to", scheme, "--out", str(out)]
    assert main([*args, "--group-size", "32"]) == 0
    said = capsys.readouterr().out
    assert f"wrote {out} ({scheme}" in said and "MiB" in said
    config = json.loads((out / "config.json").read_text())
    assert config["quantization"]["scheme"] == scheme
    model, tok = lamina.load(out)
    assert lamina.quant.scheme_of(model)["scheme"] == scheme and tok is not None
    assert (
        main(["sample", str(out), "--prompt", "abc", "--max-new-tokens", "5", "--seed", "1"]) == 0
    )
    assert capsys.readouterr().out.startswith("abc")


def test_sample_quantize_on_load_for_one_session(model_dir, capsys):
    args = ["sample", str(model_dir), "--prompt", "ab", "--max-new-tokens", "8", "--seed", "3"]
    assert main([*args, "--temperature", "0", "--quantize", "int8"]) == 0
    assert len(capsys.readouterr().out) >= 2
    assert lamina.quant.scheme_of(lamina.load(model_dir)[0]) is None  # the folder is untouched


def test_refusals_write_nothing(model_dir, tmp_path, capsys):
    out = tmp_path / "q"
    assert main(["quantize", str(model_dir), "--to", "int8", "--out", str(out)]) == 0
    capsys.readouterr()
    again = tmp_path / "qq"
    assert main(["quantize", str(out), "--to", "int8", "--out", str(again)]) == 2
    assert "already quantized" in capsys.readouterr().err and not again.exists()
    assert main(["quantize", str(model_dir), "--to", "int8", "--out", str(out)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert main(["quantize", str(model_dir), "--to", "int8", "--out", str(model_dir)]) == 2
    assert "would destroy the input" in capsys.readouterr().err
    # the widths (64) are not divisible by 128
    bad = tmp_path / "b"
    argv = ["quantize", str(model_dir), "--to", "int4", "--out", str(bad), "--group-size", "128"]
    assert main(argv) == 2
    assert "group_size 128 does not divide" in capsys.readouterr().err and not bad.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no half folders
