"""The command line: check, count, task, help, and bad input as one line with exit status 2."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lamina.cli import main


def test_check_prints_only_pass(capsys):
    assert main(["check"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert all(line.startswith("PASS") for line in lines[:-1])
    assert lines[-1].endswith("checks passed")


def test_count_gpt2_small_shows_both_totals(capsys):
    assert main(["count", "gpt2-small"]) == 0
    out = capsys.readouterr().out
    assert "124,439,808" in out and "163,037,184" in out
    assert "MiB fp32" in out and "bf16" in out


def test_count_without_qkv_bias_matches_the_seed_notebook(capsys):
    assert main(["count", "gpt2-small", "--no-qkv-bias"]) == 0
    out = capsys.readouterr().out
    assert "124,412,160" in out and "163,009,536" in out


def test_count_overrides_and_json(capsys):
    assert main(["count", "gpt2-small", "--n-layers", "24", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["config"]["n_layers"] == 24
    assert data["tied"] == data["meta_device"]


def test_count_reads_a_config_file(tmp_path, capsys):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps(dict(vocab_size=10, block_size=8, d_model=8, n_heads=2, n_layers=1)))
    assert main(["count", "--config", str(cfg), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["config"]["vocab_size"] == 10


@pytest.mark.parametrize(
    "argv, message",
    [
        (["count", "tiny", "--d-model", "30"], "d_model=30 must be divisible by n_heads=4"),
        (["count", "tiny", "--n-layers", "0"], "n_layers must be a positive integer, got 0"),
        (["count", "tiny", "--dropout", "1.5"], "dropout"),
        (["count", "--config", "/nonexistent.json"], "No such file"),
        (["task", "first-last", "--steps", "0"], "steps"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_task_first_last_reports_accuracy(capsys):
    """`lamina task` runs the shared training loop (its evaluation lines) and writes nothing."""
    assert main(["task", "first-last", "--steps", "20"]) == 0
    out = capsys.readouterr().out
    assert "held-out accuracy" in out and "after 20 steps" in out
    assert "eval step 20: loss" in out and "accuracy" in out


def test_python_dash_m_runs_help_and_errors_without_traceback():
    run = [sys.executable, "-m", "lamina"]
    out = subprocess.run([*run, "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "check" in out.stdout and "count" in out.stdout
    bad = subprocess.run([*run, "count", "tiny", "--n-heads", "5"], capture_output=True, text=True)
    assert bad.returncode == 2
    assert bad.stderr.strip().count("\n") == 0 and "Traceback" not in bad.stderr


def test_every_listed_verb_is_a_module_and_every_verb_module_is_listed():
    import lamina.cli

    folder = Path(lamina.cli.__file__).parent
    helpers = {"__init__", "launch", "flags", "engine"}  # torchrun, flags, chat/sample engine
    modules = {p.stem for p in folder.glob("*.py")} - helpers
    assert set(lamina.cli.VERBS) == modules
