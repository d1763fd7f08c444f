"""Supervised fine-tuning on chats and instructions: the objective over (tokens, loss mask) rows.

    sft_rows(tokenizer, examples, block_size, train_on_prompt) -> (rows, dropped)
        each example encoded (lamina.data.instruct.encode_example) and cut to block_size + 1
        tokens; an example left with no target inside the block is dropped (counted)
    SFTObjective(train_rows, val_rows, block_size, seed, n_eval, eval_batch_size, pad_id)
    SFTOptions (LoRA's fields + train_on_prompt); build(cfg, run_path, model_cfg) -> Built;
    finished(...)   the "sft" task of the registry: --init-from MODEL --data FILE

--data is a chat / instruction file (lamina.data.instruct: {"messages"} or {"prompt",
"completion"} JSONL, Alpaca JSON); --val-data, a file in the same formats, is held out, or
else the last --val-fraction of --data's examples. Held-out rows are scored like training rows:
on the assistant / completion tokens only (every token with --train-on-prompt). The
tokenizer (and its chat template) and the model come from --init-from.

One example per row, right-padded (data.instruct.pad_rows): under causal attention no token
sees another example or a pad, so nothing needs an attention mask. `loss` is each row's mean
cross-entropy over its target tokens (assistant / completion tokens; every token with
--train-on-prompt), averaged over rows: every item weighs the same, as the loop's slicing into
micro-steps and processes assumes, so accumulation is exact. `evaluate` pools every held-out
target token ("loss" in nats per target token). A LoRA model's frozen head computes both
in chunks (chunked_ce: no full logits, the prompt tokens skipped). `draw` picks rows with its
own generator, whose state `state_dict` carries, so a resume draws the same rows.

Deliberately unaware of files, optimizers, the loop and how the model was made (LoRA or not).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lamina.data.instruct import IGNORE, Example, encode_example, pad_rows, read_examples
from lamina.errors import LaminaError
from lamina.models.config import GPTConfig
from lamina.models.gpt import GPT
from lamina.modes import eval_mode
from lamina.training.chunked_ce import frozen_head_loss, frozen_head_nll
from lamina.training.config import TrainConfig
from lamina.training.defaults import option
from lamina.training.device import check_model_fits, resolve_device
from lamina.training.finetune import load_source, source_config, source_model, source_tokenizer
from lamina.training.lm import text_fingerprint, train_window
from lamina.training.lora_option import LoRAFields, adapt, lora_base, lora_of
from lamina.training.objectives import Built, rng_state, rng_text
from lamina.validate import boolean

Row = tuple[list[int], list[bool]]


def sft_rows(
    tokenizer: Any, examples: list[Example], block_size: int, train_on_prompt: bool = False
) -> tuple[list[Row], int]:
    """Encoded rows that keep at least one target inside the block, and how many did not."""
    rows, dropped = [], 0
    for ex in examples:
        ids, mask = encode_example(tokenizer, ex, train_on_prompt)
        ids, mask = ids[: block_size + 1], mask[: block_size + 1]
        if len(ids) < 2 or not any(mask[1:]):
            dropped += 1
            continue
        rows.append((ids, mask))
    return rows, dropped


def row_losses(logits: Tensor, targets: Tensor) -> Tensor:
    """(B,) mean cross-entropy of each row over its non-IGNORE targets."""
    nll = F.cross_entropy(
        logits.float().flatten(0, 1), targets.flatten(), ignore_index=IGNORE, reduction="none"
    ).view(targets.shape)
    counts = (targets != IGNORE).sum(1).clamp(min=1)
    return nll.sum(1) / counts


class SFTObjective:
    """Chat / instruction fine-tuning: loss on the masked targets of one example per row."""

    kind = "sft"

    def __init__(
        self,
        train: list[Row],
        val: list[Row],
        block_size: int,
        seed: int,
        *,
        n_eval: int = 8,
        eval_batch_size: int = 8,
        pad_id: int = 0,
    ) -> None:
        if not train:
            raise LaminaError("no training example has a target inside the block")
        if not val:
            raise LaminaError("no held-out example: give more examples (or a larger block)")
        self.train, self.val, self.block_size, self.pad_id = train, val, block_size, pad_id
        self.gen = torch.Generator().manual_seed(seed)
        self.n_eval, self.eval_batch_size = n_eval, eval_batch_size
        self.tokens_per_item = round(sum(len(ids) - 1 for ids, _ in train) / len(train))
        self._eval: list[tuple[Tensor, Tensor]] | None = None

    def draw(self, n: int) -> tuple[Tensor, Tensor]:
        picks = torch.randint(0, len(self.train), (n,), generator=self.gen).tolist()
        return pad_rows([self.train[i] for i in picks], self.block_size, self.pad_id)

    def loss(self, model: nn.Module, batch: tuple[Tensor, ...]) -> Tensor:
        inputs, targets = batch
        fused = frozen_head_loss(model, inputs, targets, True) if isinstance(model, GPT) else None
        return row_losses(model(inputs), targets).mean() if fused is None else fused

    def eval_batches(self) -> list[tuple[Tensor, Tensor]]:
        if self._eval is None:
            rows = self.val[: self.n_eval * self.eval_batch_size]
            size = self.eval_batch_size
            self._eval = [
                pad_rows(rows[i : i + size], self.block_size, self.pad_id)
                for i in range(0, len(rows), size)
            ]
        return self._eval

    def resize_eval(self, n_eval: int, eval_batch_size: int) -> None:
        """Evaluate on `n_eval` batches of `eval_batch_size` rows (before the first)."""
        self.n_eval, self.eval_batch_size, self._eval = n_eval, eval_batch_size, None

    @torch.no_grad()
    def evaluate(self, model: nn.Module, batches: list[tuple[Tensor, ...]]) -> dict[str, float]:
        total, count = 0.0, 0
        device = next(model.parameters()).device
        with eval_mode(model):
            for inputs, targets in batches:
                inputs, targets = inputs.to(device), targets.to(device)
                nll = frozen_head_nll(model, inputs, targets) if isinstance(model, GPT) else None
                if nll is None:
                    logits = model(inputs).float()
                    nll = F.cross_entropy(
                        logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE,
                        reduction="none",
                    )  # fmt: skip
                total += float(nll.sum())
                count += int((targets != IGNORE).sum())
        return {"loss": total / max(count, 1), "target_tokens": float(count)}

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "rng": rng_text(self.gen.get_state())}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        if not isinstance(d, dict) or d.get("kind") != self.kind or "rng" not in d:
            raise LaminaError(f"the saved task state is not an sft objective's: {d!r:.80}")
        self.gen.set_state(rng_state(d["rng"]))


@dataclass(frozen=True)
class SFTOptions(LoRAFields):
    """--task sft's own fields: LoRA's, and whether the prompt is trained on too."""

    train_on_prompt: bool = option(
        False, "sft: the loss covers every token, not only the assistant / completion tokens"
    )
    val_data: str | None = option(None, "held-out examples in a file (see classify's)")

    def __post_init__(self) -> None:
        super().__post_init__()
        boolean("train_on_prompt", self.train_on_prompt)


def _read(flag: str, path: str | None) -> list[Example]:
    if path is None or not Path(path).is_file():
        raise LaminaError(
            f"--task sft needs {flag} FILE (chat / prompt-completion JSONL or Alpaca JSON)"
        )
    examples = read_examples(path)
    if examples is None:
        raise LaminaError(
            f"{flag} {path} is plain text, not chat or instruction records; train on text "
            "with --task lm"
        )
    return examples


def _examples(cfg: TrainConfig) -> tuple[list[Example], list[Example]]:
    """(training, held-out) examples: --data and --val-data, or --data's tail."""
    if cfg.init_from is None:
        raise LaminaError("--task sft fine-tunes a pretrained model: give --init-from MODEL")
    examples = _read("--data", cfg.data)
    if cfg.options.val_data is not None:
        held = _read("--val-data", cfg.options.val_data)
        if not examples or not held:
            empty = "--data" if not examples else "--val-data"
            raise LaminaError(f"{empty} holds no example")
        return examples, held
    if len(examples) < 2:
        raise LaminaError(f"--data {cfg.data} holds {len(examples)} example; give at least 2")
    n_val = max(1, round(len(examples) * cfg.val_fraction))
    return examples[:-n_val], examples[-n_val:]


