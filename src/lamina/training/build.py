"""The pieces of a run: device, precision, and the task and model a TrainConfig names.

    resolve_device("auto") -> torch.device        cuda, then mps, then cpu
    use_bf16(dtype, device, d_model) -> bool      what --dtype auto means (see BF16_MIN_WIDTH)
    text_fingerprint(text) -> str                 length and CRC32, so a resume sees new data
    model_config_for(cfg, vocab_size) -> GPTConfig        the preset, then the overrides
    build_lm(cfg, text, model_config=None, tokenizer=None)
        -> (LMTask, GPT, Tokenizer, GPTConfig)    split the text by characters, tokenize each
                                                  part (cached: data.text_splits), seeded model
    build_lm_tokens(cfg, train, val, tokenizer, model_config=None, val_chars=None)  the same
                                                  from splits already tokenized (arrays or
                                                  TokenStreams); val_chars: characters scored
    make_optimizer(model, cfg, fused=None) -> the optimizer cfg names (optim.build_optimizer)
    build_first_last(cfg, encoder_config=None)
        -> (FirstLastTask, SequenceClassifier, EncoderConfig)
    first_last_bytes(encoder_config, batch_size) -> int
        a generous estimate of the memory the first-last task needs (weights + AdamW, attention
        scores and activations of a training step, the held-out batches); build_first_last
        refuses a shape over MAX_TASK_BYTES before allocating anything
    check_model_fits(config, device)             a GPT whose weights + AdamW state (16 bytes a
        parameter, counted by formula) exceed the memory of this machine (or of the GPU) is
        refused before it is built

`cfg` is resolved (`config.resolve_defaults`): seed, batch size and preset are set. The measured
reasons for the bf16 rule are in BENCHMARKS.md ("Training").

Deliberately unaware of the loop, checkpoints, run directories and the command line.
"""

from __future__ import annotations

import os
import zlib
from typing import Any

import torch

from lamina.data.text_splits import text_splits
from lamina.data.tokenizers import Tokenizer
from lamina.errors import LaminaError
from lamina.models.config import EncoderConfig, GPTConfig
from lamina.models.encoder import SequenceClassifier
from lamina.models.gpt import GPT
from lamina.models.params import count_params
from lamina.quant import native_bf16
from lamina.training.config import TrainConfig
from lamina.training.optim import build_optimizer
from lamina.training.tasks import FirstLastTask, LMTask

# bf16 autocast pays off on CPUs only with native bf16 matrix units (AMX / AVX512-BF16) and
# only for wide enough matrices: measured slower than fp32 at 128 wide, faster at 384.
BF16_MIN_WIDTH = 256

# the toy task is for seconds-to-minutes runs on a laptop: a shape needing more is a typo
MAX_TASK_BYTES = 4 * 2**30


