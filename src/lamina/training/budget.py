"""Defaults that depend on the budget: the tokenizer and model shape a `lamina train --max-time T`
run gets.

    TABLE: rows (least budget s, most passes over the corpus, tokenizer, model shape,
           the measurement behind it, training fields): BPE with weight decay 0.6 up to 13
           timed passes, the same with weight decay 1.5 up to 35, and dropout outside the
           attention (0.1) added up to 100, else char
    pick(max_time, corpus, rate) -> Pick(tokenizer, shape, why, train)   the first row met
    passes(max_time, corpus, rate) -> float   how often T seconds at `rate` read the corpus
    text_rate(device, dtype) -> float   bytes of text a second this machine trains the default
                                       shape on as BPE tokens (three timed forward+backwards)
    corpus_bytes(data) -> int | None   a text file's size, a folder's .txt files', the built-in
                                       corpus's (None: a prepared folder, unreadable)
    plan(given) -> (given, line | None)   `given` with the picked tokenizer, shape and
        training fields (those not given) added, and the line the command prints about it;
        unchanged (and None) unless the run is a language model from text with --max-time and
        no --tokenizer, model field, --init-from, --preset or --resume

The rows come from bench/speedrun.py (BENCHMARKS.md, "Budget-dependent defaults"). A BPE
vocabulary sees about two characters per token, so a model of the same shape reads twice the
text per step; that wins while the run reads its corpus few times, and loses once the budget
makes many passes: the 3 x 128 model then overfits BPE tokens first. What counts is the passes
the budget makes, which depend on the machine: on tinyshakespeare (1.1 MB) at 120 s a quiet AMX
Xeon trained on ~80 kB of text a second as bpe:1024 (8.6 passes; char 1.519 nats/char against
bpe:1024's 1.586), an AVX512-BF16 EPYC on ~43 kB (3.9 passes in 100 s; bpe:1024 1.534 against
char's 1.580; 120 s, 5.1 passes: 1.525 against 1.563; at 300 s, 13 passes, char 1.513 against
1.645). So the run times forward+backward passes of the default shape at a BPE vocabulary
(`text_rate`, a fraction of a second) and picks BPE while the budget's passes at that rate stay
at most the row's `passes`. The timing leaves out the optimizer step, the evaluations and the
setup, so it reads about 1.4x the rate a run achieves (1.1-1.7x on the EPYC, whose speed varies:
46-75 kB/s against 44-52). The row's 13 sits between the timed passes where BPE won and where
char did: BPE (bpe:1536, weight decay 0.6) won at 4-8 on the EPYC at 100-120 s and at 10-12 on
an AMX Xeon at 114-140 s (1.5055 / 1.5065 against char's 1.5969 / 1.5321 at 114 s, 1.5116
against 1.5481 at 140 s, each pair in one hold); char won at 16-20 on the EPYC at 300 s (against
bpe:1024 with weight decay 0.1, the row before; 10 was the bound then, which put 114 s on the
Xeon, 10.0 timed passes, on char). The row starts at 60 s: at 65 s (nanoGPT's 2,000 steps on
the quiet Xeon) bpe:1536 reached 1.5087 against char's 1.5774 (one hold). By ~4 passes the
3 x 128 model already fits its BPE text (last training batches ~2.9 nats/token against 3.46
held out), so the BPE row also raises the weight decay (a `train` field, kept unless
--weight-decay is typed): on the EPYC at 100 s, 0 1.545, 0.1 (the CPU default) 1.530-1.534,
0.3 1.522, 0.6 1.514-1.527, 1.0 1.507-1.522, 1.3 1.538, 2.0 1.564 (bpe:1024).
The row's vocabulary is bpe:1536 (2.44 characters a token): with weight decay 0.6 it beat
bpe:1024 with 0.6 in each of two holds at 100 s (1.5150 / 1.5081 against 1.5269 / 1.5248) and at
120 s (1.4984 against 1.5120); 0.8 and lr 1.5e-2 lost on top of it. The row's one model field is
rotary positions (no position table): on the AVX512-BF16 EPYC, 600 steps with learned positions
scored 1.5060 (twice, bit for bit), rotary 1.4799 in the 552 steps their ~8% dearer step buys;
at nanoGPT's wall time (107 s there) the default with rotary positions reached 1.4861 / 1.4793
against 1.5016 / 1.5029 with learned ones, each pair in one hold; exact GELU, an untied head and
batch 32 lost at 600 steps, QK-norm won 0.009 there but costs ~8% of the steps and lost on top of
rotary, as did lr 1.5e-2.

Past 13 timed passes the same recipe overfits at weight decay 0.6 (the EPYC: 1.4810 at 120 s,
1.5068 at 300 s with the BPE row's flags forced; char, the row there before, 1.5131 at 300 s and
1.5440 at 900 s, behind nanoGPT's recipe's 1.5233), so the long row keeps the tokenizer and
shape and raises the weight decay. At a fixed 1,800 steps (what 300 s buys the 3 x 128 model on
the EPYC; `--max-steps 1800 --warmup 20`, deterministic): 0.6 1.5225, 1.0 1.4833, 1.5 1.4629,
2.5 1.4802; dropout 0.1 (everywhere, weight decay 0.6) 1.4464 at 1,800 steps but its step costs
1.71x (0.58x the steps; without the attention weights' dropout, `attn_dropout` 0, 1.41x), and
weight decay 1.5 with that dropout scored 1.4708 in the 1,280 steps its cost leaves, behind 1.5
alone. At 900 s (~62 timed passes, 5,230 steps) the long row scored 1.5022 against char's 1.5440
and nanoGPT's recipe's 1.5233 (not interleaved); weight decay 3.0 1.4980 (another hold: within
the drift), a 4 x 192 model with 1.5 1.5284; past ~1,800 steps the row still overfits slowly
(its evaluations bottomed at 1.502 by step 4,203 and rose). So past 35 timed passes (between
300 s's ~22, where dropout lost at equal time, and 900 s's ~55-62) the last BPE row adds dropout
0.1 to the embeddings, residuals and feed-forward but not the attention weights
(`attn_dropout` 0 keeps SDPA's fused kernel: 0.67x the steps instead of 0.56x): at 900 s 4,401
steps scored 1.4519 (its evaluations still falling at the end), against 1.5022 without.
The long rows end at 100 timed passes (900 s on the EPYC timed ~62): beyond, nothing was
measured and the table falls back to char, which has no vocabulary to fill. The batch, warmup
and evaluations are then sized to the budget by sizing.py.

Deliberately unaware of the command line's parsing and of what a tokenizer computes.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from lamina.data.shards import is_prepared

# The probe is a speed gauge the row's passes were measured against: bpe:1024 (2.25 characters a
# token on tinyshakespeare's validation tail). bpe:1536 (2.44) reads about as much text a second
# (its wider head; timed side by side: 0.91x, within this machine's drift)
CHARS_PER_TOKEN = 2.25
PROBE_VOCAB = 1024
PROBE_ROWS = 48  # the CPU default batch, of block_size windows
PROBE_PASSES = 3  # timed forward+backwards; the fastest counts (the first pays one-off costs)


class Row(NamedTuple):
    seconds: float  # the budget is at least this
    passes: float  # the budget reads the corpus at most this many times (at text_rate)
    tokenizer: str
    shape: dict[str, Any]  # model fields over the CPU default shape ({}: that shape)
    why: str
    train: dict[str, Any] = {}  # training fields (a flag the user gave wins), e.g. weight_decay


TABLE: tuple[Row, ...] = (
    Row(
        60.0,  # the nearest measured: 65 s, BPE 1.5087 against char's 1.5774 (AMX Xeon, quiet)
        13.0,
        "bpe:1536",
        {"positions": "rope"},
        "BPE: the budget reads this corpus at most about 13 times by a timed step here; "
        "measured better than char up to 12 timed passes (4-9 real), worse from 16; bpe:1536 "
        "with weight decay 0.6 (it fits its text by then): 1.506-1.515 at 100 s against "
        "bpe:1024's 1.525-1.527, 1.498 at 120 s against 1.512; rotary positions: 1.479-1.486 "
        "at 107 s against learned positions' 1.502-1.503",
        {"weight_decay": 0.6},
    ),
    Row(
        60.0,
        35.0,
        "bpe:1536",
        {"positions": "rope"},
        "BPE with more weight decay: the budget reads this corpus more than about 13 times by "
        "a timed step here, where weight decay 0.6 overfits (1.5225 at 1,800 steps, 300 s "
        "here); 1.5 measured best of 0.6-2.5 there (1.4629), and beat dropout at equal time",
        {"weight_decay": 1.5},
    ),
    Row(
        60.0,
        100.0,
        "bpe:1536",
        {"positions": "rope", "dropout": 0.1, "attn_dropout": 0.0},
        "BPE with weight decay 1.5 and dropout outside attention: the budget reads this corpus "
        "more than about 35 times by a timed step here, where the run without dropout overfits "
        "(900 s: 1.502, its evaluations past their best); with dropout 0.1 on the embeddings, "
        "residuals and feed-forward 1.452 in the same 900 s (char: 1.544)",
        {"weight_decay": 1.5},
    ),
    Row(
        0.0,
        float("inf"),
        "char",
        {},
        "a character model: under 60 s, or where the budget reads the corpus more than about "
        "13 times by a timed step here (BPE overfits first), char measured best",
    ),
)


@dataclass(frozen=True)
class Pick:
    tokenizer: str
    shape: dict[str, Any]
    why: str
    train: dict[str, Any]


def passes(max_time: float, corpus: int | None, rate: float) -> float:
    """How many times `max_time` seconds at `rate` bytes a second read a `corpus`-byte text."""
    return float("inf") if not corpus else max_time * rate / corpus


def pick(max_time: float, corpus: int | None, rate: float) -> Pick:
    """The first TABLE row whose least budget and most passes the run meets (a corpus of
    unknown size: the last row's, char, which has no vocabulary to fill)."""
    if not corpus:
        return Pick(TABLE[-1].tokenizer, dict(TABLE[-1].shape), TABLE[-1].why, {})
    for row in TABLE:
        if max_time >= row.seconds and passes(max_time, corpus, rate) <= row.passes:
            return Pick(row.tokenizer, dict(row.shape), row.why, dict(row.train))
    return Pick("char", {}, TABLE[-1].why, {})


def text_rate(device: str = "auto", dtype: str = "auto") -> float:
    """Bytes of text a second this machine trains the default shape on as BPE tokens: the
    fastest of PROBE_PASSES timed forward+backward passes of PROBE_ROWS windows at a PROBE_VOCAB
    vocabulary, in tokens a second, times CHARS_PER_TOKEN. The global RNG is left as it was."""
    import torch
    import torch.nn.functional as F

    from lamina.models.config import GPTConfig
    from lamina.models.gpt import GPT
    from lamina.training.defaults import CPU_SHAPE
    from lamina.training.device import autocast, resolve_device, use_bf16

    dev = resolve_device(device)
    on_cpu = dev.type == "cpu"
    shape = CPU_SHAPE if on_cpu else {}
    cfg = GPTConfig.preset("char-cpu" if on_cpu else "baby", vocab_size=PROBE_VOCAB, **shape)
    bf16 = use_bf16(dtype, dev, cfg.d_model)
    with torch.random.fork_rng(devices=[] if on_cpu else [dev]):
        model = GPT(cfg).to(dev).train()
        x = torch.randint(0, PROBE_VOCAB, (PROBE_ROWS, cfg.block_size + 1), device=dev)
        best = float("inf")
        for _ in range(PROBE_PASSES):  # the first also pays one-off costs
            t0 = time.perf_counter()
            with autocast(dev, bf16):
                logits = model(x[:, :-1])
            F.cross_entropy(logits.float().flatten(0, 1), x[:, 1:].flatten()).backward()
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            best = min(best, time.perf_counter() - t0)
    return PROBE_ROWS * cfg.block_size / best * CHARS_PER_TOKEN


def _words(shape: dict[str, Any]) -> str:
    return ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in shape.items())


