"""`lamina eval MODEL --task ...`: --json, --output, --limit, perplexity, and bad task files as
one line on stderr with exit status 2 (the validation-split `lamina eval RUN` is covered by
test_cli_train.py and test_training_text_splits.py)."""

from __future__ import annotations

import json

import pytest
from conftest import CORPUS_TEXT
from test_evals_choice import tiny_llama

from lamina.checkpoint import save_model
from lamina.cli import main
from lamina.evals.choice import ChoiceItem, accuracy, score_items
from lamina.tokenizers.subword import BPETokenizer

ROWS = [
    {
        "context": "First Citizen:\nBefore we",
        "choices": ["proceed", "famish"],
        "gold": 0,
        "id": "a",
    },
    {"query": "All:\nSpeak,", "choices": ["speak.", "die", "resolved"], "gold": 0},
    {"context": "You are all resolved rather to", "choices": ["die", "speak"], "gold": 0},
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    tok = BPETokenizer.train(CORPUS_TEXT, 300)
    d = tmp_path_factory.mktemp("evals-cli")
    save_model(d / "model", tiny_llama(tok.vocab_size), tok)
    (d / "task.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return d


def test_json_and_output_per_item(model_dir, tmp_path, capsys):
    out = tmp_path / "pred.jsonl"
    args = ["eval", str(model_dir / "model"), "--task", str(model_dir / "task.jsonl")]
    assert main([*args, "--json", "--output", str(out)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["items"] == 3 and result["chance"] == pytest.approx((1 / 2 + 1 / 3 + 1 / 2) / 3)
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["index"] for r in rows] == [0, 1, 2] and rows[0]["id"] == "a"
    assert result["acc"] == pytest.approx(sum(r["acc"] for r in rows) / 3)
    assert result["acc_norm"] == pytest.approx(sum(r["acc_norm"] for r in rows) / 3)
    # the same numbers as the library on the same items
    from lamina.checkpoint import load_model

    model, tok = load_model(model_dir / "model")
    items = [
        ChoiceItem(r.get("context", r.get("query")), tuple(r["choices"]), r["gold"]) for r in ROWS
    ]
    lib = score_items(model, tok, items)
    for r, s in zip(rows, lib, strict=True):
        assert r["logliks"] == pytest.approx(list(s.logliks), abs=1e-5)
    assert {k: result[k] for k in ("acc", "acc_norm")} == {
        k: accuracy(lib)[k] for k in ("acc", "acc_norm")
    }
    assert main([*args, "--method", "batch", "--limit", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["items"] == 2


def test_text_report_and_builtin_limit(model_dir, capsys):
    assert main(["eval", str(model_dir / "model"), "--task", "which-play", "--limit", "3"]) == 0
    printed = capsys.readouterr().out
    assert "which-play" in printed and "3 items" in printed and "chance    0.2500" in printed
    assert "acc_norm" in printed and "±" in printed


def test_perplexity_of_a_text_file(model_dir, tmp_path, capsys):
    (tmp_path / "t.txt").write_text(CORPUS_TEXT[:500])
    model = str(model_dir / "model")
    assert main(["eval", model, "--task", "perplexity", "--data", str(tmp_path / "t.txt"),
                 "--stride", "16", "--json"]) == 0  # fmt: skip
    r = json.loads(capsys.readouterr().out)
    assert r["window"] == 64 and r["stride"] == 16 and r["texts"] == 1
    assert r["chars"] < 500 and r["bits_per_byte"] > 0 and r["perplexity"] > 1


@pytest.mark.parametrize(
    "content, extra, needle",
    [
        ('{"context": "a", "choices": ["b"], "gold": 0}\n', [], 'line 1: "choices" must be'),
        ("{}\n{oops\n", [], 'line 1: no "context"'),
        (None, [], "no such file (nor a built-in task name)"),
        ('{"text": "x"}\n', ["--limit", "0"], "--limit must be >= 1"),
        ('{"text": "x"}\n', ["--stride", "0"], "--stride must be >= 1"),
    ],
)
def test_bad_task_files_are_one_line_exit_2(model_dir, tmp_path, capsys, content, extra, needle):
    path = tmp_path / "bad.jsonl"
    if content is not None:
        path.write_text(content)
    assert main(["eval", str(model_dir / "model"), "--task", str(path), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1


def test_output_may_not_overwrite_the_task(model_dir, capsys):
    task = str(model_dir / "task.jsonl")
    assert main(["eval", str(model_dir / "model"), "--task", task, "--output", task]) == 2
    assert "writing it would destroy the input" in capsys.readouterr().err


def test_perplexity_needs_data(model_dir, capsys):
    assert main(["eval", str(model_dir / "model"), "--task", "perplexity"]) == 2
    assert "--task perplexity needs --data FILE" in capsys.readouterr().err
