"""Several processes train like one: torchrun, gloo, 2 processes on loopback, tiny GPT.

Each scenario launches `lamina train --nproc 2` (torchrun --standalone) a few times and compares
the per-step losses with one in-process run on the same global batch (batch 8, micro-batch 2:
accumulation 4 in one process, 2 per rank in two). A failure injected on rank 1 at step 5
stands for bad data and interrupts the runs after their step-4 checkpoint: tests/inject holds a
`sitecustomize` that the launched processes import when it is on PYTHONPATH, and it reads
LAMINA_FAIL_AT=RANK:STEP (a test-only hook; lamina itself knows nothing of it).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import lamina
from lamina.cli import main
from lamina.training.config import TrainConfig
from lamina.training.loop import run_training
from lamina.training.session import new_session, resume_session

STEPS, FAIL_AT, TOL = 6, 5, 1e-5
FLAGS = ["--preset", "tiny", "--block-size", "16", "--dropout", "0", "--batch-size", "8",
         "--micro-batch-size", "2", "--max-steps", str(STEPS), "--eval-every", "4",
         "--checkpoint-every", "4", "--log-every", "1", "--warmup", "2", "--lr", "3e-3",
         "--device", "cpu", "--quiet",
         # AdamW, which FSDP can shard (Muon, the CPU default, needs whole matrices; its bf16
         # Newton-Schulz steps also turn last-bit differences of the all-reduced gradient into
         # ~1e-5 loss differences, above this file's tolerance)
         "--optimizer", "adamw"]  # fmt: skip
LAUNCH_TIMEOUT = 120
INJECT = str(Path(__file__).resolve().parent / "inject")  # sitecustomize: LAMINA_FAIL_AT


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory) -> dict[int, float]:
    """Per-step losses of one process, uninterrupted."""
    cfg = TrainConfig(data=corpus, preset="tiny", batch_size=8, micro_batch_size=2,
                      max_steps=STEPS, eval_every=4, checkpoint_every=4, log_every=1, warmup=2,
                      lr=3e-3, device="cpu", optimizer="adamw",
                      model_overrides={"dropout": 0.0, "block_size": 16})  # fmt: skip
    out = tmp_path_factory.mktemp("ref") / "run"
    return run_training(new_session(cfg, out=out), quiet=True).losses


def train(
    *args: str, fail_at: int | None = None, torchrun: bool = True
) -> subprocess.CompletedProcess:
    """`torchrun --standalone --nproc_per_node=2 -m lamina train ARGS`, or `lamina train ARGS`."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("LAMINA_FAIL_AT", None)
    if fail_at is not None:
        env["LAMINA_FAIL_AT"] = f"1:{fail_at}"
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [INJECT, env.get("PYTHONPATH")]))
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    cmd = [sys.executable, *(launcher if torchrun else []), "-m", "lamina", "train", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT)


def logged_losses(run: Path) -> dict[int, float]:
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in recs if "loss" in r}


def step_of(run: Path) -> int:
    return json.loads((run / "trainer_state.json").read_text())["step"]


def processes_mentioning(text: str) -> list[int]:
    pids = []
    for p in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text in p.read_bytes().decode(errors="ignore"):
                pids.append(int(p.parent.name))
        except OSError:
            pass
    return [pid for pid in pids if pid != os.getpid()]


def assert_close(got: dict[int, float], ref: dict[int, float], steps: range) -> None:
    assert sorted(got) == list(steps), sorted(got)
    diffs = {s: abs(got[s] - ref[s]) for s in steps}
    assert max(diffs.values()) <= TOL, diffs


def interrupted_then_resumed(corpus: str, root: Path, *extra: str) -> dict[str, object]:
    """Run 2 processes until rank 1 fails at step 5, then resume them; keep a copy to resume in 1."""
    run = root / "run"
    shortcut = not extra  # DDP goes through `lamina train --nproc 2` (which runs torchrun)
    nproc = ["--nproc", "2"] if shortcut else []
    failed = train("--data", corpus, "--out", str(run), *nproc, *extra, *FLAGS, fail_at=FAIL_AT,
                   torchrun=not shortcut)  # fmt: skip
    leftovers = processes_mentioning(str(run))
    before = logged_losses(run)
    shutil.copytree(run, root / "copy")
    resumed = train("--resume", str(run), *extra, "--quiet")
    return dict(run=run, failed=failed, leftovers=leftovers, before=before, resumed=resumed)


