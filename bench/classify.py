"""Encoder classifier throughput: lamina vs torch.nn.TransformerEncoder at the same shape.

    python bench/classify.py [--quick] [--rounds N] [--batches N] [--threads N]

Shape: 2 post-LN layers (ReLU), 4 heads, 128 wide, feed-forward 512, dropout 0, max_len 128,
batch 32, vocabulary 1026 (bpe:1024 + pad + [CLS]), mean pooling, 3 classes. The texts are the
built-in genre task's speeches (`lamina.data.genre`) in bpe:1024 tokens, cut to 128: lengths
from 3 to 128, median about 35, so a random batch is mostly padding (as a user's data is).

Both models get the same random batches (padded to the longest text, with the padding mask) and
the same loss and optimizer (mean cross-entropy, torch AdamW). torch.nn is built as its docs
show: nn.Embedding (* sqrt(d)) + the sinusoidal table + nn.TransformerEncoder(
nn.TransformerEncoderLayer(batch_first=True), enable_nested_tensor=True or False) with
src_key_padding_mask, then the same mean pooling and linear head. Tokens/s counts real
(non-pad) tokens.

    train      forward + backward + AdamW step (torch.nn's nested-tensor path is inference-only,
               so both torch.nn variants train alike; both are run)
    infer      eval mode, torch.inference_mode: the same random batches; then the same texts in
               length-sorted batches, the order `lamina predict` uses
    predict    `lamina.training.classify.predict_proba` end to end (tokenize, sort by length,
               pad, forward, softmax) in texts/s, the same pipeline run with each model

Within a round the variants take turns on every batch (predict: every chunk of 4 batches of
texts), so load from other processes hits them alike; each variant's median round total is
reported, and the ratios are of those medians, from this one process.
Every engine runs under its own default OpenMP settings (no OMP_* variable is set here).
"""

from __future__ import annotations

import argparse  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from types import SimpleNamespace  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from machine import cpu_line as cpu_flags  # noqa: E402
from torch import nn  # noqa: E402

from lamina.data.genre import genre_task  # noqa: E402
from lamina.data.labelled import encode_texts, pad_batch  # noqa: E402
from lamina.data.spec import build_tokenizer  # noqa: E402
from lamina.embedding import sinusoidal_table  # noqa: E402
from lamina.models.config import EncoderConfig  # noqa: E402
from lamina.models.encoder import SequenceClassifier  # noqa: E402
from lamina.training.classify import predict_proba  # noqa: E402

SHAPE = dict(d_model=128, n_heads=4, d_ff=512, n_layers=2, max_len=128, batch=32)


