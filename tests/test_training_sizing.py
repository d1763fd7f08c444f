"""--max-time sizes the run to the budget: a probe step picks the batch (kept when the default
fits), evaluations are bounded with a standard error, long steps show a heartbeat, and the whole
command (setup, evaluations, save) ends inside the budget."""

from __future__ import annotations

import json
import math
import time

import pytest
import torch

import lamina
from lamina import GPT, GPTConfig
from lamina.cli import main
from lamina.tokenizers.kinds import CharTokenizer
from lamina.training import sizing
from lamina.training.progress import Heartbeat
from lamina.training.sizing import MICRO_TOKENS, STEP_SHARE, choose
from lamina.training.split_loss import val_line

TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n"


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    # what a run imports once (the optimizer's torch._dynamo, the plot's matplotlib: seconds in
    # a fresh process) is imported here, so the budget test times the run, not the imports
    import matplotlib.pyplot  # noqa: F401
    import torch._dynamo  # noqa: F401

    d = tmp_path_factory.mktemp("sizing")
    (d / "corpus.txt").write_text(TEXT * 80, encoding="utf-8")
    tok = CharTokenizer.from_text(TEXT)
    torch.manual_seed(0)
    cfg = GPTConfig.preset(
        "llama-tiny", vocab_size=tok.vocab_size, d_model=32, n_layers=2, d_ff=64, block_size=32
    )
    lamina.save(d / "base", GPT(cfg), tok)
    return d


def test_the_default_batch_is_kept_while_its_step_is_short():
    z = choose(600, 0.1, 0.03, batch_size=16, micro_batch_size=8, seq_len=256, eval_rows=64)
    assert (z.batch_size, z.micro_batch_size, z.probed) == (16, 8, False)
    assert z.eval_rows == 64  # never more than the defaults evaluate


def test_a_long_step_is_cut_to_a_share_of_the_budget():
    z = choose(120, 1.0, 0.3, batch_size=16, micro_batch_size=16, seq_len=256, eval_rows=64)
    assert z.probed and z.batch_size == int(STEP_SHARE * 120) == 3
    assert 0.01 * 120 <= z.step_seconds <= 0.05 * 120
    assert z.eval_rows == 16  # 4% of 120 s at 0.3 s a sequence
    z = choose(1800, 2.0, 0.5, batch_size=64, micro_batch_size=64, seq_len=1024, eval_rows=80)
    assert z.micro_batch_size * 1024 <= MICRO_TOKENS and z.batch_size % z.micro_batch_size == 0
    assert z.batch_size == 22  # 22 sequences fit in 2.5%: 11 micro-batches of 2
    z = choose(60, 30.0, 10.0, batch_size=16, micro_batch_size=16, seq_len=256, eval_rows=64)
    assert (z.batch_size, z.eval_rows) == (1, 2)  # at least one sequence, two to evaluate


def test_a_long_call_shows_a_heartbeat():
    class Lines:
        said: list[str] = []

        def message(self, text):
            self.said.append(text)

    lines = Lines()
    with Heartbeat(lines, "step 3", parts=4, after=0.05, every=0.05) as beat:
        beat.at(1)
        time.sleep(0.3)
    assert lines.said and lines.said[0].startswith("step 3: ")
    assert lines.said[-1].endswith("micro-batch 2/4")
    with Heartbeat(lines, "quick", after=5.0):
        pass
    assert not any(s.startswith("quick") for s in lines.said)


def test_a_sampled_evaluation_says_its_standard_error():
    line = val_line({"loss": 3.2, "loss_se": 0.1, "loss_per_char": 1.1, "loss_per_char_se": 0.03})
    assert line.startswith("1.1000 ± 0.0300 nats/char") and "loss_se" not in line
    assert val_line({"loss": 2.0, "loss_se": 0.25}) == "loss 2.0000 ± 0.2500"


