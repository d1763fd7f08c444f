"""Multi-process training on PyTorch's own engine: torchrun starts the processes, this joins them.

    start(device, fsdp) -> World       joins the process group torchrun describes in the
                                       environment (gloo on CPU, nccl on CUDA); one process
                                       without torchrun
    place(session, world) -> Placement the model and optimizer that train here: the session's
                                       own (one process), a DDP wrapper, or FSDP2 `fully_shard`
                                       per block + root with a fresh optimizer over the shards
                                       and a `gather` that collects the full state for
                                       `session.save_checkpoint`
    global_mean(t) ; agree(total, stop) the loop's per-step agreements (no-ops in one process)

The micro-batch for a world size is planned with the config (`config.plan_batch`, called by
`registry.resolve`); Muon under FSDP is refused there too (`registry.MUON_UNDER_FSDP`).

Batch semantics: every rank draws the same global batch and trains on its contiguous slice
(see loop.py), gradients are averaged across ranks, and the reported loss is the mean over
ranks, so per-step losses do not depend on the number of processes (with dropout 0; with
dropout each rank draws its own masks).

Checkpoints are always the single-process format: under DDP rank 0's model and optimizer are
the full state; under FSDP the sharded parameters and AdamW moments are gathered
(`DTensor.full_tensor`) into a plain copy of the model kept on rank 0, and a resume shards the
loaded full state again (`distribute_tensor`), so a run resumes under any world size.

Faults: the process group has a timeout (LAMINA_DIST_TIMEOUT seconds, default 600); a rank
that raises exits non-zero and torchrun stops the others.

Deliberately unaware of argument parsing, of launching processes and of what a step computes.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import functools
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from lamina.errors import LaminaError
from lamina.training.optim import make_optimizer
from lamina.training.session import Placement, Session

TIMEOUT_ENV = "LAMINA_DIST_TIMEOUT"


def under_torchrun() -> bool:
    """True in a process started by torchrun (it sets RANK, WORLD_SIZE and LOCAL_RANK)."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))


def active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


@dataclass
class World:
    """This process's place among the training processes (rank 0 of 1 without torchrun)."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    backend: str | None = None
    fsdp: bool = False
    origin: float = field(default_factory=time.perf_counter)

    @property
    def writer(self) -> bool:
        return self.rank == 0

    def clock(self) -> float:
        """Rank 0's clock on every rank, so decisions taken from time agree across ranks."""
        now = time.perf_counter() - self.origin
        if self.size == 1:
            return now
        t = torch.tensor([now], dtype=torch.float64, device=_comm_device())
        dist.broadcast(t, src=0)
        return float(t.item())

    def share(self, value: float) -> float:
        """Rank 0's `value` on every rank."""
        if self.size == 1:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=_comm_device())
        dist.broadcast(t, src=0)
        return float(t.item())

    def timing(self, started: float, budget: bool) -> tuple[Callable[[], float], float]:
        """(clock, start reading) for run_training: rank 0's clock when a time budget decides."""
        if self.size == 1 or not budget:
            return time.perf_counter, started
        return self.clock, self.share(started - self.origin)

    @contextlib.contextmanager
    def rank0_first(self) -> Iterator[None]:
        """Rank 0 runs the block (e.g. recovering a run directory) before the others."""
        if self.size > 1 and not self.writer:
            dist.barrier()
        yield
        if self.size > 1 and self.writer:
            dist.barrier()

    def close(self, ok: bool = True) -> None:
        """Leave the process group: after a barrier when all went well (no collective is left
        pending); at once after an error, since the other ranks may be inside a collective that
        a barrier would wrongly match; they fail on the closed connection or torchrun stops them.
        """
        if dist.is_available() and dist.is_initialized():
            if ok:
                dist.barrier()
            dist.destroy_process_group()


def _comm_device() -> torch.device:
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def start(device: str = "auto", fsdp: bool = False) -> World:
    """Join torchrun's process group, or return the one-process world outside torchrun."""
    if not under_torchrun() or int(os.environ["WORLD_SIZE"]) == 1:
        return World(fsdp=False)
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ["LOCAL_RANK"])
    cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if device == "mps":
        raise LaminaError("multi-process training runs on CPUs (gloo) or CUDA GPUs (nccl), not mps")
    if cuda:
        if local >= torch.cuda.device_count():
            raise LaminaError(
                f"local rank {local} has no GPU: this machine has {torch.cuda.device_count()}"
            )
        torch.cuda.set_device(local)
    seconds = float(os.environ.get(TIMEOUT_ENV, "600"))
    backend = "nccl" if cuda else "gloo"
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=seconds))
    world = World(rank, size, local, backend, fsdp)
    world.origin = time.perf_counter()
    t = torch.tensor([0.0], dtype=torch.float64, device=_comm_device())
    dist.broadcast(t, src=0)  # everyone is here: start the shared clock together
    return world


