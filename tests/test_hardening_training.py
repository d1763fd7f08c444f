"""Issue 17, training side: nothing lost, nothing corrupted, every size bounded.

One section per class of the issue: non-finite runs never leave a NaN checkpoint called good;
one writer per run directory; flags that used to be ignored; absolute paths; sizes bounded up
front; no traceback for a broken stdout, a read-only folder or a full disk.
"""

from __future__ import annotations

import errno
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import lamina
from lamina.checkpoint import load_tensors, save_tensors
from lamina.cli import main
from lamina.errors import LaminaError
from lamina.training.run_dir import RUN_FILES, RunDir

TINY = ["--preset", "tiny", "--block-size", "16", "--batch-size", "4", "--eval-batches", "2"]
SRC = str(Path(lamina.__file__).resolve().parent.parent)  # the lamina under test


def one_line_error(capsys, argv: list[str]) -> str:
    """Run the CLI, expect exit 2 and exactly one line on stderr (no traceback)."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def strict_lines(path: Path) -> list[dict]:
    def refuse(name: str) -> None:
        raise ValueError(f"bare {name} in {path}")

    return [json.loads(line, parse_constant=refuse) for line in path.read_text().splitlines()]


def train(corpus: str, out: Path, *extra: str) -> None:
    assert main(["train", "--data", corpus, *TINY, "--out", str(out), *extra]) == 0


# -- 1. a non-finite run never leaves a NaN checkpoint called good ------------------------------
def test_diverging_run_leaves_only_finite_checkpoints(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", "--data", corpus, *TINY, "--lr", "1e6", "--max-steps", "20"]
    err = one_line_error(capsys, [*argv, "--out", str(out)])
    assert "Last good checkpoint" in err
    strict_lines(out / "metrics.jsonl")  # no bare NaN
    if (out / "trainer_state.json").is_file():
        step = json.loads((out / "trainer_state.json").read_text())["step"]
        assert f"step {step} in" in err
        weights = load_tensors(out / "model.safetensors")
        assert all(bool(torch.isfinite(t).all()) for t in weights.values())
    else:
        assert "none" in err


def test_metrics_with_nan_stay_strict_json(tmp_path):
    run = RunDir.create(tmp_path / "run")
    run.write_metrics([{"step": 1, "loss": math.nan, "val_loss": math.inf, "lr": 0.1}])
    (rec,) = strict_lines(tmp_path / "run" / "metrics.jsonl")
    assert rec == {"step": 1, "loss": None, "val_loss": None, "lr": 0.1}
    run.release()


def test_check_finite_names_the_tensor():
    from lamina.modes import check_finite, non_finite

    model = torch.nn.Linear(2, 2)
    assert non_finite(model) is None
    check_finite(model, "here")
    with torch.no_grad():
        model.bias[1] = math.nan
    assert non_finite(model) == "bias"
    with pytest.raises(LaminaError, match="here: .*not finite.*bias"):
        check_finite(model, "here")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_finds_one_bad_value_anywhere(dtype, bad):
    from lamina.modes import non_finite

    model = torch.nn.Module()
    model.empty = torch.nn.Parameter(torch.empty(0, 3, dtype=dtype))  # no min or max: skipped
    model.w = torch.nn.Parameter(torch.randn(37, 129).to(dtype))
    model.register_buffer("ids", torch.arange(5))  # not floating: skipped
    assert non_finite(model) is None
    for at in (0, 37 * 129 // 2, 37 * 129 - 1):
        with torch.no_grad():
            model.w.view(-1)[at] = bad
        assert non_finite(model) == "w", (at, bad)
        with torch.no_grad():
            model.w.view(-1)[at] = 0.5
    with torch.no_grad():
        model.w.t()[3, 2] = bad  # a strided view of it
    assert non_finite(model) == "w"


def test_eval_and_resume_refuse_a_run_with_nan_weights(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    train(corpus, out, "--max-steps", "2")
    weights = load_tensors(out / "model.safetensors")
    name = sorted(weights)[0]
    weights[name] = torch.full_like(weights[name], math.nan)
    save_tensors(out / "model.safetensors", weights)
    capsys.readouterr()
    assert "not finite" in one_line_error(capsys, ["eval", str(out)])
    err = one_line_error(capsys, ["train", "--resume", str(out), "--max-steps", "3"])
    assert "not finite" in err and name in err


# -- 2. one run directory, one writer ------------------------------------------------------------
HOLD = """
import fcntl, os, sys, time
fd = os.open(os.path.join(sys.argv[1], ".lock"), os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, str(os.getpid()).encode())
print("locked", flush=True)
time.sleep(120)
"""


class Holder:
    """Another process holding a run folder's lock, as a running `lamina train` does."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HOLD, str(folder)], stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout.readline().strip() == "locked"

    def __enter__(self) -> int:
        return self.proc.pid

    def __exit__(self, *exc: object) -> None:
        self.proc.kill()
        self.proc.wait()