def test_max_time_probes_the_batch_and_ends_inside_the_budget(base, tmp_path, capsys, monkeypatch):
    """A made-up slow probe (1 s a sequence) cuts the batch; the command ends in the budget."""
    monkeypatch.setattr(sizing, "probe", lambda s, p, clock, budget: (1.0, 0.05))
    out = tmp_path / "run"
    args = ["train", "--init-from", str(base / "base"), "--data", str(base / "corpus.txt")]
    args += ["--lora", "--max-time", "5s", "--out", str(out), "--quiet"]
    t0 = time.perf_counter()
    assert main(args) == 0
    took = time.perf_counter() - t0
    said = capsys.readouterr().out
    assert took < 5.0 + 2.0, said  # the issue allows 10% or 10 s; 2 s on a loaded machine
    assert "probe: one 32-token sequence took 1.00 s" in said and "batch 1 = micro-batch 1" in said
    train = json.loads((out / "train_config.json").read_text())["train"]
    assert (train["batch_size"], train["micro_batch_size"]) == (1, 1)
    assert train["warmup"] <= 10 and train["eval_batches"] >= 2
    evals = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in evals if "val_loss" in r]
    assert evals[0]["step"] == 0 and "val_loss_se" in evals[0]


def test_a_typed_batch_is_not_probed(base, tmp_path, capsys):
    out = tmp_path / "typed"
    args = ["train", "--init-from", str(base / "base"), "--data", str(base / "corpus.txt")]
    args += ["--lora", "--max-time", "60s", "--max-steps", "2", "--batch-size", "4", "--quiet"]
    args += ["--out", str(out)]
    assert main(args) == 0
    assert "probe:" not in capsys.readouterr().out
    assert json.loads((out / "train_config.json").read_text())["train"]["batch_size"] == 4


def test_a_budget_too_short_for_one_step_skips_the_evaluations(base, tmp_path, capsys, monkeypatch):
    """A probe of 10 s a sequence in a 3 s budget: no zero-shot evaluation, no step, no final
    evaluation (the run says it is untrained and exits 1), still inside the budget."""
    monkeypatch.setattr(sizing, "probe", lambda s, p, clock, budget: (10.0, 5.0))
    out = tmp_path / "short"
    args = ["train", "--init-from", str(base / "base"), "--data", str(base / "corpus.txt")]
    args += ["--lora", "--max-time", "3s", "--out", str(out), "--quiet"]
    t0 = time.perf_counter()
    assert main(args) == 1
    assert time.perf_counter() - t0 < 3.0 + 2.0
    said = capsys.readouterr()
    assert "eval step" not in said.out and "untrained" in said.err


def test_a_forward_past_its_deadline_stops_at_the_next_block():
    from lamina.training.sizing import OutOfTime, deadline

    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("llama-tiny", vocab_size=20, d_model=32, n_layers=3, d_ff=64))
    ids = torch.randint(0, 20, (1, 8))
    with deadline(model, time.perf_counter, float("inf")) as cut:
        model(ids)
    assert cut.entered == 3
    ticks = iter(range(100))  # a clock past the deadline from the second block on
    with pytest.raises(OutOfTime), deadline(model, lambda: next(ticks), 0.5) as cut:
        model(ids)
    assert cut.entered == 1 and not model.blocks[0]._forward_pre_hooks  # hooks removed


def test_the_probe_keeps_its_fastest_micro_step_past_a_stall():
    now, calls = [0.0], []
    durations = iter([0.57, 0.5, 0.01, 0.02, 9.0, 9.0])  # stalled steps, then quick ones

    def step() -> None:
        calls.append(1)
        now[0] += next(durations)

    assert sizing.fastest(lambda: now[0], step, 0.6, until=10.0) == pytest.approx(0.01)
    assert len(calls) == sizing.PROBE_TIMINGS - 1  # the first timing was given
    now[0], calls, durations = 0.0, [], iter([0.3, 0.2])
    assert sizing.fastest(lambda: now[0], step, 0.4, until=0.25) == pytest.approx(
        0.3
    )  # past `until` at once
    assert len(calls) == 1


