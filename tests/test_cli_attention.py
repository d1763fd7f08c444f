"""`lamina attention`: one picture of every head, pattern lines, and clear errors."""

import pytest
import torch

from lamina import GPT, GPTConfig
from lamina.checkpoint import save_model
from lamina.cli import main
from lamina.data import CharTokenizer

TEXT = "ROMEO:\nBut soft, what light through yonder window breaks?\n"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    tok = CharTokenizer.from_text(TEXT)
    torch.manual_seed(0)
    config = GPTConfig.preset("tiny", vocab_size=tok.vocab_size, block_size=24, n_heads=2)
    return save_model(tmp_path_factory.mktemp("run"), GPT(config), tok)


def test_writes_a_png_and_one_line_per_head(run_dir, tmp_path, capsys):
    out = tmp_path / "maps.png"
    assert main(["attention", str(run_dir), "--text", "ROMEO:\nBut", "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert out.read_bytes().startswith(b"\x89PNG")
    assert [ln.split(":")[0] for ln in lines[:-1]] == [
        f"layer {i} head {h}" for i in range(2) for h in range(2)
    ]


def test_one_head_as_svg_and_long_texts_are_cut_with_a_note(run_dir, tmp_path, capsys):
    out = tmp_path / "maps.svg"
    argv = ["attention", str(run_dir), "--text", TEXT, "--layer", "1", "--head", "0"]
    assert main([*argv, "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "cut to its first 24 of" in captured.err
    assert captured.out.splitlines()[0].startswith("layer 1 head 0:")
    assert b"<svg" in out.read_bytes()


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--text", "ROMEO Z"], "'Z' at position 6"),
        (["--text", ""], "empty"),
        (["--text", "RO", "--layer", "2"], "--layer 2 is out of range"),
        (["--text", "RO", "--head", "-1"], "--head -1 is out of range"),
        (["--text", "RO", "--out", "/nonexistent/dir/m.png"], "does not exist"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(run_dir, capsys, extra, message):
    assert main(["attention", str(run_dir), *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_a_folder_that_is_not_a_model_is_exit_2(tmp_path, capsys):
    assert main(["attention", str(tmp_path), "--text", "RO"]) == 2
    assert "not a lamina model" in capsys.readouterr().err


def test_typed_newline_escapes_are_understood(run_dir, tmp_path, capsys):
    out = tmp_path / "m.png"
    assert main(["attention", str(run_dir), "--text", "ROMEO:\\nBut", "--out", str(out)]) == 0
    assert out.is_file() and "wrote" in capsys.readouterr().out
