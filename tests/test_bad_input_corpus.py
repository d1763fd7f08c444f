"""Issue 17, class 9: a corpus folder is read by one documented rule, and what it leaves out is
said in one line (hidden files and editor locks are not text; B.TXT is)."""

from __future__ import annotations

import os
import warnings

import pytest
import torch

import lamina
from lamina import GPT, GPTConfig, LaminaError, LaminaWarning
from lamina.cli import main
from lamina.data import CharTokenizer
from lamina.data.corpus import corpus_files, load_corpus


def make_folder(d):
    d.mkdir()
    (d / "a.txt").write_text("alpha")
    (d / "B.TXT").write_text("bravo")
    (d / ".hidden.txt").write_text("secret")
    (d / "notes.md").write_text("not text for training")
    (d / "sub").mkdir()
    (d / "sub" / "deep.txt").write_text("in a subfolder")
    (d / "dir.txt").mkdir()
    os.symlink("nowhere", d / ".#lock.txt")  # how emacs marks a file being edited
    os.symlink("gone.txt", d / "broken.txt")
    (d / "c.txt").symlink_to(d / "a.txt")  # a symlink counts as what it points to
    return d


def test_folder_rule_reads_txt_in_any_case_and_skips_hidden_and_lock_files(tmp_path):
    d = make_folder(tmp_path / "corpus")
    with pytest.warns(LaminaWarning) as caught:
        text = load_corpus(d)
    assert text == "bravo\nalpha\nalpha\nin a subfolder"  # B.TXT, a.txt, c.txt, sub/deep.txt
    assert len(caught) == 1
    line = str(caught[0].message)
    assert "\n" not in line
    for entry, why in [
        (".hidden.txt", "hidden file"),
        (".#lock.txt", "editor lock file"),
        ("broken.txt", "broken symlink"),
        ("dir.txt", "a folder"),
    ]:
        assert f"{entry} ({why})" in line, line
    assert "1 other file (notes.md)" in line
    files, skipped = corpus_files(d)
    assert [f.name for f in files] == ["B.TXT", "a.txt", "c.txt", "deep.txt"]
    assert dict((e.name, why) for e, why in skipped)["notes.md"] == "not a corpus file"


def test_clean_folder_warns_nothing_and_empty_of_text_says_what_it_saw(tmp_path):
    d = tmp_path / "clean"
    d.mkdir()
    (d / "one.txt").write_text("x")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_corpus(d) == "x"
    only_hidden = tmp_path / "hidden"
    only_hidden.mkdir()
    (only_hidden / ".a.txt").write_text("x")
    with pytest.raises(LaminaError, match=r"no \.txt.*\.a\.txt \(hidden file\)"):
        load_corpus(only_hidden)


def test_cli_prints_the_skipped_entries_as_one_warning_line(tmp_path, capsys):
    """Through a verb (eval), the warning is one line `lamina eval: warning: ...`."""
    d = make_folder(tmp_path / "corpus")
    (d / "a.txt").write_text("alpha bravo " * 30)
    tok = CharTokenizer.from_text(load_corpus_quietly(d))
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=tok.vocab_size, block_size=8, d_model=8, n_layers=1, n_heads=2)
    model_dir = lamina.save(tmp_path / "m", GPT(cfg), tok)
    assert main(["eval", str(model_dir), "--data", str(d)]) == 0
    err = capsys.readouterr().err.strip()
    assert err.startswith("lamina eval: warning: corpus folder") and "\n" not in err, err
    assert ".hidden.txt (hidden file)" in err


def load_corpus_quietly(d):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LaminaWarning)
        return load_corpus(d)
