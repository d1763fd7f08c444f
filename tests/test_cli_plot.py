"""`lamina plot`: curves of several runs from their metrics.jsonl; clear errors."""

import json

import pytest

from lamina.cli import main


def _run(folder, slope, timed=True):
    folder.mkdir(parents=True)
    lines = []
    for s in range(1, 21):
        rec = {"step": s, "loss": 4 - slope * s}
        if timed:
            rec["elapsed"] = s * 0.1
        lines.append(json.dumps(rec))
    lines.append(json.dumps({"step": 20, "val_loss": 4 - slope * 20.5, "elapsed": 2.0}))
    lines.append('{"step": 21, "loss"')  # a line being written: skipped
    (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def test_two_runs_in_one_picture(tmp_path, capsys):
    a, b = _run(tmp_path / "a", 0.1), _run(tmp_path / "b", 0.05, timed=False)
    out = tmp_path / "curves.png"
    assert main(["plot", str(a), str(b), "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert out.read_bytes().startswith(b"\x89PNG")
    assert lines[0] == "a: 20 steps, last train 2.0000 val 1.9500"
    assert lines[1].startswith("b: 20 steps, last train 3.0000")


def test_svg_by_suffix(tmp_path):
    a = _run(tmp_path / "a", 0.1)
    assert main(["plot", str(a), "--out", str(tmp_path / "c.svg")]) == 0
    assert b"<svg" in (tmp_path / "c.svg").read_bytes()


@pytest.mark.parametrize(
    "which, message",
    [
        ("missing", "no such run directory"),
        ("empty", "no metrics.jsonl"),
        ("out", "does not exist"),
    ],
)
def test_bad_input_is_exit_2(tmp_path, capsys, which, message):
    run = _run(tmp_path / "a", 0.1)
    argv = ["plot", str(run), "--out", str(tmp_path / "c.png")]
    if which == "missing":
        argv[1] = str(tmp_path / "nope")
    elif which == "empty":
        (tmp_path / "e").mkdir()
        argv[1] = str(tmp_path / "e")
    else:
        argv[-1] = str(tmp_path / "no" / "c.png")
    assert main(argv) == 2
    assert message in capsys.readouterr().err
