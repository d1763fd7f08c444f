"""Test-only fault injection for the `lamina train` processes that tests/test_distributed.py starts.

Python imports `sitecustomize` at start-up from any folder on sys.path. The distributed tests put
this folder on PYTHONPATH together with LAMINA_FAIL_AT=RANK:STEP (torchrun hands the environment
on to its workers); in the process of rank RANK the task's `draw` then raises when it draws the
batch of step STEP, standing for bad data. It wraps `lamina.training.distributed.place`, which
`lamina train` calls once per process after building the session. Production code knows nothing
of this variable.
"""

from __future__ import annotations

import os
from typing import Any

FAIL_ENV = "LAMINA_FAIL_AT"


class FailingTask:
    """A task whose data goes bad at one step (counted from the session's step at the start)."""

    def __init__(self, task: Any, rank: int, fail_at: int, start: int) -> None:
        self._task, self._rank, self._fail_at, self._step = task, rank, fail_at, start
        self._draw = task.draw  # the objective's own, before place() replaces it with ours

    def draw(self, n: int) -> Any:
        from lamina.errors import LaminaError

        self._step += 1
        if self._step == self._fail_at:
            raise LaminaError(f"bad data on rank {self._rank} at step {self._step} ({FAIL_ENV})")
        return self._draw(n)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._task, name)


def install(spec: str) -> None:
    rank, _, step = spec.partition(":")
    fail_rank, fail_step = int(rank), int(step)
    import lamina.training.distributed as distributed

    real = distributed.place

    def place(session: Any, world: Any) -> Any:
        placement = real(session, world)
        if placement.rank == fail_rank:  # the session is frozen: wrap its objective's draw
            failing = FailingTask(session.objective, fail_rank, fail_step, session.state.step)
            session.objective.draw = failing.draw
        return placement

    distributed.place = place


if os.environ.get(FAIL_ENV):
    install(os.environ[FAIL_ENV])