def test_a_cut_is_confirmed_past_a_stall_longer_than_the_first_window():
    """100 s, batch 48: a sequence may take 5 s / 48 ~ 0.104 s. A stall of ~1.4 s (0.28 s a
    micro-step, as once seen) covers the 1 s window; confirming finds the quick steps after it."""
    budget, batch = 100.0, 48
    fits = sizing.MAX_STEP_SHARE * budget / batch
    now, calls = [0.0], []

    def clocked(durations):
        it = iter(durations)

        def step() -> None:
            calls.append(1)
            now[0] += next(it)

        return step

    until = sizing.PROBE_REPEAT_SHARE * budget
    confirm = sizing.PROBE_CONFIRM_SHARE * budget
    step = clocked([0.28] * 4 + [0.03] + [9.0])
    first = 0.28
    now[0] = first
    unconfirmed = sizing.fastest(lambda: now[0], clocked([0.28] * 4), first, until)
    assert unconfirmed == pytest.approx(0.28)  # the old probe: the batch would be cut to 8
    z = choose(budget, unconfirmed, 0.01, batch_size=batch, micro_batch_size=32, seq_len=64,
               eval_rows=320)  # fmt: skip
    assert z.probed and z.batch_size < batch
    now[0], calls = first, []
    best = sizing.fastest(lambda: now[0], step, first, until, fits=fits, confirm_until=confirm)
    assert best == pytest.approx(0.03) and len(calls) == 5  # stopped once the batch fits
    z = choose(budget, best, 0.01, batch_size=batch, micro_batch_size=32, seq_len=64,
               eval_rows=320)  # fmt: skip
    assert (z.batch_size, z.probed) == (batch, False)
    # a step truly that slow: timed until the confirmation window ends, then the cut stands
    now[0], calls = first, []
    best = sizing.fastest(lambda: now[0], clocked([0.2] * 100), first, until, fits=fits,
                          confirm_until=confirm)  # fmt: skip
    assert best == pytest.approx(0.2) and now[0] < confirm + 0.2 + 1e-9
    assert len(calls) == math.ceil((confirm - first) / 0.2)
    # a quick first window is not extended
    now[0], calls = 0.01, []
    best = sizing.fastest(lambda: now[0], clocked([0.01] * 100), 0.01, until, fits=fits,
                          confirm_until=confirm)  # fmt: skip
    assert len(calls) == sizing.PROBE_TIMINGS - 1


def test_setup_before_the_first_step_is_charged_to_the_budget(base, tmp_path, capsys, monkeypatch):
    """Issue 36: a from-scratch run's setup (here the tokenizer's fit, made 1 s slow) counts
    against --max-time: the loop's clock starts before it, the probe sizes the run to what it
    left, the progress says how long it took, and the command ends inside the budget."""
    from lamina.data import text_splits
    from lamina.training import loop

    seen: dict[str, float] = {}
    real_fit, real_run = text_splits.build_tokenizer, loop.run_training

    def slow_fit(*args, **kw):
        if "fit" not in seen:
            seen["fit"] = time.perf_counter()
            time.sleep(1.0)
        return real_fit(*args, **kw)

    def spy(s, *args, **kw):
        seen["started_at"] = kw["started_at"]
        return real_run(s, *args, **kw)

    monkeypatch.setattr(text_splits, "build_tokenizer", slow_fit)
    monkeypatch.setattr(loop, "run_training", spy)
    out = tmp_path / "scratch"
    args = ["train", "--data", str(base / "corpus.txt"), "--tokenizer", "char"]
    args += ["--preset", "tiny", "--block-size", "16", "--max-time", "5s", "--out", str(out)]
    t0 = time.perf_counter()
    assert main([*args, "--quiet"]) == 0
    took = time.perf_counter() - t0
    said = capsys.readouterr().out
    assert seen["started_at"] <= seen["fit"]  # the budget's clock was running during setup
    assert took < 5.0 + 2.0, said
    setup = float(said.split("setup took ")[1].split(" s")[0])
    assert 1.0 <= setup < 5.0, said
    left = float(said.split("% of the ")[1].split(" s left after setup")[0])
    assert left <= 5.0 - 1.0, said  # the probe's shares are of what setup left
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["step"] >= 1 and 1.0 <= state["seconds_used"] <= took
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert next(r for r in steps if "loss" in r)["elapsed"] >= 1.0  # counted from before setup
