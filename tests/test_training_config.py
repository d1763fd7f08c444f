"""TrainConfig is frozen and validated; DEFAULTS is the one table of what None means, read both
by registry.resolve and by `lamina train --help`; each field's help is written once, and the
README's list of training flags is generated from it; tasks live in one registry."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from lamina.cli import main
from lamina.cli.train import flags_markdown, train_flags
from lamina.errors import LaminaError
from lamina.training.classify import ClassifyOptions
from lamina.training.config import DEFAULTS, TrainConfig, default_text
from lamina.training.defaults import CPU_SHAPE, Default
from lamina.training.registry import TASKS, load_config, make_config, resolve


def resolve_defaults(cfg: TrainConfig, device: str) -> TrainConfig:
    return resolve(cfg, device)


def test_train_config_is_frozen_and_validated_when_built():
    cfg = TrainConfig(lr=1e-3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.lr = 2e-3  # type: ignore[misc]
    assert cfg.replace(lr=2e-3).lr == 2e-3 and cfg.lr == 1e-3
    for bad, field in [({"lr": 0.0}, "lr"), ({"decay": "step"}, "decay"),
                       ({"warmup": -1}, "warmup"), ({"beta2": 1.0}, "beta2"),
                       ({"grad_clip": float("nan")}, "grad_clip"), ({"compile": 1}, "compile"),
                       ({"eval_batches": True}, "eval_batches")]:  # fmt: skip
        with pytest.raises(LaminaError, match=field):
            TrainConfig(**bad)
    with pytest.raises(LaminaError, match="parse_duration"):
        TrainConfig(max_time="5m")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("task", "device", "column"),
    [("lm", "cpu", "cpu"), ("lm", "mps", "cpu"), ("lm", "cuda", "gpu"),
     ("first-last", "cpu", "first_last"), ("first-last", "cuda", "first_last")],
)  # fmt: skip
def test_resolve_defaults_fills_every_none_from_the_table(task, device, column):
    got = resolve_defaults(TrainConfig(task=task), device)
    for name, default in DEFAULTS.items():
        if default.rule is None and not default.text:
            assert getattr(got, name) == getattr(default, column), name
    steps = got.max_steps
    assert got.micro_batch_size == got.batch_size
    assert got.warmup == min(100, steps // 10) and got.eval_every == steps // 10
    assert got.data is None and got.checkpoint_every is None  # None keeps its meaning
    shaped = column == "cpu"
    assert (got.model_overrides == CPU_SHAPE) is shaped


def test_given_values_win_and_a_time_budget_leaves_the_steps_open():
    got = resolve_defaults(TrainConfig(lr=0.5, model_overrides={"n_layers": 5}), "cpu")
    assert got.lr == 0.5 and got.model_overrides == {**CPU_SHAPE, "n_layers": 5}
    timed = resolve_defaults(TrainConfig(max_time=60.0), "cpu")
    assert timed.max_steps is None and timed.warmup == 20 and timed.eval_every is None
    assert resolve_defaults(TrainConfig(preset="tiny"), "cpu").model_overrides == {}
    with pytest.raises(LaminaError, match="divisible"):
        resolve_defaults(TrainConfig(micro_batch_size=5), "cpu")  # batch 48


def test_default_text_reads_the_table_or_the_field():
    assert default_text("lr") == (
        "0.01 on a CPU, 0.001 on a GPU; 0.002 for first-last; 0.001 with --init-from"
    )
    assert default_text("batch_size") == (
        "48 on a CPU, 64 on a GPU and for first-last; 16 with --init-from"
    )
    assert default_text("max_steps") == "2000; 300 for first-last; none with --max-time"
    assert (
        default_text("eval_batches") == "20; 4 with --init-from"
        and default_text("compile") == "off"
    )
    assert default_text("max_time") == "none"
    with pytest.raises(LaminaError, match="no field"):
        default_text("no_such_field")


def _help(capsys) -> str:
    """`lamina train --help` on one line (COLUMNS is set wide so no word is broken)."""
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    return " ".join(capsys.readouterr().out.split())


def test_help_and_the_run_read_the_same_table(capsys, monkeypatch):
    """Every option's help ends with the table's default; change the table, both follow."""
    monkeypatch.setenv("COLUMNS", "1000")
    text = _help(capsys)
    for name, _, _, default in train_flags():
        assert f"(default: {default})" in text, name
    monkeypatch.setitem(DEFAULTS, "lr", Default(0.25, 0.5, 0.75))
    assert "(default: 0.25 on a CPU, 0.5 on a GPU; 0.75 for first-last)" in _help(capsys)
    assert resolve_defaults(TrainConfig(), "cpu").lr == 0.25
    assert resolve_defaults(TrainConfig(task="first-last"), "cuda").lr == 0.75
    assert not re.search(r"--lr LR .*\(default: 0\.005", _help(capsys))


def test_the_readmes_list_of_training_flags_is_generated_from_the_fields():
    """README.md's table between the train-flags markers equals flags_markdown(), which reads
    the same fields as --help (regenerate it with `python -c "from lamina.cli.train import
    flags_markdown; print(flags_markdown())"`)."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    start = readme.index("<!-- train-flags")
    body = readme[readme.index("\n", start) + 1 : readme.index("<!-- /train-flags -->")]
    assert body == flags_markdown()
    names = {name for name, *_ in train_flags()}
    assert {"lr", "pooling", "max_len", "task"} <= names and "options" not in names


