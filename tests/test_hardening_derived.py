"""Derived files carry a hash of what they were derived from, checked on use (issue 22, class
3): the token cache, a prepared folder's tokenizer, eval on a changed training file, shard
names in index.json, --init-from with a --tokenizer it would ignore, NaN in an --init-from."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import CORPUS_TEXT
from tiny_run import tiny_run

import lamina
from lamina.cli import main
from lamina.data.shards import open_prepared
from lamina.data.text_splits import text_splits
from lamina.errors import LaminaError, LaminaWarning


@pytest.fixture(scope="module")
def run() -> Path:
    return tiny_run()


def test_a_cache_entry_with_other_bytes_of_the_right_length_is_caught(tmp_path, monkeypatch):
    monkeypatch.setenv("LAMINA_CACHE", str(tmp_path / "cache"))
    a = text_splits("byte", CORPUS_TEXT, 0.1)
    (entry,) = (tmp_path / "cache" / "tokens").iterdir()
    bad = np.load(entry / "train.npy")
    bad[:100] = bad[100:200]  # same length, same dtype, ids in range: only a hash can tell
    np.save(entry / "train.npy", bad)
    with pytest.warns(LaminaWarning, match="damaged"):
        b = text_splits("byte", CORPUS_TEXT, 0.1)
    assert not b.cached and np.array_equal(a.train, b.train)


def test_a_prepared_folder_refuses_another_tokenizer_of_the_same_size(tmp_path, capsys):
    (tmp_path / "c.txt").write_text("abcdefgh " * 200)
    out = tmp_path / "prep"
    assert main(["prepare", str(tmp_path / "c.txt"), "--out", str(out), "--quiet"]) == 0
    tok = json.loads((out / "tokenizer.json").read_text())
    key = next(k for k, v in tok.items() if isinstance(v, (list, str)) and len(v) > 3)
    tok[key] = tok[key][::-1]  # the same characters in another order: the same vocab size
    (out / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(LaminaError, match="not the tokenizer these shards were written with"):
        open_prepared(out)


def test_index_shard_names_may_not_leave_the_folder(tmp_path):
    (tmp_path / "c.txt").write_text("abcdefgh " * 200)
    out = tmp_path / "prep"
    assert main(["prepare", str(tmp_path / "c.txt"), "--out", str(out), "--quiet"]) == 0
    index = json.loads((out / "index.json").read_text())
    index["shards"][0]["file"] = "../c.txt"
    (out / "index.json").write_text(json.dumps(index))
    with pytest.raises(LaminaError, match=r"shards\[0\]\.file: expected a plain file name"):
        open_prepared(out)


def test_eval_refuses_a_run_whose_training_file_changed(run, capsys):
    corpus = run.parent / "c.txt"
    assert main(["eval", str(run)]) == 0
    capsys.readouterr()
    original = corpus.read_text()
    try:
        corpus.write_text(original.replace("question", "questions"))
        assert main(["eval", str(run)]) == 2
        assert "has changed since" in capsys.readouterr().err
        assert main(["eval", str(run), "--data", str(corpus)]) == 0  # said explicitly: scored
    finally:
        corpus.write_text(original)


def test_init_from_refuses_a_tokenizer_it_would_ignore(run, tmp_path, capsys):
    code = main(["train", "--init-from", str(run), "--tokenizer", "byte", "--max-steps", "1",
                 "--data", str(run.parent / "c.txt"), "--out", str(tmp_path / "ft"), "--quiet"])  # fmt: skip
    assert code == 2 and "would be ignored" in capsys.readouterr().err
    assert not (tmp_path / "ft").exists()


def test_nan_in_an_init_from_source_names_the_source_not_the_lr(run, tmp_path, capsys):
    model, tok = lamina.load(run)
    with torch.no_grad():
        next(model.parameters())[0, 0] = float("nan")
    lamina.save(tmp_path / "nan", model, tok)
    code = main(["train", "--init-from", str(tmp_path / "nan"), "--max-steps", "1", "--quiet",
                 "--data", str(run.parent / "c.txt"), "--out", str(tmp_path / "ft")])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "--init-from" in err and "not finite" in err and "--lr" not in err
