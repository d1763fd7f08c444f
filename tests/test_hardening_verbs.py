"""Verbs given the wrong model kind or odd input say so in one line, and messages point the
right way (issue 22, classes 6 and 7)."""

from __future__ import annotations

import io
import json
import os
import stat
import sys
from pathlib import Path

import pytest
import torch

import lamina
from lamina import GPT, GPTConfig
from lamina.cli import main
from lamina.models.config import EncoderConfig
from lamina.models.encoder import SequenceClassifier
from lamina.tokenizers.kinds import CharTokenizer


@pytest.fixture(scope="module")
def classifier(tmp_path_factory) -> Path:
    tok = CharTokenizer.from_text("abchi ")
    torch.manual_seed(0)
    cfg = EncoderConfig(vocab_size=tok.vocab_size + 2, max_len=8, d_model=16, n_heads=2,
                        n_layers=1, d_ff=32)  # fmt: skip
    model = SequenceClassifier(cfg, 2)
    model.labels = ["no", "yes"]
    return lamina.save(tmp_path_factory.mktemp("cls") / "m", model, tok)


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err, err
    return err


def test_a_verb_that_needs_a_decoder_says_so(classifier, tmp_path, capsys):
    for argv in (
        ["attention", str(classifier), "--text", "hi", "--out", str(tmp_path / "a.png")],
        ["quantize", str(classifier), "--to", "int8", "--out", str(tmp_path / "q")],
        ["convert", "--to", "hf", str(classifier), "--out", str(tmp_path / "h")],
    ):
        assert main(argv) == 2, argv
        assert "not a decoder (GPT)" in one_line(capsys)


def test_plot_refuses_a_string_loss_in_one_line(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    lines = [{"step": 1, "loss": 2.5}, {"step": 2, "loss": "high"}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert main(["plot", str(run), "--out", str(tmp_path / "c.svg")]) == 2
    err = one_line(capsys)
    assert "metrics.jsonl line 2" in err and "loss" in err


def test_sample_quantize_int4_picks_a_group_size_itself(tmp_path, capsys):
    """`sample` has no --group-size: int4 takes the largest group that divides the widths."""
    tok = CharTokenizer.from_text("abcdefgh \n")
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=tok.vocab_size, block_size=32, d_model=64, n_heads=4, n_layers=2)
    lamina.save(tmp_path / "m", GPT(cfg), tok)
    argv = ["sample", str(tmp_path / "m"), "--prompt", "abc", "--max-new-tokens", "4"]
    assert main([*argv, "--quantize", "int4"]) == 0, capsys.readouterr().err
    assert capsys.readouterr().out.startswith("abc")


def test_predict_reads_stdin_for_input_dash(classifier, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"hi\nab c\n")))
    assert main(["predict", str(classifier), "--input", "-"]) == 0
    got = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [g["text"] for g in got] == ["hi", "ab c"]


def test_prepare_val_by_documents_on_one_document_says_so_at_once(tmp_path, capsys):
    (tmp_path / "one.txt").write_text("a single document " * 50)
    argv = ["prepare", str(tmp_path / "one.txt"), "--out", str(tmp_path / "p"), "--quiet"]
    assert main([*argv, "--val-by", "documents"]) == 2
    err = one_line(capsys)
    assert "held out no document" in err and "--val-by tail" in err
    assert not (tmp_path / "p").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")
def test_predict_output_to_a_char_device_writes_into_it(classifier, tmp_path, capsys):
    """The issue's example: `predict RUN text --output dev/mynull` left a regular file."""
    dev = tmp_path / "mynull"
    os.mknod(dev, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # what /dev/null is
    assert main(["predict", str(classifier), "hi", "--output", str(dev)]) == 0
    assert stat.S_ISCHR(dev.lstat().st_mode)
    assert (
        main(["predict", str(classifier), "hi", "--output", str(classifier / "config.json")]) == 2
    )
    assert "destroy the input" in capsys.readouterr().err