def _mps_available() -> bool:
    return bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        return torch.device("mps" if _mps_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise LaminaError("--device cuda: no CUDA device is available")
    if name == "mps" and not _mps_available():
        raise LaminaError("--device mps: the MPS backend is not available")
    return torch.device(name)


def use_bf16(dtype: str, device: torch.device, d_model: int) -> bool:
    """Whether to train under bf16 autocast: explicit, or by `auto`'s measured rule."""
    if dtype == "fp32":
        return False
    if dtype == "bf16":
        if device.type == "cuda" and not torch.cuda.is_bf16_supported():
            raise LaminaError("--dtype bf16: this CUDA device does not support bf16")
        return True
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        return native_bf16() and d_model >= BF16_MIN_WIDTH
    return False


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


def build_lm(
    cfg: TrainConfig,
    text: str,
    model_config: GPTConfig | None = None,
    tokenizer: Tokenizer | None = None,
) -> tuple[LMTask, GPT, Tokenizer, GPTConfig]:
    """Split (the last val_fraction of the characters held out), tokenize, task, seeded model."""
    s = text_splits(cfg.tokenizer, text, cfg.val_fraction, tokenizer)
    return build_lm_tokens(cfg, s.train, s.val, s.tokenizer, model_config, s.val_chars)


def build_lm_tokens(
    cfg: TrainConfig,
    train: Any,
    val: Any,
    tok: Tokenizer,
    model_config: GPTConfig | None = None,
    val_chars: int | None = None,
) -> tuple[LMTask, GPT, Tokenizer, GPTConfig]:
    """The task over tokenized splits (numpy arrays or memory-mapped TokenStreams), and a model."""
    mc = model_config or model_config_for(cfg, tok.vocab_size)
    check_model_fits(mc, resolve_device(cfg.device))
    task = LMTask(
        train,
        val,
        mc.block_size,
        cfg.seed,
        n_eval=cfg.eval_batches,
        eval_batch_size=min(cfg.batch_size, 16),  # global: same windows under any world size
        val_chars=val_chars,
    )
    torch.manual_seed(cfg.seed)
    return task, GPT(mc), tok, mc


def make_optimizer(
    model: torch.nn.Module, cfg: TrainConfig, fused: bool | None = None
) -> torch.optim.Optimizer:
    """AdamW or MuonAdamW as `cfg` (resolved) says, with its per-group lr multipliers."""
    return build_optimizer(
        model,
        cfg.lr,
        cfg.weight_decay,
        (cfg.beta1, cfg.beta2),
        fused=fused,
        optimizer=cfg.optimizer or "adamw",
        embed_lr_scale=1.0 if cfg.embed_lr_scale is None else cfg.embed_lr_scale,
        head_lr_scale=1.0 if cfg.head_lr_scale is None else cfg.head_lr_scale,
        ns_dtype=cfg.muon_ns_dtype,
    )


def build_first_last(
    cfg: TrainConfig, encoder_config: EncoderConfig | None = None
) -> tuple[FirstLastTask, SequenceClassifier, EncoderConfig]:
    """The encoder classifier and its synthetic task (length 12, vocabulary 64 by default)."""
    ec = encoder_config or EncoderConfig(
        **{"vocab_size": 64, "max_len": 12, "dropout": 0.0, **cfg.model_overrides}
    )
    need = first_last_bytes(ec, cfg.batch_size or 64)
    if need > MAX_TASK_BYTES:
        raise LaminaError(
            f"first-last with length {ec.max_len}, vocab_size {ec.vocab_size}, batch "
            f"{cfg.batch_size}, d_model {ec.d_model}, n_layers {ec.n_layers} would need about "
            f"{need / 2**30:,.1f} GiB (limit {MAX_TASK_BYTES / 2**30:g} GiB); choose a "
            "smaller length, batch or vocabulary"
        )
    task = FirstLastTask(ec.max_len, ec.vocab_size, cfg.seed)
    torch.manual_seed(cfg.seed)
    return task, SequenceClassifier(ec, n_classes=2, pooling="first"), ec


def first_last_bytes(ec: EncoderConfig, batch_size: int, n_eval: int = 16) -> int:
    """Bytes the first-last task needs, over-estimated (fp32, AdamW, saved activations)."""
    length, d = ec.max_len, ec.d_model
    params = ec.vocab_size * d + length * d + ec.n_layers * (4 * d * d + 2 * d * ec.d_ff)
    weights = params * 4 * 4  # weights, gradients, two AdamW moments
    scores = batch_size * ec.n_heads * length * length * 4 * 3 * ec.n_layers  # kept for backward
    acts = batch_size * length * (8 * d + 2 * ec.d_ff) * 4 * ec.n_layers
    held = n_eval * 256 * length * 8 + 256 * ec.n_heads * length * length * 4 * 2  # eval batches
    return weights + scores + acts + held


def memory_bytes(device: torch.device) -> int | None:
    """Total memory of `device` (a CUDA GPU's, else this machine's RAM); None if unknown."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return None


def check_model_fits(config: GPTConfig, device: torch.device) -> None:
    """Refuse a GPT whose fp32 weights, gradients and AdamW moments exceed `device`'s memory."""
    n = count_params(config)
    need, have = n * 16, memory_bytes(device)
    if have is not None and need > have:
        raise LaminaError(
            f"a GPT of {n:,} parameters (d_model {config.d_model}, n_layers {config.n_layers}, "
            f"vocab_size {config.vocab_size}, block_size {config.block_size}) needs about "
            f"{need / 2**30:,.1f} GiB to train (weights, gradients, AdamW) but {device} has "
            f"{have / 2**30:,.1f} GiB; choose a smaller shape"
        )
