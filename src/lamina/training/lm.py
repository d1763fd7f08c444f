"""The language-model task ("lm"): next-token prediction on a corpus, from scratch or --init-from.

    LMOptions                 this task's own fields (none yet: it reads the shared ones)
    build(cfg, run_path, model_cfg) -> Built
        tokens: raw text (a file or folder, or the built-in corpus) encoded in memory, or a
                folder written by `lamina prepare` (recognised by its index.json), checked
                against its index and read through memory maps;
        weights: seeded (the preset), --init-from SOURCE (copied in; `finetune`), or, on a
                resume (`model_cfg` given), whatever the checkpoint restores afterwards.
    train_loss(model, x, y) -> the loss a training step backpropagates (a frozen head's fused)
    eval_nll(model, x, y) -> each position's nll, no gradient (a frozen head's in chunks)
    LMObjective(train, val, block_size, seed, n_eval, eval_batch_size, val_chars)
        the loop's objective over windows of a token array (WindowSampler; validation batches
        from the held-out tail)
    model_config_for(cfg, vocab_size) -> GPTConfig     the preset, then the overrides
    text_fingerprint(text) -> str                      length and CRC32 of the corpus
    finished(out, result, objective) -> str            what `lamina train` prints after a run

The tokenizer is, in order: the run's own tokenizer.json on a resume, SOURCE's, the prepared
folder's, or the one `--tokenizer SPEC` names (`lamina.data.spec.build_tokenizer`: a kind fit on
the training text, or a saved tokenizer.json / run folder). A prepared folder whose tokenizer
differs from the one the run needs is refused (prepare it with `--tokenizer SOURCE`).

Given `val_chars` (the characters the validation tokens cover), the objective's evaluation adds
"loss_per_char": the batches' mean loss per token x (val tokens - 1) / val_chars, an estimate of
nats per character over the whole validation text (exact for a char tokenizer, where the ratio
is 1; `lamina eval` computes it exactly). Over two or more windows it adds the standard error of
the mean ("loss_se", "loss_per_char_se"), so a sampled evaluation says how sure it is.

Deliberately unaware of the loop, optimizers and the command line.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lamina.data.builtin import corpus_text
from lamina.data.shards import eval_batches_for, is_prepared, open_prepared, sampler_for
from lamina.data.text_splits import text_splits
from lamina.errors import LaminaError
from lamina.models.config import GPTConfig
from lamina.models.gpt import GPT
from lamina.tokenizers.kinds import Tokenizer, load_tokenizer
from lamina.training.chunked_ce import frozen_head_loss, frozen_head_nll
from lamina.training.config import FINE_TUNE_SEQ_LEN, TrainConfig
from lamina.training.device import check_model_fits, resolve_device
from lamina.training.finetune import load_source, source_config, source_model, source_tokenizer
from lamina.training.lora_option import LoRAFields, adapt, check_lora_source, lora_base, lora_of
from lamina.training.objectives import Batch, Built


@dataclass(frozen=True)
class LMOptions(LoRAFields):
    """The language-model task's own fields: LoRA's (data, tokenizer, init_from are shared)."""


def lm_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean cross-entropy of logits (B, T, V) against targets (B, T), computed in fp32."""
    return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def train_loss(model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    """The training loss: through a frozen head (LoRA) without keeping logits
    (`chunked_ce.frozen_head_loss`), else `lm_loss` of the model's logits."""
    fused = frozen_head_loss(model, x, y) if isinstance(model, GPT) else None
    return lm_loss(model(x), y) if fused is None else fused


def eval_nll(model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    """Each position's nll (B, T), no gradient: through a frozen head in chunks where the
    model has one (`chunked_ce.frozen_head_nll`: no full logits), else from the logits."""
    nll = frozen_head_nll(model, x, y) if isinstance(model, GPT) else None
    if nll is not None:
        return nll
    logits = model(x).float()
    return F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view(y.shape)


class LMObjective:
    """Next-token prediction on random windows of `train` tokens; eval on windows of `val`."""

    def __init__(
        self,
        train: np.ndarray | Any,
        val: np.ndarray | Any,
        block_size: int,
        seed: int,
        *,
        n_eval: int = 20,
        eval_batch_size: int = 16,
        val_chars: int | None = None,
    ) -> None:
        for name, split in (("training", train), ("validation", val)):
            if len(split) < block_size + 1:
                raise LaminaError(
                    f"the {name} split has {len(split)} tokens, fewer than block_size + 1 = "
                    f"{block_size + 1}; use more data or a smaller --block-size"
                )
        self.train, self.val, self.block_size = train, val, block_size
        self.sampler = sampler_for(train, block_size, seed=seed)  # a TokenStream reads shards
        self.n_eval, self.eval_batch_size = n_eval, eval_batch_size
        self.tokens_per_item = block_size
        self._eval: list[Batch] | None = None
        # nats/char = nats/token x predicted tokens / their characters (None: unknown)
        self.chars_ratio = (len(val) - 1) / val_chars if val_chars else None

    def draw(self, n: int) -> Batch:
        return self.sampler.windows(self.sampler.starts(n))

    def loss(self, model: nn.Module, batch: Batch) -> Tensor:
        return train_loss(model, *batch)

    def eval_batches(self) -> list[Batch]:
        if self._eval is None:
            self._eval = eval_batches_for(
                self.val, self.block_size, self.eval_batch_size, self.n_eval, seed=1234
            )
        return self._eval

    def resize_eval(self, n_eval: int, eval_batch_size: int) -> None:
        """Evaluate on `n_eval` batches of `eval_batch_size` windows (before the first)."""
        self.n_eval, self.eval_batch_size, self._eval = n_eval, eval_batch_size, None

    @torch.no_grad()
    def evaluate(self, model: nn.Module, batches: list[Batch]) -> dict[str, float]:
        """The mean loss per window and, over two or more windows, its standard error."""
        rows = [eval_nll(model, x, y).mean(1) for x, y in batches]
        losses = torch.cat(rows).double()
        out = {"loss": float(losses.mean())}
        if len(losses) > 1:
            out["loss_se"] = float(losses.std() / math.sqrt(len(losses)))
        if self.chars_ratio is not None:
            out |= {f"loss_per_char{k[4:]}": v * self.chars_ratio for k, v in out.items()}
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"sampler": self.sampler.state_dict()}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.sampler.load_state_dict(d["sampler"])


def text_fingerprint(text: str) -> str:
    """A short checksum of the corpus, so a resume can tell the data changed."""
    return f"{len(text)}:{zlib.crc32(text.encode('utf-8', errors='surrogatepass')):08x}"


def model_config_for(cfg: TrainConfig, vocab_size: int) -> GPTConfig:
    """The preset (char-cpu if none), then `cfg.model_overrides`, with the tokenizer's vocab."""
    given = cfg.model_overrides.get("vocab_size", vocab_size)
    if given != vocab_size:
        raise LaminaError(f"vocab_size {given} does not match the tokenizer's {vocab_size}")
    fields: dict[str, Any] = {**cfg.model_overrides, "vocab_size": vocab_size}
    return GPTConfig.preset(cfg.preset or "char-cpu").replace(**fields)


def train_window(cfg: TrainConfig, mc: GPTConfig) -> int:
    """Tokens per training window: --seq-len, else the model's block_size (at most
    FINE_TUNE_SEQ_LEN when fine-tuning a source)."""
    if cfg.seq_len is not None:
        if cfg.seq_len > mc.block_size:
            raise LaminaError(
                f"--seq-len {cfg.seq_len} is longer than the model's block_size {mc.block_size}"
            )
        return cfg.seq_len
    return min(mc.block_size, FINE_TUNE_SEQ_LEN) if cfg.init_from else mc.block_size


def objective_and_model(
    cfg: TrainConfig,
    train: Any,
    val: Any,
    tok: Tokenizer,
    model_config: GPTConfig | None = None,
    val_chars: int | None = None,
    source: Any = None,
) -> tuple[LMObjective, GPT]:
    """The objective over tokenized splits (arrays or memory-mapped TokenStreams), and a GPT:
    seeded random weights, or, given an --init-from `source`, built on the meta device and
    given the source's tensors (no random draw, no second copy)."""
    mc = model_config or model_config_for(cfg, tok.vocab_size)
    check_model_fits(mc, resolve_device(cfg.device), lora_of(cfg.options))
    objective = LMObjective(
        train,
        val,
        train_window(cfg, mc),
        cfg.seed,
        n_eval=cfg.eval_batches,
        eval_batch_size=min(cfg.batch_size, 16),  # global: same windows under any world size
        val_chars=val_chars,
    )
    torch.manual_seed(cfg.seed)
    if source is None:
        return objective, GPT(mc)
    return objective, source_model(source, mc, f"--init-from {cfg.init_from}")


def _prepared(
    cfg: TrainConfig, tok: Tokenizer | None, mc: GPTConfig | None, source: Any = None
) -> Built:
    """A `lamina prepare` folder: its tokenizer and splits, checked against the run's."""
    prep = open_prepared(cfg.data)
    spec = prep.index.get("spec")
    if cfg.tokenizer not in ("char", spec):  # "char" is also what an unset flag reads
        raise LaminaError(
            f"--tokenizer {cfg.tokenizer} disagrees with --data {cfg.data}, prepared with "
            f"{spec}; the tokenizer comes with prepared data"
        )
    if tok is not None and tok.to_dict() != prep.tokenizer.to_dict():
        raise LaminaError(
            f"--data {cfg.data} was prepared with another tokenizer than this run's; "
            f"prepare it with `lamina prepare ... --tokenizer {cfg.init_from or 'RUN'}`"
        )
    objective, model = objective_and_model(
        cfg, prep.train, prep.val, prep.tokenizer, mc, source=source
    )
    recorded = {"tokenizer": spec} if spec is not None else None  # what the folder used
    return Built(objective, model, prep.tokenizer, prep.fingerprint, model.config.d_model,
                 recorded=recorded)  # fmt: skip


def build(cfg: TrainConfig, run_path: Path | None, model_cfg: dict[str, Any] | None) -> Built:
    """The objective and model a resolved config names (see the module docstring)."""
    tok: Tokenizer | None = None
    if run_path is not None and model_cfg and (run_path / "tokenizer.json").is_file():
        tok = load_tokenizer(run_path / "tokenizer.json")
    mc = GPTConfig.from_dict(model_cfg) if model_cfg else None
    source = None
    check_lora_source(cfg.options, cfg.init_from)
    # a LoRA run's checkpoint holds only adapters: its base is opened again on a resume
    if cfg.init_from is not None and (mc is None or lora_of(cfg.options) is not None):
        source = load_source(cfg.init_from, lora_base(cfg.options))
        mc = mc or source_config(source, cfg.model_overrides)
        tok = tok or source_tokenizer(source, cfg.tokenizer)
    if is_prepared(cfg.data):
        built = _prepared(cfg, tok, mc, source)
    else:
        text, _ = corpus_text(cfg.data)
        s = text_splits(cfg.tokenizer, text, cfg.val_fraction, tok)
        objective, model = objective_and_model(
            cfg, s.train, s.val, s.tokenizer, mc, s.val_chars, source
        )
        built = Built(objective, model, s.tokenizer, text_fingerprint(text), model.config.d_model)
    if source is not None:
        built.origin = source.record
    adapt(built.model, cfg.options)
    return built


def finished(out: str, result: dict[str, float], objective: Any) -> str:
    """What `lamina train` prints after a language model's run, beside the validation line."""
    return f"  sample: lamina sample {out}    evaluate: lamina eval {out}"
