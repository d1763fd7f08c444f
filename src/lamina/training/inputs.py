"""What a language-model run starts from: its tokens and its first weights.

    lm_inputs(cfg, run_path, model_cfg) -> LMInputs
        tokens: raw text (a file or folder, or the built-in corpus) encoded in memory, or a
                folder written by `lamina prepare` (recognised by its index.json), checked
                against its index and read through memory maps;
        weights: seeded (the preset), --init-from SOURCE (copied in; `finetune`), or, on a
                resume (`model_cfg` given), whatever the checkpoint restores afterwards.

The tokenizer is, in order: the run's own tokenizer.json on a resume, SOURCE's, the prepared
folder's, or one built from the spec on the text. A prepared folder whose tokenizer differs from
the one the run needs is refused (prepare it with `--tokenizer SOURCE`).

Deliberately unaware of the loop, optimizers and the command line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from lamina.checkpoint import load_state
from lamina.data.builtin import corpus_text
from lamina.data.shards import is_prepared, open_prepared
from lamina.data.tokenizers import Tokenizer, load_tokenizer
from lamina.errors import LaminaError
from lamina.models.config import GPTConfig
from lamina.training.build import build_lm, build_lm_tokens, text_fingerprint
from lamina.training.config import TrainConfig
from lamina.training.finetune import load_source, source_config, source_tokenizer
from lamina.training.tasks import LMTask


@dataclass
class LMInputs:
    task: LMTask
    model: nn.Module
    tokenizer: Tokenizer
    config: GPTConfig
    fingerprint: str
    origin: dict[str, Any] | None = None  # where --init-from started, for train_config.json
    spec: str | None = None  # a prepared folder's tokenizer spec, recorded as the run's


def lm_inputs(cfg: TrainConfig, run_path: Path | None, model_cfg: dict | None) -> LMInputs:
    tok: Tokenizer | None = None
    if run_path is not None and model_cfg and (run_path / "tokenizer.json").is_file():
        tok = load_tokenizer(run_path / "tokenizer.json")
    mc = GPTConfig.from_dict(model_cfg) if model_cfg else None
    source = None
    if cfg.init_from is not None and mc is None:
        source = load_source(cfg.init_from)
        mc = source_config(source, cfg.model_overrides)
        tok = source_tokenizer(source, cfg.tokenizer)
    if is_prepared(cfg.data):
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
                f"prepare it with `lamina prepare ... --tokenizer "
                f"{cfg.init_from or 'RUN'}`"
            )
        task, model, tok, mc = build_lm_tokens(cfg, prep.train, prep.val, prep.tokenizer, mc)
        fingerprint = prep.fingerprint
    else:
        text, _ = corpus_text(cfg.data)
        task, model, tok, mc = build_lm(cfg, text, mc, tok)
        fingerprint, spec = text_fingerprint(text), None
    if source is not None:
        load_state(model, source.model.state_dict(), f"--init-from {cfg.init_from}")
    return LMInputs(task, model, tok, mc, fingerprint, source.record if source else None, spec)