def test_second_train_on_a_locked_folder_is_refused_naming_the_pid(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    with Holder(out) as pid:
        argv = ["train", "--data", corpus, *TINY, "--max-steps", "2", "--out", str(out)]
        err = one_line_error(capsys, argv)
        assert f"pid {pid}" in err
        assert not (out / "train_config.json").exists()


def test_second_resume_is_refused_and_a_stale_lock_is_reported(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    train(corpus, out, "--max-steps", "2")
    assert (out / ".lock").read_text() == ""  # released on exit
    capsys.readouterr()
    with Holder(out) as pid:
        err = one_line_error(capsys, ["train", "--resume", str(out), "--max-steps", "3"])
        assert f"pid {pid}" in err
    # the holder was killed: its pid stays in the file, the kernel dropped its lock
    assert main(["train", "--resume", str(out), "--max-steps", "3"]) == 0
    assert f"pid {pid}" in capsys.readouterr().err
    assert json.loads((out / "trainer_state.json").read_text())["step"] == 3


# -- 3. flags that were ignored or recorded wrongly ----------------------------------------------
def test_max_steps_holds_under_a_time_budget(corpus, tmp_path):
    out = tmp_path / "run"
    train(corpus, out, "--max-time", "30s", "--max-steps", "3")
    assert json.loads((out / "trainer_state.json").read_text())["step"] == 3


def test_a_budget_that_ends_before_the_first_step_exits_nonzero(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", "--data", corpus, *TINY, "--max-time", "0.001s", "--out", str(out)]
    assert main(argv) == 1
    assert "untrained" in capsys.readouterr().err


@pytest.mark.parametrize(
    "flags",
    [["--nproc", "0"], ["--nproc", "-1"], ["--fsdp"], ["--out", ""], ["--resume", ""]],
)
def test_flags_refused_up_front(capsys, flags, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # were a flag accepted, its run would land here
    one_line_error(capsys, ["train", "--max-steps", "1", *flags])


def test_first_last_refuses_data(corpus, tmp_path, capsys):
    argv = ["train", "--task", "first-last", "--data", corpus, "--out", str(tmp_path / "r")]
    assert "--data" in one_line_error(capsys, argv)


def test_resume_refuses_a_hand_edited_config_json(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    train(corpus, out, "--max-steps", "2")
    cfg = json.loads((out / "config.json").read_text())
    cfg["model"]["dropout"] = 0.5
    (out / "config.json").write_text(json.dumps(cfg))
    capsys.readouterr()
    err = one_line_error(capsys, ["train", "--resume", str(out), "--max-steps", "3"])
    assert "dropout" in err


# -- 4. paths recorded absolute, compared as files -----------------------------------------------
def test_run_works_from_another_directory(corpus, tmp_path, monkeypatch, capsys):
    here = tmp_path / "work"
    (here / "data").mkdir(parents=True)
    (here / "data" / "good.txt").write_text(Path(corpus).read_text())
    monkeypatch.chdir(here)
    assert main(["train", "--data", "data/good.txt", *TINY, "--max-steps", "2", "--out", "r"]) == 0
    saved = json.loads((here / "r" / "train_config.json").read_text())["train"]
    assert saved["data"] == str((here / "data" / "good.txt").resolve())
    assert saved["out"] == str((here / "r").resolve())
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    run = str(here / "r")
    assert main(["eval", run]) == 0
    data = str(here / "data" / "good.txt")
    assert main(["train", "--resume", run, "--data", data, "--max-steps", "3"]) == 0
    monkeypatch.chdir(here)  # the same file by its relative name agrees too
    again = ["train", "--resume", "r", "--data", "./data/../data/good.txt", "--max-steps", "4"]
    assert main(again) == 0
    capsys.readouterr()


# -- 5. sizes bounded up front -------------------------------------------------------------------
def test_count_of_a_huge_depth_does_not_build_modules(monkeypatch, capsys):
    import lamina.models.params as params

    real = params.meta_model

    def guarded(config):
        if config.n_layers > 10_000:
            raise AssertionError(f"built {config.n_layers} layers")
        return real(config)

    monkeypatch.setattr(params, "meta_model", guarded)
    assert main(["count", "gpt2-small", "--n-layers", "100000000", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["meta_device"] is None
    deep = params.GPTConfig.preset("gpt2-small").replace(n_layers=100_000_000)
    assert got["tied"] == params.count_params(deep)
    assert main(["count", "gpt2-small", "--json"]) == 0  # a normal shape is still built
    small = json.loads(capsys.readouterr().out)
    assert small["meta_device"] == small["tied"]


def test_task_refuses_a_length_that_cannot_fit(monkeypatch, capsys):
    import lamina.training.first_last as first_last

    def never(*a, **k):
        raise AssertionError("the model was built")

    monkeypatch.setattr(first_last, "SequenceClassifier", never)
    err = one_line_error(capsys, ["task", "first-last", "--length", "100000"])
    assert "100000" in err and "GiB" in err


def test_train_refuses_a_model_larger_than_memory(corpus, tmp_path, monkeypatch, capsys):
    import lamina.training.lm as lm

    def never(*a, **k):
        raise AssertionError("the model was built")

    monkeypatch.setattr(lm, "GPT", never)
    argv = ["train", "--data", corpus, *TINY, "--n-layers", "100000000", "--max-steps", "1"]
    err = one_line_error(capsys, [*argv, "--out", str(tmp_path / "r")])
    assert "GiB" in err and "n_layers 100000000" in err


@pytest.mark.parametrize("flag", ["--steps", "--length", "--vocab-size", "--batch-size"])
def test_task_refuses_sizes_below_one(capsys, flag):
    assert flag in one_line_error(capsys, ["task", "first-last", flag, "0"])


# -- 6. no tracebacks: broken stdout, read-only folder, full disk --------------------------------
def test_training_survives_a_broken_stdout(corpus, tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "lamina", "train", "--data", corpus, *TINY,
           "--max-steps", "30", "--log-every", "1", "--out", str(out)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": SRC}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    proc.stdout.readline()  # like `| head -1`
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0, err
    assert "Traceback" not in err and "Exception ignored" not in err, err
    assert json.loads((out / "trainer_state.json").read_text())["step"] == 30


def test_create_never_unlinks_without_force(tmp_path, monkeypatch):
    (tmp_path / "empty").mkdir()
    real = Path.unlink

    def read_only(self, *a, **k):
        if self.name in RUN_FILES:
            raise OSError(errno.EROFS, "Read-only file system", str(self))
        return real(self, *a, **k)

    monkeypatch.setattr(Path, "unlink", read_only)
    RunDir.create(tmp_path / "empty").release()


def test_full_disk_says_whether_a_checkpoint_exists(tmp_path):
    run = RunDir.create(tmp_path / "run")

    def full(_folder):
        raise OSError(errno.ENOSPC, "No space left on device")

    state = {"step": 1}
    with pytest.raises(LaminaError, match="no checkpoint has been written yet") as info:
        run.write_checkpoint(full, ({}, {}), state)
    assert "intact" not in str(info.value)
    run.write_checkpoint(lambda d: None, ({"m": torch.zeros(1)}, {}), state)
    with pytest.raises(LaminaError, match=r"previous checkpoint \(step 1\) is intact"):
        run.write_checkpoint(full, ({}, {}), {"step": 2})
    run.release()


def test_seeds_beyond_64_bits_are_one_line_in_train_and_sample(tmp_path, capsys):
    from lamina.cli import main

    assert (
        main(["train", "--preset", "tiny", "--seed", str(2**64), "--out", str(tmp_path / "r")]) == 2
    )
    assert "seed must be in [0, 2**64)" in capsys.readouterr().err
    assert main(["task", "first-last", "--seed", str(2**70), "--steps", "1"]) == 2
    assert "seed" in capsys.readouterr().err


def test_sample_refuses_a_model_with_non_finite_weights(tmp_path, capsys):
    import torch

    import lamina
    from lamina.cli import main
    from lamina.tokenizers.kinds import CharTokenizer

    tok = CharTokenizer.from_text("abc\n")
    model = lamina.GPT(lamina.GPTConfig.preset("tiny", vocab_size=tok.vocab_size))
    with torch.no_grad():
        model.blocks[0].attn.proj.weight[0, 0] = float("nan")
    lamina.save(tmp_path / "m", model, tok)
    assert main(["sample", str(tmp_path / "m"), "--prompt", "a", "--max-new-tokens", "3"]) == 2
    err = capsys.readouterr().err
    assert "not finite" in err and "blocks.0.attn.proj.weight" in err