def corpus_bytes(data: str | None) -> int | None:
    """The corpus's size in bytes, without reading it (None where that is not a text corpus)."""
    if data is None:
        from lamina.data.builtin import builtin_root

        try:
            root = builtin_root()
        except Exception:  # noqa: BLE001 - not installed: the run refuses later, naming it
            return None
        return sum(len(f.read_bytes()) for f in root.iterdir() if f.name.endswith("_gut.txt"))
    path = Path(data).expanduser()
    if is_prepared(path):
        return None
    try:
        if path.is_dir():
            return sum(f.stat().st_size for f in path.rglob("*.txt") if f.is_file())
        return os.path.getsize(path)
    except OSError:
        return None


def plan(given: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """`given` plus the budget's tokenizer, and the line saying what was picked and why."""
    from lamina.training.registry import task_entry

    if not given.get("max_time") or not task_entry(given.get("task", "lm")).budget_tokenizer:
        return given, None
    if {"tokenizer", "init_from", "preset", "resume"} & set(given) or given.get("model_overrides"):
        return given, None  # the tokenizer and shape were measured together: both or neither
    corpus = corpus_bytes(given.get("data"))
    if corpus is None:
        return given, None
    budget = float(given["max_time"])
    if budget < min(row.seconds for row in TABLE if row.tokenizer != "char"):
        rate = 0.0  # no row but char's can apply: nothing to time
    else:
        rate = text_rate(given.get("device", "auto"), given.get("dtype", "auto"))
    chosen = pick(budget, corpus, rate)
    picked = f"--tokenizer {chosen.tokenizer}"
    out = {**given, "tokenizer": chosen.tokenizer}
    if chosen.shape:
        out["model_overrides"] = dict(chosen.shape)
        picked += ", " + _words(chosen.shape)
    train = {k: v for k, v in chosen.train.items() if k not in given}
    if train:
        out.update(train)
        picked += ", " + _words(train)
    reads = f", ~{passes(budget, corpus, rate):.1f} passes as BPE" if rate else ""
    line = (
        f"lamina train: plan for {budget:g} s on {corpus / 1e6:.2f} MB of text{reads}: "
        f"{picked} ({chosen.why}; pass --tokenizer or a model flag to choose)"
    )
    return out, line
