"""Where a native one-row decode step's time goes, and A/B of one decode.c switch, in one process.

    PYTHONPATH=src python bench/step_profile.py GGUF [GGUF ...] [--switch lm_kq_wide]
        [--values 0,1,2] [--threads 1,2] [--length 576] [--steps 20] [--rounds 4]

Opens each file as `lamina chat` does (`lamina.open`, blocks kept quantized), makes one cache
row of length + 8 slots and, per round, for every (threads, switch value) pair in turn:
  * times `NativeStep.step` (one token, batch 1) at cache fill --length;
  * times each linear role (every block's qkv, proj, fc, out, then the head) as one native
    call per layer (`lm_linear`, one input row), all layers in turn so that the weights stream
    from memory as in a step: a role's figure is the sum over its layers.
The step less the linears is attention, norms, the embedding and barriers (plus the linears'
own call overhead, a few microseconds a call, counted against the linears here). The switch is
one of decode.c's `int lm_X(int choice)` functions (lm_kq_wide, lm_act8, lm_pf_l2), set before
each timing and restored at the end. Best of the rounds per figure; bytes are the tensors each
role reads (weights, scales, biases) and GB/s those bytes over the role's time.
Torch's threads are set with torch.set_num_threads (this process only).
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import time
from collections import Counter
from pathlib import Path

import torch
from machine import cpu_line

ROLES = (("qkv", "attn.qkv"), ("proj", "attn.proj"), ("fc", "ff.fc"), ("out", "ff.proj"))


def kinds(m: torch.nn.Module) -> str:
    parts = getattr(m, "parts", None)
    if parts:
        return "+".join(q for q, _ in parts)
    return type(m).__name__


def roles(model) -> list[tuple[str, list[torch.nn.Module]]]:
    out = []
    for name, path in ROLES:
        mods = []
        for block in model.blocks:
            m = block
            for part in path.split("."):
                m = getattr(m, part)
            mods.append(m)
        out.append((name, mods))
    out.append(("head", [model.head]))
    return out


def timed_step(engine, caches, length: int, steps: int, nt: int) -> float:
    for c in caches:
        c.pos = length
    engine.step([17], [length], [0], threads=nt)
    t0 = time.perf_counter()
    for _ in range(steps):
        for c in caches:
            c.pos = length
        engine.step([17], [length], [0], threads=nt)
    return (time.perf_counter() - t0) / steps


def timed_role(lib, items, reps: int, nt: int) -> float:
    fn = lib.lm_linear
    t0 = time.perf_counter()
    for _ in range(reps):
        for L, x, y in items:
            fn(ctypes.addressof(L), 1, x.data_ptr(), y.data_ptr(), nt)
    return (time.perf_counter() - t0) / reps


def profile_file(path: str, args, lib, switch, values: list[int], threads: list[int]) -> None:
    import lamina
    from lamina import native
    from lamina.native.pointers import Pointers

    model = lamina.open(path).model.eval()
    caches = model.make_caches(1, args.length + 8)
    engine = native.native_step(model, caches)
    if engine is None:
        raise SystemExit(f"the native step does not cover {path}")
    groups = [] if args.no_roles else roles(model)
    ptrs = Pointers()
    calls = []  # per role: its name, [(Lin, x, y)], bytes, kinds, shape
    for name, mods in groups:
        nbytes0 = sum(t.numel() * t.element_size() for t in ptrs.keep)
        items = []
        for m in mods:
            items.append(
                (ptrs.lin(m), torch.randn(1, m.in_features), torch.empty(1, m.out_features))
            )
        nbytes = sum(t.numel() * t.element_size() for t in ptrs.keep) - nbytes0
        desc = Counter(kinds(m) for m in mods)
        calls.append((name, items, nbytes, desc, f"{mods[0].out_features}x{mods[0].in_features}"))
    best: dict[tuple[int, int, str], float] = {}
    with torch.no_grad():
        for _ in range(args.rounds):
            for nt in threads:
                torch.set_num_threads(nt)
                for v in values:
                    if switch(v) != v:
                        continue
                    t = timed_step(engine, caches, args.length, args.steps, nt)
                    best[(nt, v, "step")] = min(best.get((nt, v, "step"), t), t)
                    for name, items, *_ in calls:
                        t = timed_role(lib, items, max(1, args.steps // 4), nt)
                        best[(nt, v, name)] = min(best.get((nt, v, name), t), t)
    print(f"\n{Path(path).name}")
    if calls:
        print("| role | kinds (layers) | shape | MB read |")
        print("|---|---|---|---:|")
        for name, _, nbytes, desc, shape in calls:
            d = ", ".join(f"{k} x{n}" for k, n in desc.items())
            print(f"| {name} | {d} | {shape} | {nbytes / 1e6:.1f} |")
    head = "| threads | value | step ms | tok/s |"
    head += "".join(f" {n} ms (GB/s) |" for n, *_ in calls)
    print(head + (" linears ms | rest ms |" if calls else ""))
    print("|---:" * (head.count("|") - 1 + (2 if calls else 0)) + "|")
    for nt in threads:
        for v in values:
            if (nt, v, "step") not in best:
                continue
            s = best[(nt, v, "step")]
            row = f"| {nt} | {v} | {1e3 * s:.2f} | {1 / s:.1f} |"
            lin = 0.0
            for name, _, nbytes, *_ in calls:
                t = best[(nt, v, name)]
                lin += t
                row += f" {1e3 * t:.2f} ({nbytes / t / 1e9:.1f}) |"
            if calls:
                row += f" {1e3 * lin:.2f} | {1e3 * (s - lin):.2f} |"
            print(row)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("gguf", nargs="+")
    ap.add_argument("--switch", default="lm_kq_wide")
    ap.add_argument("--values", default="0,1,2")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--length", type=int, default=576)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--no-roles", action="store_true", help="time the whole step only")
    args = ap.parse_args()
    import lamina.native.structs  # noqa: F401  (declares the structs the build checks)
    from lamina.native.build import library

    lib = library()
    if lib is None:
        raise SystemExit("the native library does not build here")
    switch = getattr(lib, args.switch)
    values = [int(v) for v in args.values.split(",")]
    threads = [int(t) for t in args.threads.split(",")]
    before = switch(-1)
    print(cpu_line())
    print(
        f"torch {torch.__version__}; switch {args.switch} (default {before}); cache fill "
        f"{args.length}; best of {args.rounds} rounds of {args.steps} steps"
    )
    try:
        for path in args.gguf:
            profile_file(path, args, lib, switch, values, threads)
    finally:
        switch(before)
    return 0


if __name__ == "__main__":
    sys.exit(main())
