"""Resolve a TrainConfig into concrete choices, and build the data, task and model it names.

    resolve_device("auto") -> torch.device        cuda, then mps, then cpu
    use_bf16(dtype, device, d_model) -> bool      what --dtype auto means (see BF16_MIN_WIDTH)
    load_text(cfg) -> (text, source name)         --data, or the built-in corpus
    resolve_defaults(cfg, n_chars, device) -> TrainConfig with no None left that matters
    build_lm(cfg, text, model_config=None) -> (task, model, tokenizer)
    build_first_last(cfg, encoder_config=None) -> (task, model)

Defaults are chosen for the data and the budget: on a CPU the `char-cpu` shape without
dropout trains fastest to a given loss in minutes; on a GPU, `baby`. The measured reasons are
in BENCHMARKS.md ("Training").

Deliberately unaware of the loop, checkpoints and the command line.
"""

from __future__ import annotations

import functools
import zlib
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lamina.data.corpus import encode_corpus, load_corpus, split_tokens
from lamina.data.spec import build_tokenizer
from lamina.data.tokenizers import Tokenizer
from lamina.errors import LaminaError
from lamina.models.config import EncoderConfig, GPTConfig
from lamina.models.encoder import SequenceClassifier
from lamina.models.gpt import GPT
from lamina.training.config import TrainConfig
from lamina.training.corpus import BUILTIN_NAME, builtin_corpus
from lamina.training.tasks import FirstLastTask, LMTask

# bf16 autocast pays off on CPUs only with native bf16 matrix units (AMX / AVX512-BF16) and
# only for wide enough matrices: measured slower than fp32 at 128 wide, faster at 384.
BF16_MIN_WIDTH = 256


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise LaminaError("--device cuda: no CUDA device is available")
    if name == "mps" and not (
        getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()
    ):
        raise LaminaError("--device mps: the MPS backend is not available")
    return torch.device(name)


@functools.lru_cache(maxsize=1)
def cpu_has_fast_bf16() -> bool:
    """True where the CPU multiplies bf16 matrices natively (AMX-BF16 or AVX512-BF16)."""
    try:
        flags = Path("/proc/cpuinfo").read_text(errors="ignore").split()
    except OSError:
        flags = []
    native = "amx_bf16" in flags or "avx512_bf16" in flags
    try:
        native = native and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        pass
    return native


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
        return cpu_has_fast_bf16() and d_model >= BF16_MIN_WIDTH
    return False


def load_text(cfg: TrainConfig) -> tuple[str, str]:
    """The corpus text and a name for it (the path, or the built-in corpus)."""
    if cfg.data is None:
        return builtin_corpus(), BUILTIN_NAME
    return load_corpus(cfg.data), str(cfg.data)


def text_fingerprint(text: str) -> str:
    """A short checksum of the corpus, so a resume can tell the data changed."""
    return f"{len(text)}:{zlib.crc32(text.encode('utf-8', errors='surrogatepass')):08x}"


def resolve_defaults(cfg: TrainConfig, device: torch.device) -> TrainConfig:
    """Fill every None that a run needs with the default for this task, device and budget."""
    c = cfg
    if c.task == "first-last":  # the seed encoder's recipe
        defaults: dict[str, Any] = dict(
            batch_size=64,
            lr=2e-3,
            weight_decay=0.01,
            beta2=0.999,
            grad_clip=0.0,
            decay="linear",
            min_lr_ratio=0.05,
            seed=7,
        )
        steps = 300
    else:
        gpu = device.type == "cuda"
        # CPU defaults measured on tinyshakespeare with --max-time 89s (2 cores): batch 12,
        # lr 5e-3 and 3 layers gave validation loss 1.863; batch 16, lr 3e-3, 4 layers 1.954.
        defaults = dict(
            preset="baby" if gpu else "char-cpu",
            batch_size=64 if gpu else 12,
            lr=1e-3 if gpu else 5e-3,
            weight_decay=0.1,
            beta2=0.99,
            grad_clip=1.0,
            decay="cosine",
            min_lr_ratio=0.1,
            seed=1337,
        )
        steps = 2000
    changes = {k: v for k, v in defaults.items() if getattr(c, k) is None}
    if c.task != "first-last" and c.preset is None and device.type != "cuda":
        # short CPU runs: more steps in the budget beat a fourth layer (see the figures above)
        changes["model_overrides"] = {"n_layers": 3, "dropout": 0.0, **c.model_overrides}
    changes["max_steps"] = c.max_steps if (c.max_steps or c.max_time) else steps
    changes["batch_size"] = c.batch_size or defaults["batch_size"]
    changes["micro_batch_size"] = c.micro_batch_size or changes["batch_size"]
    steps = changes["max_steps"]
    if c.warmup is None:  # a time budget on a CPU fits a few hundred steps: warm up briefly
        changes["warmup"] = min(100, steps // 10) if steps else 20
    if c.eval_every is None and steps:
        changes["eval_every"] = max(1, steps // 10)
    resolved = c.replace(**changes)
    resolved.accumulation()  # validates divisibility
    return resolved


def model_config_for(cfg: TrainConfig, vocab_size: int, device: torch.device) -> GPTConfig:
    """The preset, then the overrides (`resolve_defaults` adds 3 layers, dropout 0 on a CPU)."""
    base = GPTConfig.preset(cfg.preset or "char-cpu")
    fields: dict[str, Any] = {"vocab_size": vocab_size}
    fields.update(cfg.model_overrides)
    if "vocab_size" in cfg.model_overrides and cfg.model_overrides["vocab_size"] != vocab_size:
        raise LaminaError(
            f"vocab_size {cfg.model_overrides['vocab_size']} does not match the tokenizer's "
            f"{vocab_size}"
        )
    return base.replace(**fields)


def build_lm(
    cfg: TrainConfig,
    text: str,
    device: torch.device,
    model_config: GPTConfig | None = None,
    tokenizer: Tokenizer | None = None,
) -> tuple[LMTask, GPT, Tokenizer, GPTConfig]:
    """Tokenize, split (last val_fraction held out), and build the task and a seeded model."""
    tok = tokenizer or build_tokenizer(cfg.tokenizer, text)
    tokens = encode_corpus(tok, text)
    train, val = split_tokens(tokens, cfg.val_fraction)
    mc = model_config or model_config_for(cfg, tok.vocab_size, device)
    task = LMTask(
        train,
        val,
        mc.block_size,
        cfg.seed,
        n_eval=cfg.eval_batches,
        eval_batch_size=min(cfg.batch_size, 16),  # global: same windows under any world size
    )
    torch.manual_seed(cfg.seed)
    model = GPT(mc)
    return task, model, tok, mc


def build_first_last(
    cfg: TrainConfig, encoder_config: EncoderConfig | None = None
) -> tuple[FirstLastTask, nn.Module, EncoderConfig]:
    """The encoder classifier and its synthetic task (length 12, vocabulary 64 by default)."""
    fields = {"vocab_size": 64, "max_len": 12, "dropout": 0.0}
    fields.update(cfg.model_overrides)
    ec = encoder_config or EncoderConfig(**fields)
    task = FirstLastTask(ec.max_len, ec.vocab_size, cfg.seed)
    torch.manual_seed(cfg.seed)
    return task, SequenceClassifier(ec, n_classes=2, pooling="first"), ec
