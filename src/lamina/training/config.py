"""Training configuration: the shared, frozen, validated `TrainConfig`, and what None means.

    TrainConfig(...)                       how to train (data, batch, schedule, precision, output);
                                           validated when built; JSON out (to_dict); the task's
                                           own fields live in `options` (see registry.py)
    (each field is made by `defaults.option`: its help text, its default for None and its
    argparse keywords beside it, the one place `lamina train --help`, DEFAULTS and the README's
    list of flags read a field from)
    DEFAULTS                               what None means for each field, in one table (read
                                           from the fields' `none=` metadata)
    fill_defaults(cfg, where) -> TrainConfig   every None a run needs, for one Situation
    default_text(name) -> str              a field's default in words
    plan_batch(cfg, world_size, micro_given) -> TrainConfig   a micro-batch that divides

The model's shape lives in the model config (`GPTConfig` / `EncoderConfig`) and is saved beside
this one. Fields left as None are resolved at run start (`registry.resolve`, the one place) for
the task and device ("situation": a language model on a CPU, on a CUDA GPU, or the encoder
classifier's tasks), and the resolved values are what gets recorded, so a run directory always
says exactly what ran. The CPU choices (char-cpu with 3 layers and no dropout, Muon for the
blocks' matrices with AdamW for the rest, batch 48, lr 1e-2, cosine to 0.1) won 120-second runs
on tinyshakespeare on 2 cores against every other variant tried; the measurements are in
BENCHMARKS.md ("Speedrun").

Deliberately unaware of models, tensors, devices beyond their type name, files and of which
tasks exist (registry.py knows them).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from lamina.errors import LaminaError
from lamina.models.config import GPT_PRESETS
from lamina.training.defaults import (
    CPU_SHAPE,
    FINETUNE_LR,
    FINETUNE_WARMUP,
    NS_DTYPE_CPU,
    Default,
    Situation,
    eval_every_rule,
    option,
    warmup_rule,
    words,
)
from lamina.validate import (
    boolean,
    choice,
    fraction,
    non_negative_int,
    non_negative_number,
    positive_int,
    positive_number,
)

DeviceName = Literal["auto", "cpu", "cuda", "mps"]
DtypeName = Literal["auto", "fp32", "bf16"]
DecayKind = Literal["cosine", "linear", "wsd"]
OptimizerName = Literal["adamw", "muon"]
NSDtype = Literal["fp32", "bf16"]

# a real model's block_size (8,192 for SmolLM2) is far more context than a CPU step can train on
FINE_TUNE_SEQ_LEN = 256
# and one forward of it costs what a small model's whole run does: smaller batches, fewer held-out
# batches per evaluation (SmolLM2's first evaluation of 20 x 16 x 256 tokens took minutes on a CPU)
FINETUNE_BATCH = 16
FINETUNE_EVAL_BATCHES = 4


_N, _X = {"metavar": "N"}, {"metavar": "X"}


@dataclass(frozen=True)
class TrainConfig:
    """How to train. None means "choose for me": see DEFAULTS (resolved before the run starts).

    Field order matters: a default's rule sees the fields above it resolved.
    """

    task: str = option("lm", "what to train", flag=True)  # help completed by the registry
    data: str | None = option(
        None,
        "a UTF-8 text file, a folder of .txt files, or a folder written by `lamina prepare`; "
        "classify: a .csv/.tsv with a header, a .jsonl, or a folder with one subfolder of .txt "
        "files per label",
        none=Default(text="Shakespeare's complete works, built in"),
        metavar="PATH",
    )
    tokenizer: str = option(
        "char", "tokenizer spec (see the README's Tokenizers section)", metavar="SPEC"
    )
    preset: str | None = option(
        None,
        "model shape (first-last: the seed encoder's)",
        none=Default(
            "char-cpu",
            "baby",
            unless="init_from",
            note="; on a CPU also " + ", ".join(f"{k} {words(v)}" for k, v in CPU_SHAPE.items()),
        ),
        choices=list(GPT_PRESETS),
    )
    model_overrides: dict[str, Any] = option(factory=dict, flag=False)  # model config fields
    out: str | None = option(None, flag=False)  # run directory (recorded; chosen by the caller)
    max_steps: int | None = option(
        None, "optimizer steps", none=Default(2000, 2000, 300, unless="max_time"), **_N
    )
    max_time: float | None = option(
        None,
        "wall-clock budget, e.g. 90s, 5m, 1h; the learning-rate schedule is laid over it",
        metavar="DURATION",
        type=str,
    )
    batch_size: int | None = option(
        None,
        "sequences per optimizer step, all processes together",
        none=Default(48, 64, 64, finetune=FINETUNE_BATCH),
        **_N,
    )
    seq_len: int | None = option(
        None,
        "tokens per training window (the context a step trains on); the model's own "
        "block_size is kept",
        none=Default(text=f"the model's block_size, at most {FINE_TUNE_SEQ_LEN} with --init-from"),
        **_N,
    )
    micro_batch_size: int | None = option(
        None,
        "sequences per process per micro-step; accumulation = batch / micro-batch / processes",
        none=Default(rule=lambda f: f["batch_size"], text="the batch size"),
        **_N,
    )
    lr: float | None = option(
        None, "peak learning rate", none=Default(1e-2, 1e-3, 2e-3, finetune=FINETUNE_LR)
    )
    min_lr_ratio: float | None = option(
        None, "decay floor as a fraction of --lr", none=Default(0.1, 0.1, 0.05), metavar="R"
    )
    warmup: int | None = option(
        None,
        "linear warmup steps",
        none=Default(
            finetune=FINETUNE_WARMUP,
            rule=warmup_rule,
            text="100, or a tenth of the steps if that is fewer; 20 with --max-time; "
            f"{FINETUNE_WARMUP} with --init-from",
        ),
        **_N,
    )
    decay: DecayKind | None = option(
        None,
        "decay after warmup; wsd: warmup, stable at --lr, then linear to the floor over the "
        "last --decay-fraction of the steps",
        none=Default("cosine", "cosine", "linear"),
    )
    decay_fraction: float | None = option(
        None,
        "with --decay wsd, the share of the steps spent decaying, in (0, 1]",
        none=Default(0.2, 0.2, 0.2),
        metavar="F",
    )
    weight_decay: float | None = option(
        None, "weight decay on matrices", none=Default(0.1, 0.1, 0.01)
    )
    optimizer: OptimizerName | None = option(
        None,
        "adamw, or muon: Muon for the blocks' 2-D weight matrices and AdamW for embeddings, "
        "head, norms and biases",
        none=Default("muon", "adamw", "adamw", finetune="adamw", note="; adamw with --fsdp"),
    )
    muon_ns_dtype: NSDtype | None = option(
        None,
        "with --optimizer muon, the precision of its Newton-Schulz iteration",
        none=Default(
            NS_DTYPE_CPU,
            "bf16",
            NS_DTYPE_CPU,
            text="bf16 on a GPU and where the CPU has AVX512-BF16 or AMX (measured faster there: "
            "BENCHMARKS.md, Speedrun), else fp32 (bf16 is emulated there)",
        ),
    )
    embed_lr_scale: float | None = option(
        None,
        "the embedding tables' learning rate as a multiple of --lr",
        none=Default(1.0, 1.0, 1.0),
        **_X,
    )
    head_lr_scale: float | None = option(
        None,
        "an untied head's learning rate as a multiple of --lr",
        none=Default(1.0, 1.0, 1.0, note="; ignored with a tied head"),
        **_X,
    )
    beta1: float = option(0.9, flag=False)
    beta2: float | None = option(None, none=Default(0.99, 0.99, 0.999), flag=False)
    grad_clip: float | None = option(
        None, "max gradient norm, 0 = off", none=Default(1.0, 1.0, 0.0)
    )
    eval_every: int | None = option(
        None,
        "steps between evaluations",
        none=Default(
            rule=eval_every_rule,
            text="a tenth of the steps; with --max-time, at each fifth of the budget",
        ),
        **_N,
    )
    eval_batches: int | None = option(
        None,
        "held-out batches per evaluation",
        none=Default(20, 20, 20, finetune=FINETUNE_EVAL_BATCHES),
        **_N,
    )
    checkpoint_every: int | None = option(
        None, "steps between checkpoints", none=Default(text="at each evaluation"), **_N
    )
    log_every: int = option(10, "steps between plain progress lines", **_N)
    seed: int | None = option(None, "random seed", none=Default(1337, 1337, 7))
    device: DeviceName = option("auto", "auto: cuda, then mps, then cpu")
    dtype: DtypeName = option(
        "auto",
        "auto: bf16 autocast only where measured faster (GPUs; CPUs with AMX/AVX512-BF16 at "
        "width >= 128)",
    )
    compile: bool = option(False, "torch.compile the model, falling back to eager if it fails")
    activation_checkpointing: bool = option(
        False, "recompute each block's activations in the backward, not keep them: less memory "
        "for a long --seq-len, each block's forward run twice (training.recompute)",
    )  # fmt: skip
    val_fraction: float = option(
        0.1,
        "classify: the stratified, seeded share of --data held out; lm: the corpus's tail held out",
        metavar="F",
    )
    init_from: str | None = option(
        None,
        "fine-tune: start from any model lamina opens (a lamina run or model folder, a Hugging "
        "Face folder, a GGUF file: dequantized to fp32, or with --lora kept quantized as "
        "--lora-base says); its shape and tokenizer come with it, the optimizer starts fresh",
        metavar="SOURCE",
    )
    # the task's own fields: an instance of its registry entry's options class (None: its
    # defaults until the registry resolves the config)
    options: Any = option(None, flag=False)

    def __post_init__(self) -> None:
        if not isinstance(self.task, str) or not self.task:
            raise LaminaError(f"task must be a task name, got {self.task!r}")
        choice("device", self.device, ("auto", "cpu", "cuda", "mps"))
        choice("dtype", self.dtype, ("auto", "fp32", "bf16"))
        boolean("compile", self.compile)
        boolean("activation_checkpointing", self.activation_checkpointing)
        given = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        given = {k: v for k, v in given.items() if v is not None}
        for name in ("max_steps", "batch_size", "micro_batch_size", "seq_len", "eval_every",
                     "eval_batches", "checkpoint_every", "log_every"):  # fmt: skip
            if name in given:
                positive_int(name, given[name])
        for name in ("warmup", "seed"):
            if name in given:
                non_negative_int(name, given[name])
        if "seed" in given and given["seed"] >= 2**64:  # torch seeds are 64-bit
            raise LaminaError(f"seed must be in [0, 2**64), got {given['seed']}")
        for name, options in (("decay", ("cosine", "linear", "wsd")),
                              ("optimizer", ("adamw", "muon")),
                              ("muon_ns_dtype", ("fp32", "bf16"))):  # fmt: skip
            if name in given:
                choice(name, given[name], options)
        if "decay_fraction" in given:
            f = given["decay_fraction"]
            if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 < f <= 1:
                raise LaminaError(f"decay_fraction must be in (0, 1], got {f!r}")
        if isinstance(self.max_time, str):
            raise LaminaError(
                f"max_time is in seconds, got {self.max_time!r}; parse_duration reads '5m' etc."
            )
        for name in ("max_time", "lr", "embed_lr_scale", "head_lr_scale"):
            if name in given:
                positive_number(name, given[name])
        for name in ("min_lr_ratio", "val_fraction", "beta1", "beta2"):
            if name in given:
                fraction(name, given[name])
        for name in ("weight_decay", "grad_clip"):
            if name in given:
                non_negative_number(name, given[name])
        if self.batch_size is not None and self.micro_batch_size is not None:
            if self.batch_size % self.micro_batch_size:
                raise LaminaError(
                    f"batch_size {self.batch_size} is not divisible by micro_batch_size "
                    f"{self.micro_batch_size}"
                )
        if self.init_from is not None and self.preset is not None:
            raise LaminaError("--preset and --init-from both name the model; give one")
        if not isinstance(self.model_overrides, dict):
            raise LaminaError("model_overrides must be a dict of model config fields")

    def accumulation(self, world_size: int = 1) -> int:
        """Micro-steps per optimizer step: batch / (micro-batch * processes)."""
        per_step = (self.micro_batch_size or 1) * world_size
        if (self.batch_size or 1) % per_step:
            raise LaminaError(
                f"batch_size {self.batch_size} is not divisible by micro_batch_size "
                f"{self.micro_batch_size} x {world_size} processes"
            )
        return (self.batch_size or 1) // per_step

    def get(self, name: str) -> Any:
        """A shared field, or one of the task's options, by name (None when neither has it)."""
        if name in SHARED:
            return getattr(self, name)
        return getattr(self.options, name, None)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able: the shared fields, and the options as a nested object (or None)."""
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> TrainConfig:
        return dataclasses.replace(self, **changes)


SHARED = tuple(f.name for f in dataclasses.fields(TrainConfig))

# field -> what None means, from the fields' `none=` (in field order: a rule sees those above)
DEFAULTS: dict[str, Default] = {
    f.name: f.metadata["none"]
    for f in dataclasses.fields(TrainConfig)
    if f.metadata.get("none") is not None
}


def fill_defaults(cfg: TrainConfig, where: Situation) -> TrainConfig:
    """`cfg` with every None in DEFAULTS filled for situation `where` (registry.resolve picks
    it from the task and device; call that, not this)."""
    fields = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    for name, default in DEFAULTS.items():
        if fields[name] is None:
            fields[name] = default.value(where, fields)
    if where == "cpu" and cfg.preset is None and cfg.init_from is None:
        fields["model_overrides"] = {**CPU_SHAPE, **cfg.model_overrides}
    return TrainConfig(**fields)


def default_text(name: str, config: type = TrainConfig) -> str:
    """A field's default in words: from DEFAULTS, else the dataclass's own default."""
    if config is TrainConfig and name in DEFAULTS:
        return DEFAULTS[name].describe()
    f = next((f for f in dataclasses.fields(config) if f.name == name), None)
    if f is None or f.default is dataclasses.MISSING:
        raise LaminaError(f"{config.__name__} has no field {name!r} with a default")
    return words(f.default)


def _nearby(batch: int, unit: int) -> str:
    low = max(unit, batch // unit * unit)
    sizes = sorted({low, low + unit} - {batch})
    return ", ".join(str(s) for s in sizes)


def plan_batch(cfg: TrainConfig, world_size: int, micro_given: bool) -> TrainConfig:
    """`cfg` (batch_size resolved) with a micro-batch such that batch = micro x ranks x accum.

    A micro-batch the user typed must divide; one left to the default becomes the largest
    that fits (at most the recorded one).
    """
    batch = cfg.batch_size or 1
    micro = cfg.micro_batch_size or batch
    if batch % (micro * world_size) == 0:
        return cfg
    if micro_given:
        unit = micro * world_size
        raise LaminaError(
            f"--batch-size {batch} is not divisible by {world_size} processes x micro-batch "
            f"{micro} = {unit}; valid batch sizes nearby: {_nearby(batch, unit)}"
        )
    if batch % world_size:
        raise LaminaError(
            f"--batch-size {batch} is not divisible by {world_size} processes; valid batch sizes "
            f"nearby: {_nearby(batch, world_size)}"
        )
    per_rank = batch // world_size
    fit = max(m for m in range(1, min(micro, per_rank) + 1) if per_rank % m == 0)
    return cfg.replace(micro_batch_size=fit)
