"""`lamina sample`: streams text from a model directory; bad input is one line and exit 2."""

import io
import re
import sys

import pytest
import torch

from lamina import GPT, GPTConfig
from lamina.checkpoint import save_model
from lamina.cli import main
from lamina.data import CharTokenizer

TEXT = "ROMEO:\nBut soft, what light through yonder window breaks?\nJULIET: ay me!\n"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    tok = CharTokenizer.from_text(TEXT)
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny", vocab_size=tok.vocab_size, block_size=16, init_std=0.1))
    return save_model(tmp_path_factory.mktemp("run"), model, tok)


def sample(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["sample", *map(str, argv)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_prints_the_prompt_then_max_new_tokens_characters(run_dir, capsys):
    code, out, err = sample(
        capsys, run_dir, "--prompt", "ROMEO:", "--max-new-tokens", 40, "--seed", 1
    )
    assert code == 0 and err == ""
    assert out.startswith("ROMEO:") and out.endswith("\n")
    assert len(out) == len("ROMEO:") + 40 + 1


def test_same_seed_same_text_and_samples_are_separated(run_dir, capsys):
    args = (run_dir, "--prompt", "ay", "--max-new-tokens", 30, "--temperature", 1.0)
    args += ("--top-k", 5, "--top-p", 0.9, "--seed", 3, "--num-samples", 3)
    _, a, _ = sample(capsys, *args)
    _, b, _ = sample(capsys, *args)
    assert a == b
    parts = a.split("\n" + "-" * 40 + "\n")
    assert len(parts) == 3 and all(p.startswith("ay") for p in parts)
    assert len(set(parts)) > 1, "samples after the first continue the random stream"


def test_greedy_text_matches_generate(run_dir, capsys):
    from lamina import load
    from lamina.generation import generate

    model, tok = load(run_dir)
    ids = generate(model, torch.tensor([tok.encode("JULIET:")]), 25)
    _, out, _ = sample(
        capsys, run_dir, "--prompt", "JULIET:", "--max-new-tokens", 25, "--temperature", 0
    )
    assert out == tok.decode(ids[0]) + "\n"


def test_text_is_streamed_as_it_is_produced(run_dir, monkeypatch):
    writes: list[str] = []

    class Recorder:
        def write(self, s: str) -> None:
            writes.append(s)

        def flush(self) -> None:
            writes.append("<flush>")

    monkeypatch.setattr(sys, "stdout", Recorder())
    assert (
        main(["sample", str(run_dir), "--prompt", "ay", "--max-new-tokens", "20", "--seed", "0"])
        == 0
    )
    assert writes.count("<flush>") >= 20


def test_a_stop_string_ends_the_sample_right_after_it(run_dir, capsys):
    _, free, _ = sample(
        capsys, run_dir, "--prompt", "ROMEO:", "--max-new-tokens", 40, "--temperature", 0
    )
    cont = free[len("ROMEO:") : -1]
    stop = cont[10:12]
    _, out, _ = sample(
        capsys,
        run_dir,
        "--prompt",
        "ROMEO:",
        "--max-new-tokens",
        40,
        "--temperature",
        0,
        "--stop",
        stop,
    )
    expected = cont[: cont.find(stop) + len(stop)]
    assert out == "ROMEO:" + expected + "\n"


def test_prompt_from_a_file_and_from_stdin(run_dir, capsys, tmp_path, monkeypatch):
    f = tmp_path / "prompt.txt"
    f.write_text("JULIET:", encoding="utf-8")
    base = ("--max-new-tokens", 10, "--temperature", 0)
    _, by_flag, _ = sample(capsys, run_dir, "--prompt", "JULIET:", *base)
    _, by_file, _ = sample(capsys, run_dir, "--prompt-file", f, *base)
    monkeypatch.setattr(sys, "stdin", io.StringIO("JULIET:"))
    _, by_stdin, _ = sample(capsys, run_dir, "--prompt-file", "-", *base)
    assert by_flag == by_file == by_stdin


def test_an_empty_prompt_uses_the_start_token_when_there_is_one(tmp_path, capsys):
    from lamina.tokenizers.subword import BPETokenizer

    tok = BPETokenizer.train(TEXT * 4, 270)
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny", vocab_size=tok.vocab_size, block_size=16))
    save_model(tmp_path, model, tok)
    code, out, err = sample(capsys, tmp_path, "--max-new-tokens", 5, "--seed", 0)
    assert code == 0 and err == "" and out.endswith("\n")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--prompt", "ROMEO~#"], "does not know: '#', '~'"),
        (["--prompt", ""], "empty"),
        (["--prompt", "a", "--max-new-tokens", "0"], "--max-new-tokens must be positive"),
        (["--prompt", "a", "--max-new-tokens", "-5"], "--max-new-tokens must be positive"),
        (["--prompt", "a", "--temperature", "-1"], "temperature.*-1"),
        (["--prompt", "a", "--top-k", "0"], "top_k.*0"),
        (["--prompt", "a", "--top-p", "1.5"], "top_p.*1.5"),
        (["--prompt", "a", "--num-samples", "0"], "--num-samples"),
        (["--prompt-file", "/nonexistent/prompt.txt"], "prompt file not found"),
    ],
)
def test_bad_input_is_one_line_on_stderr_and_exit_2(run_dir, capsys, argv, message):
    code, out, err = sample(capsys, run_dir, *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("lamina sample: error:")
    assert re.search(message, err), err


def test_without_a_prompt_a_char_model_starts_from_a_newline(run_dir, capsys):
    code, out, _ = sample(capsys, run_dir, "--max-new-tokens", 5, "--seed", 0)
    assert code == 0 and out.startswith("\n") and len(out) == 1 + 5 + 1


def test_an_empty_prompt_file_without_a_start_token_is_exit_2(run_dir, capsys, tmp_path):
    (tmp_path / "empty.txt").write_text("", encoding="utf-8")
    code, _, err = sample(capsys, run_dir, "--prompt-file", tmp_path / "empty.txt")
    assert code == 2 and "empty" in err


def test_a_missing_or_non_run_directory_is_exit_2(tmp_path, capsys):
    for d in (tmp_path / "missing", tmp_path):
        code, out, err = sample(capsys, d, "--prompt", "a")
        assert code == 2 and err.count("\n") == 1 and "error" in err


def test_a_model_directory_without_a_tokenizer_is_exit_2(tmp_path, capsys):
    save_model(tmp_path, GPT(GPTConfig.preset("tiny")))
    code, _, err = sample(capsys, tmp_path, "--prompt", "a")
    assert code == 2 and "tokenizer" in err
