"""The one output rule (lamina.files), held for every verb that writes: inputs validated first,
no output over an input, devices/FIFOs/symlinks kept, --force only on lamina's own folders and
only once the new folder is complete."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest
from tiny_run import TINY, tiny_run

from lamina.cli import main
from lamina.errors import LaminaError
from lamina.files import MARKER, atomic_write, build_folder


def listing(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def run() -> Path:
    return tiny_run()


def test_atomic_write_keeps_a_fifo_and_a_symlink(tmp_path):
    """A FIFO is written directly (not replaced by a file); a symlink is written through."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    atomic_write(fifo, lambda f: f.write(b"hello"))
    reader.join(5)
    assert got == [b"hello"] and stat.S_ISFIFO(fifo.lstat().st_mode)
    target = tmp_path / "real.txt"
    target.write_text("old")
    link = tmp_path / "link.txt"
    link.symlink_to(target)
    atomic_write(link, lambda f: f.write(b"new"))
    assert link.is_symlink() and target.read_text() == "new"


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")
def test_predict_output_to_a_char_device_keeps_the_device(tmp_path, capsys):
    """An output that is a character device (here a copy of /dev/null, as `predict --output`
    would write it) is written into, and stays a device."""
    dev = tmp_path / "mynull"
    os.mknod(dev, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    atomic_write(dev, lambda f: f.write(b"{}\n"))
    assert stat.S_ISCHR(dev.lstat().st_mode)


def test_train_force_validates_before_it_replaces(run, tmp_path, capsys):
    """`train --data nosuch.txt --out RUN --force` fails and leaves RUN as it was."""
    before = listing(run)
    code = main(["train", "--data", str(tmp_path / "nosuch.txt"), *TINY, "--max-steps", "2",
                 "--out", str(run), "--force", "--quiet"])  # fmt: skip
    assert code == 2 and "nosuch.txt" in capsys.readouterr().err
    after = listing(run)
    assert {k: v for k, v in after.items() if k != ".lock"} == {
        k: v for k, v in before.items() if k != ".lock"
    }


def test_outputs_over_their_inputs_are_refused(run, tmp_path, capsys):
    """--init-from X --out X, prepare into a folder holding its corpus, quantize into a folder
    holding its source, convert into its own source: one line, exit 2, nothing touched."""
    before = listing(run)
    cases = [
        ["train", "--init-from", str(run), "--out", str(run), "--force", "--max-steps", "1"],
        ["quantize", str(run), "--to", "int8", "--out", str(run.parent), "--force"],
        ["quantize", str(run), "--to", "int8", "--out", str(run)],
        ["convert", "--to", "hf", str(run), "--out", str(run), "--force"],
        ["prepare", str(run.parent / "c.txt"), "--tokenizer", "char", "--out", str(run.parent)],
    ]
    for argv in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and ("destroy the input" in err or "sits inside" in err), err
    assert listing(run) == before


def test_prepare_into_a_folder_holding_the_corpus_is_refused(tmp_path, capsys):
    corpus = tmp_path / "data"
    corpus.mkdir()
    (corpus / "a.txt").write_text("some text to prepare\n" * 20)
    assert main(["prepare", str(corpus), "--tokenizer", "char", "--out", str(corpus)]) == 2
    assert main(["prepare", str(corpus), "--out", str(corpus / "prep"), "--force"]) == 2
    assert "sits inside" in capsys.readouterr().err
    assert sorted(p.name for p in corpus.iterdir()) == ["a.txt"]


def test_force_replaces_only_lamina_folders_and_only_when_complete(tmp_path, capsys):
    """A folder lamina did not write is never replaced; a failed build leaves the old one."""
    corpus = tmp_path / "c.txt"
    corpus.write_text("some text to prepare\n" * 20)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.md").write_text("mine")
    assert main(["prepare", str(corpus), "--out", str(mine), "--force"]) == 2
    assert "did not write" in capsys.readouterr().err
    assert listing(mine) == {"notes.md": b"mine"}
    out = tmp_path / "prep"
    assert main(["prepare", str(corpus), "--out", str(out)]) == 0
    assert (out / MARKER).is_file()
    before = listing(out)

    def fail(d: Path) -> None:
        (d / "half").write_text("x")
        raise LaminaError("disk full")

    with pytest.raises(LaminaError):
        build_folder(out, fail, kind="prepared", force=True)
    assert listing(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.txt", "mine", "prep"]
    assert main(["prepare", str(corpus), "--out", str(out), "--force"]) == 0


def test_a_failed_fresh_run_can_be_rerun(tmp_path, capsys):
    """A run that stopped before its first checkpoint (train_config.json and .lock left) is
    replaced by the same command, not sent to --resume."""
    out = tmp_path / "run"
    out.mkdir()
    (out / ".lock").write_text("")
    (out / "train_config.json").write_text("{}")
    corpus = tmp_path / "c.txt"
    corpus.write_text("to be or not to be\n" * 40)
    assert main(["train", "--data", str(corpus), *TINY, "--max-steps", "1", "--quiet",
                 "--out", str(out)]) == 0  # fmt: skip
    assert "before its first checkpoint" in capsys.readouterr().err
    assert (out / "trainer_state.json").is_file() and not (out / ".previous-run").exists()
