"""Issue 17, class 6: no traceback anywhere a user can reach.

Output that cannot be written (a closed pipe, a full device, no stdout at all) is handled once
in `lamina.cli.main` for every verb; a closed stdin, a seed beyond 64 bits, a device this
machine lacks and folders that cannot be written are one line and exit 2; the API raises
`LaminaError` rather than torch's errors.
"""

from __future__ import annotations

import errno
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import lamina
from lamina import GPT, GPTConfig, LaminaError
from lamina.cli import main
from lamina.data import CharTokenizer

TEXT = "the cat sat on the mat.\nthe dog ate the log.\n" * 20
SRC = Path(__file__).resolve().parent.parent / "src"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    tok = CharTokenizer.from_text(TEXT)
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=tok.vocab_size, block_size=16, d_model=16, n_layers=1, n_heads=2)
    return lamina.save(tmp_path_factory.mktemp("m") / "model", GPT(cfg), tok)


class FailingStdout:
    """A stdout whose writes fail the way a closed pipe or a full device makes them fail."""

    def __init__(self, error: OSError) -> None:
        self.error = error

    def write(self, text: str) -> int:
        raise self.error

    def flush(self) -> None:
        raise self.error


def run_with_stdout(monkeypatch, capsys, stdout, argv: list[str]) -> tuple[int, str]:
    capsys.readouterr()
    monkeypatch.setattr(sys, "stdout", stdout)
    code = main(argv)
    return code, capsys.readouterr().err


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("verb", ["sample", "eval", "count"])
def test_closed_pipe_ends_quietly_and_full_device_is_one_line(
    verb, model_dir, tmp_path, monkeypatch, capsys
):
    """`| head -c 10` (EPIPE): status 141, nothing on stderr; `> /dev/full` (ENOSPC): one line,
    exit 2; no stdout at all (`>&-`): one line, exit 2. The same for every verb."""
    corpus = tmp_path / "c.txt"
    corpus.write_text(TEXT)
    argv = {
        "sample": ["sample", str(model_dir), "--prompt", "the", "--max-new-tokens", "5"],
        "eval": ["eval", str(model_dir), "--data", str(corpus)],
        "count": ["count", "tiny"],
    }[verb]
    pipe = FailingStdout(BrokenPipeError(errno.EPIPE, "Broken pipe"))
    assert run_with_stdout(monkeypatch, capsys, pipe, argv) == (141, "")
    full = FailingStdout(OSError(errno.ENOSPC, "No space left on device"))
    code, err = run_with_stdout(monkeypatch, capsys, full, argv)
    assert code == 2
    assert (
        one_line(err) == f"lamina {verb}: error: cannot write the output: No space left on device"
    )
    code, err = run_with_stdout(monkeypatch, capsys, None, argv)
    assert code == 2 and "standard output is closed" in one_line(err)