class TorchClassifier(nn.Module):
    """torch.nn's encoder with the same embedding, pooling and head as lamina's classifier."""

    def __init__(self, vocab: int, s: dict, nested: bool) -> None:
        super().__init__()
        self.d = s["d_model"]
        self.wte = nn.Embedding(vocab, self.d, padding_idx=0)
        self.register_buffer("pe", sinusoidal_table(s["max_len"], self.d), persistent=False)
        layer = nn.TransformerEncoderLayer(
            self.d, s["n_heads"], s["d_ff"], dropout=0.0, activation="relu", batch_first=True
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.encoder = nn.TransformerEncoder(layer, s["n_layers"], enable_nested_tensor=nested)
        self.classifier = nn.Linear(self.d, 3)
        self.config = SimpleNamespace(max_len=s["max_len"])  # what predict_proba reads

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.wte(ids) * math.sqrt(self.d) + self.pe[: ids.shape[1]]
        h = self.encoder(x, src_key_padding_mask=mask)
        real = (~mask).unsqueeze(-1).to(h.dtype)
        h = torch.nan_to_num(h, 0.0)  # the nested path returns zeros at pads; be safe
        return self.classifier((h * real).sum(1) / real.sum(1))


class Padded(nn.Module):
    """lamina's classifier run through `Encoder.forward` on the padded layout (no packing)."""

    def __init__(self, clf: SequenceClassifier) -> None:
        super().__init__()
        self.clf = clf

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.clf.encoder(ids, mask)
        real = (~mask).unsqueeze(-1).to(h.dtype)
        return self.clf.classifier((h * real).sum(1) / real.sum(1))


def batches(
    seqs: list[np.ndarray], n: int, size: int, seed: int, sort: bool = False
) -> tuple[list, np.ndarray]:
    rng = np.random.default_rng(seed)
    idx = rng.choice(len(seqs), size=n * size, replace=False)
    if sort:
        idx = idx[np.argsort([len(seqs[i]) for i in idx], kind="stable")]
    out = []
    for b in range(n):
        chunk = [seqs[i] for i in idx[b * size : (b + 1) * size]]
        ids, mask = pad_batch(chunk)
        out.append((ids, mask, torch.from_numpy(rng.integers(0, 3, size))))
    return out, idx


def train_step(model: nn.Module, opt: torch.optim.Optimizer, batch: tuple) -> None:
    ids, mask, y = batch
    loss = F.cross_entropy(model(ids, mask).float(), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def infer_step(model: nn.Module, batch: tuple) -> None:
    with torch.inference_mode():
        model(batch[0], batch[1])


def timed(names: list[str], run, items: list, rounds: int) -> dict[str, float]:
    """Median over rounds of each variant's total time on `items`; the variants take turns on
    every item (in a rotating order), so load from other processes hits them alike."""
    totals: dict[str, list[float]] = {k: [] for k in names}
    for r in range(rounds + 1):  # round 0 warms up
        spent = dict.fromkeys(names, 0.0)
        for i, item in enumerate(items):
            for k in names[i % len(names) :] + names[: i % len(names)]:
                t0 = time.perf_counter()
                run(k, item)
                spent[k] += time.perf_counter() - t0
        if r:
            for k in names:
                totals[k].append(spent[k])
    return {k: statistics.median(v) for k, v in totals.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="2 rounds of 4 batches")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--batches", type=int, default=12)
    p.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    a = p.parse_args()
    if a.quick:
        a.rounds, a.batches = 2, 4
    if a.threads:
        torch.set_num_threads(a.threads)
    s = SHAPE
    print(f"{cpu_flags()}; torch {torch.__version__}, {torch.get_num_threads()} threads")
    data = genre_task()
    tok = build_tokenizer("bpe:1024", "\n".join(data.texts))
    seqs, _ = encode_texts(tok, data.texts, s["max_len"])
    vocab = tok.vocab_size + 2
    rand, _ = batches(seqs, a.batches, s["batch"], seed=0)
    sort, order = batches(seqs, a.batches, s["batch"], seed=0, sort=True)
    real = sum(int((~m).sum()) for _, m, _ in rand)
    total = sum(m.numel() for _, m, _ in rand)
    print(f"shape {s}; {a.batches} batches, {real / total:.0%} of positions real; "
          f"median of {a.rounds} rounds")  # fmt: skip

    torch.manual_seed(0)
    cfg = EncoderConfig(vocab_size=vocab, max_len=s["max_len"], d_model=s["d_model"],
                        n_heads=s["n_heads"], d_ff=s["d_ff"], n_layers=s["n_layers"], dropout=0.0)  # fmt: skip
    torch.manual_seed(0)
    padded = Padded(SequenceClassifier(cfg, 3, "mean"))
    torch.manual_seed(0)
    models = {
        "lamina": SequenceClassifier(cfg, 3, "mean"),
        "lamina padded": padded,
        "torch.nn nested": TorchClassifier(vocab, s, nested=True),
        "torch.nn plain": TorchClassifier(vocab, s, nested=False),
    }
    n_params = {k: sum(q.numel() for q in m.parameters()) for k, m in models.items()}
    del n_params["lamina padded"]
    print("parameters:", n_params)
    opts = {k: torch.optim.AdamW(m.parameters(), lr=1e-4) for k, m in models.items()}

    for m in models.values():
        m.train()
    names = list(models)
    tr = timed(names, lambda k, b: train_step(models[k], opts[k], b), rand, a.rounds)
    for m in models.values():
        m.eval()
    inf_rand = timed(names, lambda k, b: infer_step(models[k], b), rand, a.rounds)
    inf_sort = timed(names, lambda k, b: infer_step(models[k], b), sort, a.rounds)
    texts = [data.texts[i] for i in order]
    n_texts = len(texts)
    sorted_real = sum(int((~m).sum()) for _, m, _ in sort)
    pipeline = [k for k in names if k != "lamina padded"]
    chunks = [texts[i : i + 4 * s["batch"]] for i in range(0, len(texts), 4 * s["batch"])]
    pred = timed(
        pipeline, lambda k, c: predict_proba(models[k], tok, c, s["batch"]), chunks, a.rounds
    )

    def row(name: str, t: dict, count: float, unit: str) -> None:
        best = min(t["torch.nn nested"], t["torch.nn plain"])
        print(f"{name:<22}" + "".join(f"  {k} {count / v:8,.0f}" for k, v in t.items()) + f" {unit}"
              + f"   lamina / torch.nn best = {best / t['lamina']:.2f}x")  # fmt: skip

    row("train (random)", tr, real, "tok/s")
    row("infer (random)", inf_rand, real, "tok/s")
    row("infer (length-sorted)", inf_sort, sorted_real, "tok/s")
    row("predict (end to end)", pred, n_texts, "texts/s")


if __name__ == "__main__":
    main()
