"""training.heap: malloc_trim inside `lamina train`'s training forwards only, a no-op off glibc."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import lamina.libc as libc_module
from lamina.cli import main
from lamina.training import heap

TINY = ["--preset", "tiny", "--block-size", "16", "--batch-size", "4", "--eval-batches", "2"]


class FakeLibc:
    def __init__(self) -> None:
        self.trims = 0

    def malloc_trim(self, pad: int) -> int:
        assert pad == 0
        self.trims += 1
        return 1


class Blocks(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(3, 3) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x


def test_trims_every_kth_training_forward_and_unhooks_on_exit():
    libc, model, x = FakeLibc(), Blocks(6), torch.randn(2, 3)
    with heap.lean_heap(model, every=4, libc=libc) as on:
        assert on
        model(x).sum().backward()  # 6 block forwards: one trim at the 4th
        assert libc.trims == 1
        model(x)  # 12 so far: at the 8th and the 12th
        assert libc.trims == 3
        with torch.no_grad():  # an evaluation: no trims, not counted
            model(x)
        assert libc.trims == 3
    model(x)
    assert libc.trims == 3 and all(not b._forward_hooks for b in model.blocks)


def test_no_op_where_the_c_library_is_not_glibc(monkeypatch):
    monkeypatch.setattr(libc_module.platform, "libc_ver", lambda: ("", ""))
    assert heap.glibc() is None
    model = Blocks(2)
    with heap.lean_heap(model, every=1) as on:
        assert not on and all(not b._forward_hooks for b in model.blocks)
        model(torch.randn(1, 3)).sum().backward()


def test_refuses_a_bad_interval():
    with pytest.raises(ValueError, match="every"), heap.lean_heap(Blocks(1), every=0):
        pass


@pytest.mark.parametrize("flags, trimmed", [([], True), (["--no-heap-trim"], False)])
def test_the_train_command_trims_inside_its_loop_only(corpus, tmp_path, monkeypatch, flags,
                                                       trimmed):  # fmt: skip
    libc = FakeLibc()
    monkeypatch.setattr(heap, "glibc", lambda: libc)
    out = str(tmp_path / "run")
    argv = ["train", "--data", corpus, *TINY, "--max-steps", "5", "--out", out, *flags]
    assert main(argv) == 0
    assert (libc.trims > 0) == trimmed
    after = libc.trims
    assert main(["eval", out]) == 0  # another command: no trims
    assert libc.trims == after
