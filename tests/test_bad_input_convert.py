"""Issue 17, class 8: `convert --from hf` takes no tokenizer it cannot use, and drops none
without a word: more ids than the model has is refused, broken files are refused naming the
file, tokenizers of another kind are a one-line warning naming the file and why."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import lamina
from lamina import GPT, GPTConfig, LaminaError, LaminaWarning
from lamina.cli import main
from lamina.tokenizers.hf_files import save_hf_tokenizer, tokenizer_from_hf
from lamina.tokenizers.subword import BPETokenizer

CONFIG = GPTConfig(vocab_size=100, block_size=8, d_model=8, n_layers=1, n_heads=2)
TEXT = "the quick brown fox jumps over the lazy dog. " * 40


@pytest.fixture
def hf_dir(tmp_path) -> Path:
    d = tmp_path / "hf"
    lamina.save_hf(GPT(CONFIG), d)
    return d


def convert(d: Path, out: Path, capsys) -> tuple[int, str, str]:
    code = main(["convert", "--from", "hf", str(d), "--out", str(out)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err.strip()


def test_tokenizer_with_more_ids_than_the_model_is_refused(hf_dir, tmp_path, capsys):
    """A 300-id tokenizer next to a 100-id model used to convert, and fail only in sample."""
    save_hf_tokenizer(BPETokenizer.train(TEXT, 300), hf_dir)
    code, _, err = convert(hf_dir, tmp_path / "out", capsys)
    assert code == 2 and len(err.splitlines()) == 1
    assert "more than the model's vocab_size 100" in err
    assert not (tmp_path / "out").exists()
    with pytest.raises(LaminaError, match="ids 100 and up would have no embedding"):
        tokenizer_from_hf(hf_dir, vocab_size=100)
    assert tokenizer_from_hf(hf_dir, vocab_size=300) is not None


@pytest.mark.parametrize(
    ("files", "match"),
    [
        (
            {"vocab.json": "{broken", "merges.txt": "#version: 0.2\na b\n"},
            "vocab.json is not valid JSON",
        ),
        (
            {"vocab.json": "[1, 2]", "merges.txt": "#version: 0.2\na b\n"},
            "vocab.json is not a vocabulary",
        ),
        ({"tokenizer.json": "{not json"}, "tokenizer.json is not valid JSON"),
        ({"tokenizer.json": '{"model": 3}'}, "tokenizer.json is not a Hugging Face tokenizer"),
        ({"merges.txt": b"#version: 0.2\n\xff\xfe\n"}, "merges.txt is not UTF-8"),
    ],
)
def test_broken_tokenizer_files_are_refused_naming_the_file(hf_dir, tmp_path, capsys, files, match):
    for name, content in files.items():
        if isinstance(content, bytes):
            (hf_dir / name).write_bytes(content)
        else:
            (hf_dir / name).write_text(content)
    code, _, err = convert(hf_dir, tmp_path / "out", capsys)
    assert code == 2 and len(err.splitlines()) == 1 and match in err, err
    assert not (tmp_path / "out").exists()


def _wordpiece_json() -> str:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordPiece({"[UNK]": 0, "the": 1, "fox": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tok.to_str()


@pytest.mark.parametrize(
    ("files", "named", "why"),
    [
        (
            {"merges.txt": "#version: 0.2\nt h\nth e\n", "vocab.json": '{"t": 0, "h": 1}'},
            "merges.txt",
            "not GPT-2's merges",
        ),
        ({"vocab.json": '{"t": 0, "h": 1}'}, "vocab.json", "no merges.txt"),
    ],
)
def test_tokenizers_of_another_kind_are_a_warning_naming_the_file(
    hf_dir, tmp_path, capsys, files, named, why
):
    """The weights convert; one warning line says which tokenizer file was left and why (it
    used to be a silent 'tokenizer: none found')."""
    for name, content in files.items():
        (hf_dir / name).write_text(content)
    code, out, err = convert(hf_dir, tmp_path / "out", capsys)
    assert code == 0 and out.startswith("wrote ")
    assert err.startswith("lamina convert: warning: ") and len(err.splitlines()) == 1, err
    assert f"{hf_dir / named} not converted: {why}" in err
    assert lamina.load(tmp_path / "out")[1] is None
    with pytest.warns(LaminaWarning, match=why):
        assert tokenizer_from_hf(hf_dir) is None


def test_a_tokenizer_json_of_any_kind_is_carried(hf_dir, tmp_path, capsys):
    """A WordPiece tokenizer.json (once a warning and dropped) converts as kind "pretrained"."""
    (hf_dir / "tokenizer.json").write_text(_wordpiece_json())
    code, out, err = convert(hf_dir, tmp_path / "out", capsys)
    assert code == 0 and err == "" and "tokenizer: pretrained" in out
    carried = lamina.load(tmp_path / "out")[1]
    assert carried.encode("the fox the") == [1, 2, 1] and carried.decode([1, 2]) == "the fox"


def test_folder_without_tokenizer_files_converts_silently(hf_dir, tmp_path, capsys):
    code, out, err = convert(hf_dir, tmp_path / "out", capsys)
    assert code == 0 and err == "" and "tokenizer: none found" in out
    assert json.loads((tmp_path / "out" / "config.json").read_text())["kind"] == "gpt"


def test_a_model_folder_whose_tokenizer_outgrows_the_model_is_refused(tmp_path):
    """The same rule when loading a lamina folder (e.g. one written by an older convert)."""
    tok = BPETokenizer.train(TEXT, 300)
    d = lamina.save(tmp_path / "m", GPT(CONFIG), tok)
    with pytest.raises(LaminaError, match=r"has \d+ ids, more than the model's vocab_size 100"):
        lamina.load(d)
