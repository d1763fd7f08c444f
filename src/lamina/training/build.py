"""The pieces of a run: device, precision, and the task and model a TrainConfig names.

    resolve_device("auto") -> torch.device        cuda, then mps, then cpu
    use_bf16(dtype, device, d_model) -> bool      what --dtype auto means (see BF16_MIN_WIDTH)
    text_fingerprint(text) -> str                 length and CRC32, so a resume sees new data
    model_config_for(cfg, vocab_size) -> GPTConfig        the preset, then the overrides
    build_lm(cfg, text, model_config=None, tokenizer=None)
        -> (LMTask, GPT, Tokenizer, GPTConfig)    tokenize, split, seeded model
    build_lm_tokens(cfg, train, val, tokenizer, model_config=None)   the same from splits
                                                  already tokenized (arrays or TokenStreams)
    build_first_last(cfg, encoder_config=None)
        -> (FirstLastTask, SequenceClassifier, EncoderConfig)

`cfg` is resolved (`config.resolve_defaults`): seed, batch size and preset are set. The measured
reasons for the bf16 rule are in BENCHMARKS.md ("Training").

Deliberately unaware of the loop, checkpoints, run directories and the command line.
"""

from __future__ import annotations

import functools
import zlib
from pathlib import Path
from typing import Any

import torch

from lamina.data.corpus import encode_corpus, split_tokens
from lamina.data.spec import build_tokenizer
from lamina.data.tokenizers import Tokenizer
from lamina.errors import LaminaError
from lamina.models.config import EncoderConfig, GPTConfig
from lamina.models.encoder import SequenceClassifier
from lamina.models.gpt import GPT
from lamina.training.config import TrainConfig
from lamina.training.tasks import FirstLastTask, LMTask

# bf16 autocast pays off on CPUs only with native bf16 matrix units (AMX / AVX512-BF16) and
# only for wide enough matrices: measured slower than fp32 at 128 wide, faster at 384.
BF16_MIN_WIDTH = 256


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
    """Tokenize, split (last val_fraction held out), and build the task and a seeded model."""
    tok = tokenizer or build_tokenizer(cfg.tokenizer, text)
    train, val = split_tokens(encode_corpus(tok, text), cfg.val_fraction)
    return build_lm_tokens(cfg, train, val, tok, model_config)


def build_lm_tokens(
    cfg: TrainConfig,
    train: Any,
    val: Any,
    tok: Tokenizer,
    model_config: GPTConfig | None = None,
) -> tuple[LMTask, GPT, Tokenizer, GPTConfig]:
    """The task over tokenized splits (numpy arrays or memory-mapped TokenStreams), and a model."""
    mc = model_config or model_config_for(cfg, tok.vocab_size)
    task = LMTask(
        train,
        val,
        mc.block_size,
        cfg.seed,
        n_eval=cfg.eval_batches,
        eval_batch_size=min(cfg.batch_size, 16),  # global: same windows under any world size
    )
    torch.manual_seed(cfg.seed)
    return task, GPT(mc), tok, mc


def build_first_last(
    cfg: TrainConfig, encoder_config: EncoderConfig | None = None
) -> tuple[FirstLastTask, SequenceClassifier, EncoderConfig]:
    """The encoder classifier and its synthetic task (length 12, vocabulary 64 by default)."""
    ec = encoder_config or EncoderConfig(
        **{"vocab_size": 64, "max_len": 12, "dropout": 0.0, **cfg.model_overrides}
    )
    task = FirstLastTask(ec.max_len, ec.vocab_size, cfg.seed)
    torch.manual_seed(cfg.seed)
    return task, SequenceClassifier(ec, n_classes=2, pooling="first"), ec