def test_real_closed_pipe_leaves_no_traceback(model_dir):
    """The real thing, in a fresh interpreter: `| head -c 10`, whose flush at exit would
    otherwise print 'Exception ignored ... BrokenPipeError' after the command returned."""
    cmd = [sys.executable, "-m", "lamina", "sample", str(model_dir), "--prompt", "the"]
    cmd += ["--max-new-tokens", "3000", "--seed", "1"]
    env = {"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    head = p.stdout.read(10)
    p.stdout.close()
    err = p.stderr.read().decode()
    p.wait(timeout=60)
    assert len(head) == 10 and p.returncode == 141 and err == "", err


def test_prompt_from_a_closed_stdin(model_dir, monkeypatch, capsys):
    """`--prompt-file -` with stdin closed (`<&-`): one line, exit 2."""
    monkeypatch.setattr(sys, "stdin", None)
    assert main(["sample", str(model_dir), "--prompt-file", "-"]) == 2
    assert "standard input is closed" in one_line(capsys.readouterr().err)


@pytest.mark.parametrize("seed", [2**64, 10**30, -1])
def test_seed_beyond_64_bits(model_dir, capsys, seed):
    """A --seed torch cannot take is refused up front; so is seed= in the API."""
    assert main(["sample", str(model_dir), "--prompt", "the", "--seed", str(seed)]) == 2
    assert "--seed must be in [0, 2**64)" in one_line(capsys.readouterr().err)
    model, tok = lamina.load(model_dir)
    with pytest.raises(LaminaError, match="seed must be an integer"):
        lamina.generate(model, torch.tensor([tok.encode("the")]), 2, temperature=1.0, seed=seed)


def test_top_seed_still_works(model_dir):
    """2**64 - 1 is a valid seed: the bound is exact, not a guess."""
    model, tok = lamina.load(model_dir)
    out = lamina.generate(
        model, torch.tensor([tok.encode("the")]), 2, temperature=1.0, seed=2**64 - 1
    )
    assert out.shape == (1, 5)


@pytest.mark.parametrize(
    ("device", "match"),
    [
        ("foo", "unknown device 'foo'"),
        ("meta", "holds no data"),
        pytest.param(
            "cuda",
            "CUDA is not available",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA"),
        ),
        pytest.param(
            "cuda:99",
            "CUDA",
            marks=pytest.mark.skipif(
                torch.cuda.device_count() >= 100, reason="this machine has 100 GPUs"
            ),
        ),
    ],
)
def test_devices_this_machine_lacks(model_dir, capsys, device, match):
    """`--device cuda` on a CPU-only machine, or `--device foo`: one line, exit 2 (and a
    LaminaError from lamina.load)."""
    assert main(["sample", str(model_dir), "--prompt", "the", "--device", device]) == 2
    assert match in one_line(capsys.readouterr().err)
    with pytest.raises(LaminaError, match=match):
        lamina.load(model_dir, device=device)


@pytest.mark.parametrize("out", ["/etc/passwd/x", "/proc/lamina-x"])
def test_folders_that_cannot_be_written(model_dir, capsys, out):
    """`convert --to hf` and `lessons` into a path under a file, or into /proc: one line, exit 2
    (root ignores permissions, so these are the read-only places a test can use)."""
    if not Path(out).parent.exists():
        pytest.skip(f"{Path(out).parent} does not exist here")
    assert main(["convert", "--to", "hf", str(model_dir), "--out", out]) == 2
    assert f"--out {out}" in one_line(capsys.readouterr().err)
    assert main(["lessons", "--dest", out]) == 2
    assert f"--dest {out}" in one_line(capsys.readouterr().err)


def test_api_save_onto_a_file_and_ids_of_any_integer_dtype(model_dir, tmp_path):
    """lamina.save onto a file (or under one) is a LaminaError, not FileExistsError; generate
    takes uint8 ids like int64 ones, and refuses sizes torch would overflow on."""
    model, tok = lamina.load(model_dir)
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(LaminaError, match="it is a file, not a folder"):
        lamina.save(a_file, model, tok)
    with pytest.raises(LaminaError, match="cannot create the folder"):
        lamina.save(a_file / "sub", model, tok)
    assert a_file.read_text() == "x"
    ids = tok.encode("the")
    as_uint8 = lamina.generate(model, torch.tensor([ids], dtype=torch.uint8), 4)
    assert torch.equal(as_uint8, lamina.generate(model, torch.tensor([ids]), 4))
    with pytest.raises(LaminaError, match="max_new_tokens"):
        lamina.generate(model, torch.tensor([ids]), 2**62)
    with pytest.raises(LaminaError, match="tokens in all"):
        lamina.generate(model, torch.tensor([ids] * 8), 2**26)


def test_an_output_encoding_without_the_characters_is_one_line(tmp_path, monkeypatch, capsys):
    """PYTHONIOENCODING=ascii and a sample with 'é': one line saying what to set, exit 2."""
    tok = CharTokenizer.from_text("é")
    cfg = GPTConfig(vocab_size=tok.vocab_size, block_size=8, d_model=8, n_layers=1, n_heads=2)
    d = lamina.save(tmp_path / "m", GPT(cfg), tok)

    class AsciiStdout:
        def write(self, text: str) -> int:
            return len(text.encode("ascii"))

        def flush(self) -> None:
            pass

    code, err = run_with_stdout(
        monkeypatch, capsys, AsciiStdout(), ["sample", str(d), "--prompt", "é"]
    )
    assert code == 2
    assert "its encoding ascii has no 'é' (set PYTHONIOENCODING=utf-8)" in one_line(err)


def test_malformed_config_json_is_a_lamina_error(model_dir, tmp_path):
    """'format' that is not a number, or a model section missing required fields."""
    import json
    import shutil

    d = tmp_path / "copy"
    shutil.copytree(model_dir, d)
    data = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**data, "format": "1"}))
    with pytest.raises(LaminaError, match="'format' must be an integer"):
        lamina.load(d)
    (d / "config.json").write_text(json.dumps({**data, "model": {"d_model": 16}}))
    with pytest.raises(LaminaError, match="not a valid GPTConfig"):
        lamina.load(d)
