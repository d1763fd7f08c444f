"""`lamina train --task classify`, `lamina predict` and `lamina eval` on a classifier, end to end,
and their bad input: one line on stderr, exit 2, nothing half-written."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from lamina.cli import main

SMALL = ["--d-model", "16", "--n-heads", "2", "--d-ff", "32", "--n-layers", "1"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("cls")
    rows = [{"text": f"{w} {i % 7}", "label": lab}
            for i in range(45) for w, lab in [("good", "pos"), ("bad", "neg"), ("meh", "mid")][i % 3 : i % 3 + 1]]  # fmt: skip
    (d / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = d / "run"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(["train", "--task", "classify", "--data", str(d / "d.jsonl"), "--out", str(out),
                 "--max-steps", "4", "--batch-size", "8", "--max-len", "12", "--quiet",
                     "--pooling", "first", "--class-weights", "balanced", *SMALL])  # fmt: skip
    assert code == 0
    (d / "printed.txt").write_text(printed.getvalue())
    return out


def test_train_reports_accuracy_against_the_majority_baseline(run):
    printed = (run.parent / "printed.txt").read_text()
    assert "classify: 39 training / 6 validation texts, 3 labels (mid, neg, pos)" in printed
    assert "(majority baseline 33.3%), macro-F1" in printed
    assert (run / "confusion.png").is_file() and (run / "labels.json").is_file()
    saved = json.loads((run / "train_config.json").read_text())["train"]
    assert saved["options"] == {**saved["options"], "pooling": "first", "class_weights": "balanced"}


def test_predict_texts_and_files(run, tmp_path, capsys):
    assert main(["predict", str(run), "good 3", "bad 1"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [x["text"] for x in lines] == ["good 3", "bad 1"]
    for x in lines:
        assert set(x["probs"]) == {"mid", "neg", "pos"} and x["label"] in x["probs"]
        assert x["label"] == max(x["probs"], key=x["probs"].get)
        assert sum(x["probs"].values()) == pytest.approx(1.0, abs=1e-4)
    (tmp_path / "in.txt").write_text("good 1\n\n" + "bad " * 40 + "\n")
    out = tmp_path / "out.jsonl"
    assert (
        main(["predict", str(run), "--input", str(tmp_path / "in.txt"), "--output", str(out)]) == 0
    )
    err = capsys.readouterr().err
    assert "warning: 1 of 2 texts are longer than the model's max_len (12 tokens)" in err
    assert [json.loads(x)["text"] for x in out.read_text().splitlines()][0] == "good 1"


def test_eval_prints_classifier_metrics(run, tmp_path, capsys):
    (tmp_path / "e.csv").write_text("text,label\ngood 1,pos\nbad 2,neg\nmeh 3,mid\n")
    assert main(["eval", str(run), "--data", str(tmp_path / "e.csv"), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["texts"] == 3 and 0.0 <= result["accuracy"] <= 1.0
    assert {"macro_f1", "precision/pos", "recall/neg"} <= set(result)
    assert main(["eval", str(run)]) == 0  # the run's own validation split
    assert "macro-F1" in capsys.readouterr().out


@pytest.mark.parametrize(
    "args, content, needle",
    [
        (["--text-column", "body"], "text,label\nx,a\ny,b\n", "its columns: 'text', 'label'"),
        ([], "text,label\nx,a\ny,a\n", "single label ('a')"),
        ([], '{"text": "x", "label": "a"}\nnot json\n', "line 2: not valid JSON"),
        ([], "text,label\nx,a\ny,\n", "line 3: empty label"),
        (["--max-len", "1"], "text,label\nx,a\ny,b\n", "max_len must be an integer >= 2"),
    ],
)
def test_train_bad_input_is_one_line_and_exit_2(tmp_path, capsys, args, content, needle):
    name = "d.jsonl" if content.startswith("{") else "d.csv"
    (tmp_path / name).write_text(content)
    out = tmp_path / "r"
    code = main(["train", "--task", "classify", "--data", str(tmp_path / name), "--out", str(out),
                 "--max-steps", "1", *SMALL, *args])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1
    assert not out.exists()  # a failed fresh run leaves no folder


def test_predict_bad_input(run, tmp_path, capsys):
    assert main(["predict", str(run)]) == 2
    assert "one of them" in capsys.readouterr().err
    (tmp_path / "in.jsonl").write_text('{"text": "x"}\n{bad\n')
    out = tmp_path / "o.jsonl"
    assert (
        main(["predict", str(run), "--input", str(tmp_path / "in.jsonl"), "--output", str(out)])
        == 2
    )
    assert "line 2: not valid JSON" in capsys.readouterr().err and not out.exists()
    (tmp_path / "bad.txt").write_bytes(b"ok\n\xfe\n")
    assert main(["predict", str(run), "--input", str(tmp_path / "bad.txt")]) == 2
    assert "bad.txt line 2: not valid UTF-8" in capsys.readouterr().err
