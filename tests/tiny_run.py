"""One tiny trained run (2 steps of the tiny preset on a small corpus), made once per test
process and shared by the hardening tests; each test that changes a file of it puts it back."""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

TINY = ["--preset", "tiny", "--block-size", "16", "--batch-size", "4", "--eval-batches", "2"]


@functools.lru_cache(maxsize=1)
def tiny_run() -> Path:
    """RUN (a folder) beside RUN/../c.txt, its corpus."""
    from lamina.cli import main

    d = Path(tempfile.mkdtemp(prefix="lamina-tiny-run-"))
    atexit.register(shutil.rmtree, d, True)
    (d / "c.txt").write_text("to be or not to be, that is the question\n" * 40)
    argv = ["train", "--data", str(d / "c.txt"), *TINY, "--max-steps", "2", "--quiet"]
    assert main([*argv, "--out", str(d / "run")]) == 0
    return d / "run"