def test_each_task_option_belongs_to_its_task_and_old_flat_configs_still_load():
    cfg = make_config({"task": "classify", "max_len": 48, "pooling": "last", "lr": 0.01})
    assert isinstance(cfg.options, ClassifyOptions) and cfg.options.max_len == 48
    assert cfg.get("pooling") == "last" and cfg.get("lr") == 0.01
    with pytest.raises(LaminaError, match="--pooling applies to --task classify, not lm"):
        make_config({"pooling": "last"})
    with pytest.raises(LaminaError, match="--data does not apply to --task first-last"):
        make_config({"task": "first-last", "data": "x.txt"})
    with pytest.raises(LaminaError, match="task must be one of lm, first-last, classify"):
        resolve(TrainConfig(task="nope"), "cpu")
    with pytest.raises(LaminaError, match="--init-from .* --task classify starts fresh"):
        resolve(TrainConfig(task="classify", init_from="x"), "cpu")
    # a train_config.json from before the registry: every task's fields side by side
    flat = {**resolve(TrainConfig(), "cpu").to_dict(), "val_data": None, "text_column": "text",
            "label_column": "label", "max_len": 256, "pooling": "mean",
            "class_weights": "none", "bucket": False}  # fmt: skip
    del flat["options"]
    old = load_config(flat)
    assert old.task == "lm" and old == resolve(TrainConfig(), "cpu")
    flat_classify = {**flat, "task": "classify", "max_len": 64}
    assert load_config(flat_classify).options == ClassifyOptions(max_len=64)
    with pytest.raises(LaminaError, match="--pooling applies to --task classify, not lm"):
        load_config({**flat, "pooling": "last"})  # a classifier's field, set, on an lm run
    again = load_config(resolve(make_config({"task": "classify", "bucket": True}), "cpu").to_dict())
    assert again.options == ClassifyOptions(bucket=True)
    for bad in ([], {}, 3):  # a hand-edited task that is no name: a clear error, not a TypeError
        with pytest.raises(LaminaError, match="task must be one of"):
            load_config({**flat, "task": bad})


def test_no_task_name_is_compared_outside_the_registry():
    """Which task a run is decides only through registry.TASKS: no `== "classify"` elsewhere."""
    src = Path(__file__).resolve().parent.parent / "src" / "lamina"
    names = "|".join(re.escape(t) for t in TASKS)
    pattern = re.compile(
        rf"""(==|!=|\bin\b)\s*\(?["'](?:{names})["']|["'](?:{names})["']\s*(==|!=)"""
    )
    found = []
    for path in sorted(src.rglob("*.py")):
        if path.name == "registry.py":
            continue
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if pattern.search(line):
                found.append(f"{path.relative_to(src)}:{i}: {line.strip()}")
    assert not found, "\n".join(found)
