"""One folder rule, every skip named (issue 20 item 4, issue 22 class 5): `train --data DIR` and
`prepare DIR` read the same files; classify's folder-per-label names what it leaves out."""

from __future__ import annotations

import gzip
import json
import warnings
from pathlib import Path

import numpy as np
import pytest

from lamina.cli import main
from lamina.data.corpus import load_corpus
from lamina.data.labelled import read_labelled
from lamina.data.shards import open_prepared
from lamina.data.sources import corpus_files
from lamina.errors import LaminaWarning
from lamina.tokenizers.kinds import load_tokenizer


def corpus_folder(d: Path) -> Path:
    d.mkdir()
    (d / "a.txt").write_text("alpha\n")
    (d / "B.TXT").write_text("bravo\n")
    (d / "sub").mkdir()
    (d / "sub" / "c.jsonl").write_text(json.dumps({"text": "charlie"}) + "\n")
    (d / "sub" / "d.txt.gz").write_bytes(gzip.compress(b"delta\n"))
    (d / "notes.md").write_text("not text")
    (d / ".hidden.txt").write_text("secret")
    (d / ".git").mkdir()
    (d / ".git" / "x.txt").write_text("not a corpus file")
    return d


def test_train_and_prepare_read_the_same_files(tmp_path):
    d = corpus_folder(tmp_path / "c")
    with pytest.warns(LaminaWarning) as caught:
        text = load_corpus(d)  # what `lamina train --data DIR` and `eval --data DIR` read
        files = corpus_files(d)  # what `lamina prepare DIR` reads
    assert [f.relative_to(d).as_posix() for f in files] == [
        "B.TXT",
        "a.txt",
        "sub/c.jsonl",
        "sub/d.txt.gz",
    ]
    assert text == "bravo\n\nalpha\n\ncharlie\ndelta\n"
    line = str(caught[0].message)
    for name in (".hidden.txt (hidden file)", ".git (hidden folder)", "1 other file (notes.md)"):
        assert name in line, line
    out = tmp_path / "prep"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["prepare", str(d), "--out", str(out), "--quiet", "--val-fraction", "0"]) == 0
    prep, tok = open_prepared(out), load_tokenizer(out / "tokenizer.json")
    assert prep.index["files"] == 4
    ids = np.asarray(prep.train[:]).tolist()
    decoded = tok.decode(ids)
    for word in ("alpha", "bravo", "charlie", "delta"):  # prepare joins documents its own way
        assert word in decoded and word in text
    assert "secret" not in decoded and "not text" not in decoded


def test_prepare_names_what_it_skips(tmp_path, capsys):
    d = corpus_folder(tmp_path / "c")
    assert main(["prepare", str(d), "--out", str(tmp_path / "p"), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "lamina prepare: warning: corpus folder" in err and "notes.md" in err


def test_folder_per_label_names_stray_files_nested_folders_and_empty_labels(tmp_path):
    d = tmp_path / "labels"
    for label, texts in (("pos", ["good", "great"]), ("neg", ["bad", "awful"])):
        (d / label).mkdir(parents=True)
        for i, t in enumerate(texts):
            (d / label / f"{i}.txt").write_text(t)
    (d / "pos" / "more").mkdir()
    (d / "pos" / "more" / "x.txt").write_text("nested")
    (d / "neg" / "notes.md").write_text("stray")
    (d / "README.txt").write_text("beside the labels")
    (d / "mid").mkdir()
    with pytest.warns(LaminaWarning) as caught:
        data = read_labelled(d)
    assert sorted(set(data.labels)) == ["neg", "pos"] and len(data.texts) == 4
    line = str(caught[0].message)
    for name in ("pos/more (a folder inside a label folder)", "neg/notes.md (not a .txt file)",
                 "README.txt (a file outside the label folders)", "mid/ (no .txt texts"):  # fmt: skip
        assert name in line, line