# -- per-step agreements ----------------------------------------------------------------------
def global_mean(t: Tensor) -> Tensor:
    """The mean of a scalar over all ranks (itself in one process)."""
    if not active():
        return t
    t = t.detach().clone().float()
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t / dist.get_world_size()


def agree(total: int, stop: bool) -> tuple[int, bool]:
    """(min of the planned step counts, any rank asked to stop): every rank ends together."""
    if not active():
        return total, stop
    t = torch.tensor([-total, int(stop)], dtype=torch.int64, device=_comm_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(-t[0]), bool(t[1])


# -- wrapping ----------------------------------------------------------------------------------
def _opt_params(opt: torch.optim.Optimizer) -> list[nn.Parameter]:
    return [p for g in opt.param_groups for p in g["params"]]


def place(s: Session, world: World) -> Placement:
    """What trains in this process: the session's model and optimizer alone, wrapped in DDP,
    or sharded with FSDP2 (world.fsdp) with a fresh optimizer over the shards and a gather
    that collects the full state for `session.save_checkpoint`. The session is not changed,
    except that under FSDP its plain model moves to the CPU (rank 0) or the meta device."""
    if world.size == 1:
        return Placement.alone(s)
    if not world.fsdp:
        from torch.nn.parallel import DistributedDataParallel as DDP

        ids = [world.local_rank] if s.device.type == "cuda" else None
        model = DDP(s.model, device_ids=ids, forward_sync_buffers=False)
        return Placement(model, s.opt, world.rank, world.size)
    return _shard(s, world)


def _shard(s: Session, world: World) -> Placement:
    from torch.distributed.fsdp import fully_shard

    from lamina.block import TransformerBlock

    plain, plain_opt = s.model, s.opt
    sharded = copy.deepcopy(plain)
    for m in list(sharded.modules()):
        if isinstance(m, TransformerBlock):
            fully_shard(m)
    fully_shard(sharded)
    opt = make_optimizer(sharded, s.cfg)
    # a resumed optimizer: shard each full moment like its parameter
    for p, q in zip(_opt_params(plain_opt), _opt_params(opt), strict=True):
        st = plain_opt.state.get(p)
        if st:
            opt.state[q] = {k: _shard_like(q, st[k]) for k in sorted(st)}  # same order on all
    sharded.no_sync = _no_sync(sharded)  # the loop's accumulation: reduce on the last micro-step
    keep: tuple[nn.Module, torch.optim.Optimizer] | None = None
    if world.writer:  # rank 0 keeps a plain copy to gather checkpoints into
        plain.to("cpu")
        keep = (plain, make_optimizer(plain, s.cfg, fused=False))
    else:
        plain.to("meta")
    plain_opt.state.clear()
    gather = functools.partial(_gather, sharded, opt, keep)
    return Placement(sharded, opt, world.rank, world.size, gather)


def _shard_like(q: Tensor, v: Any) -> Any:
    """A full optimizer-state tensor laid out like the sharded parameter `q` (others as is)."""
    from torch.distributed.tensor import distribute_tensor

    if not isinstance(v, Tensor):
        return v
    if v.dim() == 0:
        return v.clone()
    # the optimizer's own layout (zeros_like keeps FSDP's padded local storage), then the values
    out = torch.zeros_like(q)
    # every rank holds the full tensor: take the local piece, no communication
    piece = distribute_tensor(
        v.to(q.device, q.dtype), q.device_mesh, q.placements, src_data_rank=None
    )
    out.to_local().copy_(piece.to_local())
    return out


def _no_sync(model: nn.Module) -> Callable[[], contextlib.AbstractContextManager]:
    @contextlib.contextmanager
    def no_sync() -> Iterator[None]:
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)

    return no_sync


def _full(v: Any) -> Any:
    from torch.distributed.tensor import DTensor

    return v.full_tensor().cpu() if isinstance(v, DTensor) else v


def _gather(
    sharded: nn.Module,
    opt: torch.optim.Optimizer,
    keep: tuple[nn.Module, torch.optim.Optimizer] | None,
) -> tuple[nn.Module, torch.optim.Optimizer] | None:
    """The full model and AdamW state in rank 0's plain copy (`keep`); None on other ranks.

    Every rank must call it: each `full_tensor()` is a collective.
    """
    state = {k: _full(v) for k, v in sharded.state_dict().items()}
    moments = [{k: _full(v) for k, v in sorted(opt.state.get(q, {}).items())}
               for q in _opt_params(opt)]  # fmt: skip
    if keep is None:
        return None
    model, plain_opt = keep
    model.load_state_dict(state)
    osd = plain_opt.state_dict()
    osd["state"] = {i: m for i, m in enumerate(moments) if m}
    for g, live in zip(osd["param_groups"], opt.param_groups, strict=True):
        g.update({k: v for k, v in live.items() if k != "params"})
    plain_opt.load_state_dict(osd)
    return keep
