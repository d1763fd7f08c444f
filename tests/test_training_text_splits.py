"""Scoring per character on the same validation text for every tokenizer; the token cache."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from conftest import CORPUS_TEXT

from lamina.cli import main
from lamina.data.spec import build_tokenizer
from lamina.data.text_splits import cache_root, split_text, text_splits
from lamina.errors import LaminaError, LaminaWarning
from lamina.tokenizers import subword
from lamina.tokenizers.kinds import save_tokenizer
from lamina.training.config import TrainConfig
from lamina.training.loop import run_training
from lamina.training.session import new_session


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LAMINA_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def fits(monkeypatch):
    """Counts BPE fits."""
    calls = {"n": 0}
    real = subword.BPETokenizer.train.__func__

    def counted(cls, *a, **k):
        calls["n"] += 1
        return real(cls, *a, **k)

    monkeypatch.setattr(subword.BPETokenizer, "train", classmethod(counted))
    return calls


def test_every_tokenizer_is_validated_on_the_same_characters(cache):
    train_text, val_text = split_text(CORPUS_TEXT, 0.1)
    assert train_text + val_text == CORPUS_TEXT
    assert len(val_text) == len(CORPUS_TEXT) - int(len(CORPUS_TEXT) * 0.9)
    char, bpe = text_splits("char", CORPUS_TEXT, 0.1), text_splits("bpe:300", CORPUS_TEXT, 0.1)
    assert len(bpe.val) < len(char.val)  # BPE: fewer tokens for the same text
    for s in (char, bpe):
        assert s.tokenizer.decode(s.val.tolist()) == val_text
        assert s.tokenizer.decode(s.train.tolist()) == train_text
        first = len(s.tokenizer.decode([int(s.val[0])]))
        assert s.val_chars == len(val_text) - first  # the characters next-token loss predicts
    assert char.val_chars == len(char.val) - 1  # char: per character == per token


def _pieces(tok) -> set[str]:
    return set(json.loads(tok.to_dict()["tokenizer"])["model"]["vocab"])


def test_bpe_is_fit_on_the_training_text_only(cache):
    """A word only the validation text has gets no merge of its own."""
    text = "the cat sat on the mat. " * 40 + "zyzzyva " * 40
    assert split_text(text, 0.25)[1] == "zyzzyva " * 40
    whole = build_tokenizer("bpe:266", text)  # control: fit on everything, it merges "zy"
    assert any("zy" in p for p in _pieces(whole))
    s = text_splits("bpe:266", text, 0.25)
    assert not any("zy" in p for p in _pieces(s.tokenizer))


def test_char_model_reports_equal_per_char_and_per_token(corpus, tmp_path, capsys):
    args = ["train", "--data", corpus, "--preset", "tiny", "--max-steps", "3", "--batch-size",
            "2", "--block-size", "16", "--eval-batches", "1", "--quiet"]  # fmt: skip
    assert main([*args, "--out", str(tmp_path / "c")]) == 0
    out = capsys.readouterr().out
    assert "nats/char (" in out and "bits/char; " in out and "nats/token)" in out
    rec = [json.loads(x) for x in open(tmp_path / "c" / "metrics.jsonl")]
    last = [r for r in rec if "val_loss" in r][-1]
    assert last["val_loss_per_char"] == pytest.approx(last["val_loss"], rel=1e-12)
    assert main(["eval", str(tmp_path / "c"), "--json"]) == 0
    ev = json.loads(capsys.readouterr().out)
    assert ev["loss_per_char"] == pytest.approx(ev["loss"], rel=1e-12)
    assert ev["bits_per_char"] == pytest.approx(ev["loss"] / math.log(2))
    assert {"run", "data", "loss", "perplexity", "tokens"} <= set(ev)
    assert ev["tokens"] == ev["chars"]


def test_bpe_model_is_scored_per_character_of_the_same_text(corpus, tmp_path, capsys, cache):
    args = ["train", "--data", corpus, "--preset", "tiny", "--max-steps", "3", "--batch-size",
            "2", "--block-size", "16", "--eval-batches", "1", "--quiet"]  # fmt: skip
    assert main([*args, "--tokenizer", "bpe:300", "--out", str(tmp_path / "b")]) == 0
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "b"), "--json"]) == 0
    ev = json.loads(capsys.readouterr().out)
    s = text_splits("bpe:300", CORPUS_TEXT, 0.1)
    assert ev["chars"] == s.val_chars and ev["tokens"] == len(s.val) - 1
    # total loss over the text / its characters
    assert ev["loss_per_char"] == pytest.approx(ev["loss"] * ev["tokens"] / ev["chars"])
    assert ev["loss_per_char"] < ev["loss"]  # a BPE token covers several characters
    assert main(["eval", str(tmp_path / "b")]) == 0
    text = capsys.readouterr().out
    assert "nats/char" in text and "characters" in text


def test_a_second_run_reads_the_cache_and_a_corrupt_entry_is_rewritten(cache, fits):
    a = text_splits("bpe:300", CORPUS_TEXT, 0.1)
    assert fits["n"] == 1 and not a.cached
    entries = list((cache / "tokens").iterdir())
    assert len(entries) == 1
    assert {p.name for p in entries[0].iterdir()} >= {"tokenizer.json", "train.npy", "val.npy",
                                                      "meta.json"}  # fmt: skip
    b = text_splits("bpe:300", CORPUS_TEXT, 0.1)
    assert fits["n"] == 1 and b.cached  # no refit, no re-encode
    assert np.array_equal(a.train, b.train) and np.array_equal(a.val, b.val)
    assert b.val_chars == a.val_chars and b.tokenizer.to_dict() == a.tokenizer.to_dict()
    (entries[0] / "val.npy").write_bytes(b"not an array")
    with pytest.warns(LaminaWarning, match="damaged"):
        c = text_splits("bpe:300", CORPUS_TEXT, 0.1)
    assert fits["n"] == 2 and not c.cached and np.array_equal(c.val, a.val)
    assert text_splits("bpe:300", CORPUS_TEXT, 0.1).cached  # rewritten
    text_splits("bpe:300", CORPUS_TEXT, 0.2)  # another split: another entry
    text_splits("bpe:300", CORPUS_TEXT + "x", 0.1)  # another text: another entry
    assert len(list((cache / "tokens").iterdir())) == 3 and fits["n"] == 4


def test_char_skips_the_cache_and_off_disables_it(cache, monkeypatch, fits):
    text_splits("char", CORPUS_TEXT, 0.1)
    assert not cache.exists()
    monkeypatch.setenv("LAMINA_CACHE", "off")
    assert cache_root() is None
    text_splits("bpe:300", CORPUS_TEXT, 0.1)
    text_splits("bpe:300", CORPUS_TEXT, 0.1)
    assert fits["n"] == 2 and not cache.exists()


def test_a_second_bpe_run_on_the_same_file_neither_refits_nor_reencodes(
    corpus, tmp_path, cache, fits
):
    cfg = TrainConfig(data=corpus, tokenizer="bpe:300", preset="tiny", batch_size=2,
                      max_steps=2, eval_batches=1, model_overrides={"block_size": 16})  # fmt: skip
    s = new_session(cfg, out=tmp_path / "r")
    run_training(s, quiet=True)
    s.run.release()
    s2 = new_session(cfg, out=tmp_path / "r2")
    s2.run.release()
    assert fits["n"] == 1
    assert np.array_equal(np.asarray(s.objective.train), np.asarray(s2.objective.train))


def test_bpe_larger_than_the_text_supports_is_refused_in_one_line(corpus, tmp_path, capsys):
    with pytest.raises(LaminaError, match=r"bpe:2000: the training text .* supports only \d+"):
        text_splits("bpe:2000", CORPUS_TEXT, 0.1)
    code = main(["train", "--data", corpus, "--tokenizer", "bpe:2000", "--out",
                 str(tmp_path / "r")])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "bpe:2000" in err and "only" in err
    assert not (tmp_path / "r").exists()


def test_an_unwritable_cache_warns_and_the_run_goes_on(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("not a folder")
    monkeypatch.setenv("LAMINA_CACHE", str(tmp_path / "file"))
    with pytest.warns(LaminaWarning, match="cannot write the token cache"):
        s = text_splits("bpe:300", CORPUS_TEXT, 0.1)
    assert s.tokenizer.decode(s.val.tolist()) == split_text(CORPUS_TEXT, 0.1)[1]


def test_a_run_folder_as_tokenizer_spec_trains_a_language_model_on_its_vocabulary(
    corpus, tmp_path, cache, fits
):
    """--tokenizer RUN: the one resolver (data.spec) serves LM training as it serves prepare."""
    saved = build_tokenizer("bpe:300", CORPUS_TEXT)
    (tmp_path / "run").mkdir()
    save_tokenizer(saved, tmp_path / "run" / "tokenizer.json")
    fits["n"] = 0
    for spec in (tmp_path / "run", tmp_path / "run" / "tokenizer.json"):
        cfg = TrainConfig(data=corpus, tokenizer=str(spec), preset="tiny", batch_size=2,
                          max_steps=1, eval_batches=1, model_overrides={"block_size": 16})  # fmt: skip
        s = new_session(cfg, out=None)
        assert s.tokenizer.to_dict() == saved.to_dict() and fits["n"] == 0
        assert s.model.config.vocab_size == saved.vocab_size
    (tmp_path / "empty").mkdir()
    with pytest.raises(LaminaError, match="holds no tokenizer.json"):
        build_tokenizer(str(tmp_path / "empty"))
    with pytest.raises(LaminaError, match="unknown tokenizer 'nonesuch'"):
        build_tokenizer("nonesuch")
