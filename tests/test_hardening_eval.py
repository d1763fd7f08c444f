"""Issue 35, class 3: scoring stays within memory whatever the sizes (a very long choice, very
many choices), with the same log-likelihoods; KV caches that cannot fit are refused up front,
naming their size. Class 8: eval's and convert's messages and outputs say what is true once."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import pytest
import torch

from lamina import GPT, GPTConfig, LaminaError
from lamina.cli import main
from lamina.evals import choice as choice_module
from lamina.evals.choice import ChoiceItem, score_items
from lamina.tokenizers.subword import ByteTokenizer


def _model(block: int = 64) -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig.preset("llama-tiny", vocab_size=256, block_size=block, n_layers=2)
    return GPT(cfg).eval()


def _largest_logits(model: GPT, monkeypatch) -> list[int]:
    """Record the elements of every logits tensor the model returns."""
    sizes: list[int] = []
    forward = model.forward

    def recording(*args, **kwargs):
        out = forward(*args, **kwargs)
        sizes.append(out.numel())
        return out

    monkeypatch.setattr(model, "forward", recording)
    return sizes


@pytest.mark.parametrize("method", ["cache", "batch"])
@pytest.mark.parametrize(
    "item",
    [
        ChoiceItem("abc", ("x" * 200, "y"), 0),  # one choice far past the block
        ChoiceItem("the context", tuple(f"choice {i}" for i in range(60)), 7),  # many choices
    ],
    ids=["long-choice", "many-choices"],
)
def test_scoring_is_chunked_within_the_budget_with_the_same_sums(item, method, monkeypatch):
    model, tok = _model(), ByteTokenizer()
    want = score_items(model, tok, [item], method=method)[0].logliks  # budgets far above
    monkeypatch.setattr(choice_module, "LOGIT_BUDGET", 256 * 24)  # 24 positions of logits
    monkeypatch.setattr(choice_module, "MAX_ROWS", 8)
    sizes = _largest_logits(model, monkeypatch)
    got = score_items(model, tok, [item], method=method)[0].logliks
    assert max(sizes) <= 256 * 24 and len(sizes) > 2
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), atol=2e-4, rtol=1e-5)


def test_kv_caches_that_cannot_fit_are_refused_naming_their_size():
    model = _model(block=2**31 - 1)  # a context as large as a GGUF may claim
    c = model.config
    gib = 2 * c.n_layers * c.kv_heads * 10**9 * c.head_dim * 4 / 2**30
    with pytest.raises(LaminaError, match=rf"KV caches for 1 x 1,000,000,000 .* {gib:.1f} GiB"):
        model.make_caches(1, 10**9)
    assert len(model.make_caches(2, 128)) == 2


# -- class 8: messages -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def char_model(tmp_path_factory):
    import lamina
    from lamina.tokenizers.kinds import CharTokenizer

    d = tmp_path_factory.mktemp("msg")
    tok = CharTokenizer.from_text("abcdefgh \n")
    torch.manual_seed(0)
    cfg = GPTConfig.preset("llama-tiny", vocab_size=tok.vocab_size, d_model=32, n_layers=1)
    lamina.save(d / "m", GPT(cfg), tok)
    return d / "m"


def _strict(text: str):
    def refuse(name):
        raise ValueError(f"not strict JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def test_eval_output_keeps_computed_fields_and_json_is_strict(char_model, tmp_path, capsys):
    task = tmp_path / "t.jsonl"
    line = {"context": "ab", "choices": ["c", "d"], "gold": 0, "pred": 9, "acc": "x", "id": 5}
    task.write_text(json.dumps({**line, "index": 7}) + "\n")
    out = tmp_path / "rows.jsonl"
    assert main(["eval", str(char_model), "--task", str(task), "--json", "--output", str(out)]) == 0
    result = _strict(capsys.readouterr().out)
    assert result["items"] == 1 and result["acc_stderr"] is None  # NaN for one item: null
    (row,) = [_strict(t) for t in out.read_text().splitlines()]
    assert row["index"] == 0 and row["pred"] in (0, 1) and row["acc"] in (0.0, 1.0)
    assert row["id"] == 5 and row["task_fields"] == {"pred": 9, "acc": "x", "index": 7}


def _gguf_with_an_infinite_scale(path: Path) -> Path:
    import numpy as np

    from lamina.interop.gguf_write import save_gguf
    from lamina.native.gguf_read import read_gguf

    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("llama-tiny", vocab_size=64, d_model=32, n_layers=1, d_ff=64))
    save_gguf(model, path, None, "q8_0")
    block = read_gguf(path).tensors["token_embd.weight"].raw[0, :34].tobytes()
    data = bytearray(path.read_bytes())
    at = data.find(block)
    data[at : at + 2] = np.array([np.inf], dtype=np.float16).tobytes()  # the block's scale
    path.write_bytes(data)
    return path


def test_a_downloaded_file_with_infinite_scales_is_one_line_with_the_right_advice(tmp_path, capsys):
    bad = _gguf_with_an_infinite_scale(tmp_path / "bad.gguf")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a numpy RuntimeWarning would fail here
        assert main(["convert", "--from", "gguf", str(bad), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not finite" in err
    assert "use another copy" in err and "--lr" not in err


def test_the_path_is_said_once_and_a_fifo_is_no_missing_file(char_model, tmp_path, capsys):
    from lamina.training.finetune import load_source

    trunc = tmp_path / "trunc.gguf"
    trunc.write_bytes(b"GGUF" + bytes(20))
    with pytest.raises(LaminaError) as e:
        load_source(trunc)
    assert str(e.value).count("trunc.gguf") == 1, str(e.value)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for argv, said in [
        (["convert", "--from", "gguf", str(fifo), "--out", str(tmp_path / "o")], "a FIFO"),
        (["eval", str(char_model), "--task", str(fifo)], "is a FIFO, not a regular file"),
        (["sample", str(fifo), "--prompt", "a"], "is a FIFO: a model is"),
    ]:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert said in err and "not found" not in err and "no such" not in err
