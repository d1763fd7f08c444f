"""Issue 17, class 7: error messages that say what is actually wrong (and never advise an
unsafe retry)."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch

import lamina
from lamina import GPT, GPTConfig, LaminaError
from lamina.cli import main
from lamina.data import CharTokenizer
from lamina.interop import load_hf

CONFIG = GPTConfig(vocab_size=8, block_size=8, d_model=8, n_layers=1, n_heads=2)


def one_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


class _Code:
    def __reduce__(self):
        return (print, ("this ran",))


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
@pytest.mark.parametrize("layout", ["torch-zip", "raw-pickle"])
def test_pickle_refusal_never_suggests_weights_only_false(tmp_path, layout):
    """torch's own message advises re-running with weights_only=False, which would run the
    pickle's code; lamina's says it refuses a pickle and how to convert one safely."""
    d = tmp_path / "hf"
    lamina.save_hf(GPT(CONFIG), d)
    (d / "model.safetensors").unlink()
    payload = {"transformer.wte.weight": torch.zeros(8, 8), "x": _Code()}
    if layout == "torch-zip":
        torch.save(payload, d / "pytorch_model.bin")
    else:
        (d / "pytorch_model.bin").write_bytes(pickle.dumps(payload))
    with pytest.raises(LaminaError) as e:
        load_hf(d)
    msg = str(e.value)
    assert "\n" not in msg and "weights_only" not in msg and "False" not in msg
    assert "pickle" in msg and "safetensors" in msg and "never runs code" in msg


def test_truncated_bin_is_called_unreadable_not_unsafe(tmp_path):
    d = tmp_path / "hf"
    lamina.save_hf(GPT(CONFIG), d)
    (d / "model.safetensors").unlink()
    torch.save({"a": torch.zeros(2)}, d / "full.bin")
    (d / "pytorch_model.bin").write_bytes((d / "full.bin").read_bytes()[:100])
    with pytest.raises(LaminaError, match="not a readable PyTorch weights file") as e:
        load_hf(d)
    assert "weights_only" not in str(e.value)


@pytest.fixture
def no_newline_model(tmp_path) -> Path:
    """A char model whose alphabet has no newline and no start token."""
    tok = CharTokenizer.from_text("abcdefg ")
    return lamina.save(tmp_path / "m", GPT(CONFIG), tok)


def test_sampling_without_a_prompt_says_so(no_newline_model, capsys):
    """No --prompt, and the default newline is not in the alphabet: the error says no prompt was
    given, not that the prompt holds a character the user never typed."""
    assert main(["sample", str(no_newline_model)]) == 2
    err = one_error(capsys)
    assert "no --prompt given" in err and "'\\n'" not in err and "the prompt has" not in err
    assert main(["sample", str(no_newline_model), "--prompt", "ab\nc"]) == 2
    assert "the prompt has 1 character(s) the tokenizer does not know: '\\n'" in one_error(capsys)


def test_prompt_file_that_is_a_folder_or_missing(no_newline_model, tmp_path, capsys):
    """A folder is "a folder, not a file"; only a missing path is "not found"."""
    assert main(["sample", str(no_newline_model), "--prompt-file", str(tmp_path)]) == 2
    assert f"--prompt-file {tmp_path} is a folder, not a file" in one_error(capsys)
    missing = tmp_path / "nope.txt"
    assert main(["sample", str(no_newline_model), "--prompt-file", str(missing)]) == 2
    assert f"prompt file not found: {missing}" in one_error(capsys)


def test_generate_names_the_dtype_of_float_ids():
    """Float ids: the message names the dtype (the shape was fine); a list of floats is refused
    instead of being truncated to integers (1.5 became 1)."""
    model = GPT(CONFIG)
    with pytest.raises(LaminaError, match="integer token ids, got dtype torch.float32"):
        lamina.generate(model, torch.tensor([[1.0, 2.0]]), 2)
    with pytest.raises(LaminaError, match=r"shape \(1, 1, 2\)"):
        lamina.generate(model, torch.tensor([[[1, 2]]]), 2)
    with pytest.raises(LaminaError, match="prompt 1 must hold integer token ids"):
        lamina.generate(model, [[1, 2], [1.5, 2.0]], 2)


def test_a_file_given_as_model_folder_says_so(tmp_path):
    """`lamina sample FILE` said "no such model directory" about a file that exists."""
    f = tmp_path / "model.safetensors"
    f.write_bytes(b"x")
    with pytest.raises(LaminaError, match="is a file; a model is a folder"):
        lamina.load(f)
    with pytest.raises(LaminaError, match="no such model directory"):
        lamina.load(tmp_path / "missing")