def build(cfg: TrainConfig, run_path: Path | None, model_cfg: dict[str, Any] | None) -> Built:
    """The SFT objective over --data's examples and --init-from's model (adapted with --lora)."""
    train_examples, val_examples = _examples(cfg)
    source = load_source(cfg.init_from, lora_base(cfg.options))
    mc = GPTConfig.from_dict(model_cfg) if model_cfg else source_config(source, cfg.model_overrides)
    tok = source_tokenizer(source, cfg.tokenizer)
    check_model_fits(mc, resolve_device(cfg.device), lora_of(cfg.options))
    prompt = cfg.options.train_on_prompt
    window = train_window(cfg, mc)
    train, _ = sft_rows(tok, train_examples, window, prompt)
    val, _ = sft_rows(tok, val_examples, window, prompt)
    objective = SFTObjective(
        train, val, window, cfg.seed, n_eval=cfg.eval_batches,
        eval_batch_size=min(cfg.batch_size, 16), pad_id=getattr(tok, "pad_id", None) or 0,
    )  # fmt: skip
    torch.manual_seed(cfg.seed)
    model = source_model(source, mc, f"--init-from {cfg.init_from}")
    adapt(model, cfg.options)
    fingerprint = text_fingerprint(Path(cfg.data).read_text(encoding="utf-8"))
    return Built(objective, model, tok, fingerprint, mc.d_model, origin=source.record)


def finished(out: str, result: dict[str, float], objective: Any) -> str:
    """What `lamina train` prints after an SFT run."""
    return f"  chat: lamina chat {out}    sample: lamina sample {out} --chat --prompt ..."
