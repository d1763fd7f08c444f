"""`lamina prepare`: the summary line, and bad input as one line, exit 2, nothing half-written."""

from __future__ import annotations

import errno
import gzip
import json

import pytest

from lamina.cli import main
from lamina.data.shards import ShardWriter, open_prepared


def leftovers(tmp_path):
    return sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("."))


def test_summary_line(tmp_path, capsys):
    (tmp_path / "a.txt").write_text("to be or not to be\n" * 50)
    assert main(["prepare", str(tmp_path / "a.txt"), "--out", str(tmp_path / "p"), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "1 documents, 950 characters, 950 tokens in 1 shards" in out and "MB/s" in out
    assert len(open_prepared(tmp_path / "p").train) == 855


@pytest.mark.parametrize(
    "lines, message",
    [
        (['{"text": "ok"}', "{not json"], "b.jsonl line 2 is not JSON"),
        (['{"text": "ok"}', '{"body": "x"}', "[1]"], 'b.jsonl line 2 has no "text" string'),
    ],
)
def test_bad_jsonl_lines(tmp_path, capsys, lines, message):
    (tmp_path / "b.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "p"
    assert main(["prepare", str(tmp_path / "b.jsonl"), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not out.exists() and leftovers(tmp_path) == []
    args = ["prepare", str(tmp_path / "b.jsonl"), "--out", str(out), "--quiet", "--skip-bad-lines"]
    assert main(args) == 0
    assert f"{len(lines) - 1:,} bad lines skipped" in capsys.readouterr().out
    assert json.loads((out / "index.json").read_text())["bad_lines_skipped"] == len(lines) - 1


def test_gzip_cut_short(tmp_path, capsys):
    blob = gzip.compress(b"some text that goes on\n" * 2000)
    (tmp_path / "c.txt.gz").write_bytes(blob[: len(blob) // 2])
    assert main(["prepare", str(tmp_path / "c.txt.gz"), "--out", str(tmp_path / "p")]) == 2
    assert "c.txt.gz is cut short" in capsys.readouterr().err
    assert not (tmp_path / "p").exists() and leftovers(tmp_path) == []


def test_full_disk_leaves_nothing(tmp_path, capsys, monkeypatch):
    (tmp_path / "a.txt").write_text("words and more words\n" * 500)
    real = ShardWriter._open

    def opener(self):  # the third shard file finds the disk full
        if len(self.shards) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(self)

    monkeypatch.setattr(ShardWriter, "_open", opener)
    args = ["prepare", str(tmp_path / "a.txt"), "--out", str(tmp_path / "p"), "--quiet"]
    assert main([*args, "--shard-tokens", "100"]) == 2
    err = capsys.readouterr().err
    assert "the disk is full; no index written, partial shards removed" in err
    assert not (tmp_path / "p").exists() and leftovers(tmp_path) == []


def test_out_with_files_is_refused(tmp_path, capsys):
    (tmp_path / "a.txt").write_text("abc\n")
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "keep").write_text("x")
    assert main(["prepare", str(tmp_path / "a.txt"), "--out", str(tmp_path / "p")]) == 2
    assert "holds files lamina did not write" in capsys.readouterr().err
    assert main(["prepare", str(tmp_path / "a.txt"), "--out", str(tmp_path / "p"), "--force"]) == 2
    assert (tmp_path / "p" / "keep").exists()


def test_a_character_the_given_tokenizer_lacks_is_named(tmp_path, capsys):
    (tmp_path / "tok.txt").write_text("abc \n")
    assert (
        main(["prepare", str(tmp_path / "tok.txt"), "--out", str(tmp_path / "t"), "--quiet"]) == 0
    )
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "1.txt").write_text("abc cab\n")
    (tmp_path / "d" / "2.txt").write_text("ba cZb\n")
    args = ["prepare", str(tmp_path / "d"), "--tokenizer", str(tmp_path / "t"), "--quiet"]
    assert main([*args, "--out", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err
    assert "character 'Z' at position 12 of the corpus (document 2)" in err
    assert not (tmp_path / "p").exists()
