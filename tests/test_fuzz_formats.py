"""Property-based fuzz of every on-disk JSON format lamina reads (issue 22, class 4).

Each format starts from a file lamina wrote; hypothesis deletes a field, replaces a value with
one of another type or range, or shortens/lengthens an array, and the reader must either work
or raise `LaminaError` (one line, exit 2 at the command line): never KeyError, TypeError,
IndexError or an mmap error. Bounded (max_examples per format, deadline=None): ~10-20 s.
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiny_run import tiny_run

import lamina
from lamina.cli import main
from lamina.data.shards import open_prepared
from lamina.errors import LaminaError
from lamina.models.config import EncoderConfig
from lamina.models.encoder import SequenceClassifier
from lamina.tokenizers.kinds import load_tokenizer

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-3, 70)
    | st.sampled_from([0, -1, 2**31, 2**40, 10**30, 0.5, -0.0, 1e308])
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=4)
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=2)
    ),
    max_leaves=4,
)


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node[:8]):  # the first items stand for the rest
            out += _paths(v, (*prefix, i))
        if len(node) > 8:
            out.append((*prefix, len(node) - 1))
    return out


@st.composite
def mutated(draw: Any, original: Any) -> Any:
    doc = json.loads(json.dumps(original))
    path = draw(st.sampled_from(_paths(doc)))
    how = draw(st.sampled_from(["replace", "delete", "shorten", "extend"]))
    if not path:
        return draw(VALUES) if how == "replace" else doc
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    key, node = path[-1], parent[path[-1]]
    if how == "delete":
        del parent[key]
    elif how == "shorten" and isinstance(node, (list, str)) and node:
        parent[key] = node[: draw(st.integers(0, len(node) - 1))]
    elif how == "extend" and isinstance(node, list):
        parent[key] = node + [draw(VALUES) if not node or draw(st.booleans()) else node[-1]]
    else:
        parent[key] = draw(VALUES)
    return doc


def fuzz(path: Path, use: Callable[[], Any], examples: int, lines: bool = False) -> None:
    """Mutate the JSON at `path` `examples` times; `use()` must succeed or raise LaminaError."""
    raw = path.read_text(encoding="utf-8")
    original = [json.loads(x) for x in raw.splitlines()] if lines else json.loads(raw)

    @settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    @given(mutated(original))
    def prop(doc: Any) -> None:
        if lines:
            text = "".join(json.dumps(r) + "\n" for r in doc) if isinstance(doc, list) else "[]\n"
        else:
            text = json.dumps(doc)
        path.write_text(text, encoding="utf-8")
        try:
            with (
                contextlib.redirect_stdout(io.StringIO()),
                contextlib.redirect_stderr(io.StringIO()),
            ):
                use()
        except LaminaError as exc:
            assert "\n" not in str(exc).strip(), str(exc)
        finally:
            path.write_text(raw, encoding="utf-8")

    prop()


@pytest.fixture(scope="module")
def run() -> Path:
    return tiny_run()


def test_config_json(run):
    fuzz(run / "config.json", lambda: lamina.load(run), 60)


def test_tokenizer_json_of_every_kind(run, tmp_path):
    from lamina.data.spec import build_tokenizer
    from lamina.tokenizers.kinds import save_tokenizer

    text = "to be or not to be, that is the question\n" * 20
    for spec in ("char", "byte", "bpe:280"):
        p = tmp_path / f"{spec.replace(':', '')}.json"
        save_tokenizer(build_tokenizer(spec, text), p)

        def use(p: Path = p) -> None:
            tok = load_tokenizer(p)
            tok.decode(tok.encode("to be"))

        fuzz(p, use, 40)


def test_labels_and_classifier_config(tmp_path):
    from lamina.tokenizers.kinds import CharTokenizer

    torch.manual_seed(0)
    tok = CharTokenizer.from_text("abc ")
    cfg = EncoderConfig(
        vocab_size=tok.vocab_size, max_len=8, d_model=16, n_heads=2, n_layers=1, d_ff=32
    )
    model = SequenceClassifier(cfg, 3)
    model.labels = ["x", "y", "z"]
    lamina.save(tmp_path / "cls", model, tok)
    fuzz(tmp_path / "cls" / "labels.json", lambda: lamina.load(tmp_path / "cls"), 30)
    fuzz(tmp_path / "cls" / "config.json", lambda: lamina.load(tmp_path / "cls"), 40)


def test_index_json(tmp_path):
    (tmp_path / "c.txt").write_text("abcdefgh " * 300)
    out = tmp_path / "prep"
    assert main(["prepare", str(tmp_path / "c.txt"), "--out", str(out), "--quiet",
                 "--shard-tokens", "1000"]) == 0  # fmt: skip

    def use() -> None:
        prep = open_prepared(out)
        prep.train[:5], prep.val[:5]  # noqa: B018 - reading is the point

    fuzz(out / "index.json", use, 80)


def test_metrics_jsonl(run):
    """What `lamina plot` and a resume read of metrics.jsonl (the drawing itself is slow and
    sees only checked records; tests/test_hardening_verbs.py draws a bad line once)."""
    from lamina.cli.plot import read_metrics, summary_line
    from lamina.training.run_dir import RunDir

    def use() -> None:
        summary_line("run", read_metrics(str(run)))
        RunDir(run).read_metrics(up_to_step=1)

    fuzz(run / "metrics.jsonl", use, 60, lines=True)


def test_trainer_state_and_train_config(run):
    from lamina.training.session import resume_session

    def resume() -> None:
        session = resume_session(run, {})
        session.run.release()

    fuzz(run / "trainer_state.json", resume, 30)
    fuzz(run / "optimizer.json", resume, 20)
    fuzz(run / "train_config.json", resume, 25)
    fuzz(run / "train_config.json", lambda: main(["eval", str(run)]) in (0, 2) or 1 / 0, 20)


def test_schema_names_the_file_and_the_field():
    from lamina.schema import Arr, FileName, Int, Obj, check

    shape = Obj({"shards": Arr(Obj({"file": FileName(), "tokens": Int(0)}))})
    check(shape, {"shards": [{"file": "a.bin", "tokens": 3}]}, "x.json")
    for doc, said in (
        ({}, "x.json: has no 'shards' field"),
        (
            {"shards": [{"file": "a.bin", "tokens": -1}]},
            "x.json: shards[0].tokens: expected an integer >= 0, got int -1",
        ),
        ({"shards": [{"file": "../a", "tokens": 1}]}, "shards[0].file: expected a plain file name"),
        ({"shards": [{"file": "a", "tokens": True}]}, "got a boolean True"),
    ):
        with pytest.raises(LaminaError) as e:
            check(shape, doc, "x.json")
        assert said in str(e.value), str(e.value)