@pytest.fixture(scope="module")
def ddp(corpus, tmp_path_factory) -> dict[str, object]:
    return interrupted_then_resumed(corpus, tmp_path_factory.mktemp("ddp"))


@pytest.fixture(scope="module")
def fsdp(corpus, tmp_path_factory) -> dict[str, object]:
    return interrupted_then_resumed(corpus, tmp_path_factory.mktemp("fsdp"), "--fsdp")


def test_failing_rank_stops_all_ranks_with_its_error(ddp):
    """Rank 1's bad data: non-zero exit, its message on stderr, no process left, ckpt intact."""
    failed = ddp["failed"]
    assert failed.returncode != 0
    assert f"bad data on rank 1 at step {FAIL_AT}" in failed.stderr
    assert ddp["leftovers"] == []
    run = ddp["run"].parent / "copy"
    assert step_of(run) == FAIL_AT - 1  # the last complete checkpoint
    model, tok = lamina.load(run)
    assert tok.decode(tok.encode("Speak")) == "Speak"


def test_ddp_losses_equal_one_process(ddp, reference):
    """Steps 1-4 with 2 processes (DDP, no_sync accumulation) == 1 process within 1e-5."""
    assert_close(ddp["before"], reference, range(1, FAIL_AT))


def test_ddp_interrupted_and_resumed_equals_uninterrupted(ddp, reference):
    resumed = ddp["resumed"]
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert_close(logged_losses(ddp["run"]), reference, range(1, STEPS + 1))


def test_saved_under_two_processes_resumes_in_one(ddp, reference):
    rest = run_training(resume_session(ddp["run"].parent / "copy", {}), quiet=True)
    assert_close(rest.losses, reference, range(FAIL_AT, STEPS + 1))


def test_fsdp_losses_equal_one_process(fsdp, reference):
    """FSDP2 shards: steps 1-4 == 1 process; its failure also stops every rank."""
    assert fsdp["failed"].returncode != 0 and fsdp["leftovers"] == []
    assert_close(fsdp["before"], reference, range(1, FAIL_AT))


def test_fsdp_checkpoint_resumes_in_one_process_and_under_fsdp(fsdp, reference):
    """The gathered checkpoint (model + AdamW moments) continues exactly, sharded or not."""
    resumed = fsdp["resumed"]
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert_close(logged_losses(fsdp["run"]), reference, range(1, STEPS + 1))
    rest = run_training(resume_session(fsdp["run"].parent / "copy", {}), quiet=True)
    assert_close(rest.losses, reference, range(FAIL_AT, STEPS + 1))


def run_main(capsys, *args: str) -> tuple[int, str]:
    code = main(["train", *args])
    return code, capsys.readouterr().err


def test_batch_not_divisible_by_processes_names_valid_sizes(corpus, tmp_path, capsys):
    code, err = run_main(capsys, "--data", corpus, "--out", str(tmp_path / "r"), "--nproc", "2",
                         "--batch-size", "12", "--micro-batch-size", "4")  # fmt: skip
    assert code == 2 and "valid batch sizes nearby: 8, 16" in err
    code, err = run_main(capsys, "--data", corpus, "--out", str(tmp_path / "r"), "--nproc", "2",
                         "--batch-size", "7")  # fmt: skip
    assert code == 2 and "2 processes" in err and "6, 8" in err
    assert not (tmp_path / "r").exists()


def test_more_processes_than_cores_warns_and_fsdp_compile_refused(corpus, tmp_path, capsys):
    code, err = run_main(capsys, "--data", corpus, "--nproc", "4096", "--batch-size", "7")
    assert code == 2 and "exceeds the" in err and "CPU cores" in err
    code, err = run_main(capsys, "--data", corpus, "--nproc", "2", "--fsdp", "--compile")
    assert code == 2 and "--fsdp with --compile is not supported" in err
    assert len(err.strip().splitlines()) == 1
