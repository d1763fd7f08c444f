"""The training tasks, in one table: what `--task NAME` builds, and the one place a config is
read, checked and resolved.

    TASKS: name -> Task(summary, options, build, finished, ...)
    task_entry(name) -> Task                     LaminaError naming the tasks for a wrong name
    make_config(flags) -> TrainConfig            flat fields (command line, Python) split into
                                                 the shared ones and the task's options; an
                                                 option of another task is refused, naming it
    load_config(data) -> TrainConfig             a recorded train_config.json "train" object,
                                                 nested (options) or the old flat layout
    resolve(cfg, device, world_size, fsdp, micro_given, fill) -> TrainConfig
        the one place defaults are filled (config.DEFAULTS, for the task's situation), the
        fsdp rules applied (AdamW by default, Muon refused) and the micro-batch planned
    build(cfg, run_path, model_cfg) -> Built     the task's own build()
    option_fields() -> [(name, Field, options class)]   every task's own fields, for the CLI

Adding a task is one module plus one line here. The module (see lm.py, first_last.py,
classify.py) defines:
    - a frozen dataclass of the task's own fields, each made with `config.option(default,
      help, ...)` so its flag, its help and the README's list of flags come from it (a name
      another task already uses must mean the same there: it is one flag);
    - build(cfg, run_path, model_cfg) -> objectives.Built: cfg is resolved and cfg.options is
      an instance of that dataclass; model_cfg is the recorded model config on a resume (build
      the same shape) or None (a fresh, seeded model);
    - finished(out, result, objective) -> str: the lines `lamina train` prints after a run.
Then add `"name": Task("one-line summary", Options, module.build, module.finished, ...)` to
TASKS below, with encoder=True if it takes the first-last column of DEFAULTS, reads_text=False
if --data / --tokenizer mean nothing to it, fine_tunes=True if it accepts --init-from.

Deliberately unaware of the loop, checkpoints, processes and argument parsing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lamina.errors import LaminaError
from lamina.training import classify, first_last, lm, sft
from lamina.training.config import SHARED, TrainConfig, fill_defaults, plan_batch
from lamina.training.defaults import BEFORE_RECORDED, Situation
from lamina.training.device import resolve_device
from lamina.training.objectives import Built

MUON_UNDER_FSDP = (
    "--optimizer muon orthogonalizes whole matrices; --fsdp shards them: use DDP (drop --fsdp) "
    "or --optimizer adamw (a run that trained with Muon resumes under DDP)"
)


@dataclass(frozen=True)
class Task:
    summary: str  # one line for `lamina train --help`
    options: type  # the frozen dataclass of this task's own fields
    build: Callable[[TrainConfig, Path | None, dict[str, Any] | None], Built]
    finished: Callable[[str, dict[str, float], Any], str]
    encoder: bool = False  # trains the encoder classifier: DEFAULTS' first-last column
    reads_text: bool = True  # --data and --tokenizer apply
    fine_tunes: bool = False  # --init-from applies
    budget_tokenizer: bool = False  # --max-time picks the tokenizer (training/budget.py)

    def situation(self, device_type: str) -> Situation:
        """Which column of DEFAULTS applies on a device of this type."""
        if self.encoder:
            return "first-last"
        return "gpu" if device_type == "cuda" else "cpu"


TASKS: dict[str, Task] = {
    "lm": Task("next-token prediction on --data", lm.LMOptions, lm.build, lm.finished,
               fine_tunes=True, budget_tokenizer=True),
    "first-last": Task("the encoder classifier's synthetic task", first_last.FirstLastOptions,
                       first_last.build, first_last.finished, encoder=True, reads_text=False),
    "classify": Task("the encoder classifier on labelled texts (--data, default: the built-in "
                     "comedy/history/tragedy task; other defaults as first-last)",
                     classify.ClassifyOptions, classify.build, classify.finished,
                     encoder=True),
    "sft": Task("chat / instruction fine-tuning of --init-from on --data (chat or "
                "prompt-completion JSONL, Alpaca JSON): loss on the answers only",
                sft.SFTOptions, sft.build, sft.finished, fine_tunes=True),
}  # fmt: skip


def task_entry(name: str) -> Task:
    if not isinstance(name, str) or name not in TASKS:
        raise LaminaError(f"task must be one of {', '.join(TASKS)}, got {name!r}")
    return TASKS[name]


def option_fields() -> list[tuple[str, dataclasses.Field, type]]:
    """Every task's own fields, each name once (the first task that declares it)."""
    seen: dict[str, tuple[str, dataclasses.Field, type]] = {}
    for task in TASKS.values():
        for f in dataclasses.fields(task.options):
            seen.setdefault(f.name, (f.name, f, task.options))
    return list(seen.values())


def _owners(name: str) -> list[str]:
    return [t for t, e in TASKS.items() if name in {f.name for f in dataclasses.fields(e.options)}]


def make_config(flags: dict[str, Any]) -> TrainConfig:
    """A TrainConfig from flat fields (shared and the task's own) as a user gives them."""
    task = task_entry(flags.get("task", "lm"))
    name = flags.get("task", "lm")
    mine = {f.name for f in dataclasses.fields(task.options)}
    options, shared = {}, {}
    for key, value in flags.items():
        if key in mine:
            options[key] = value
        elif key in SHARED and key != "options":
            shared[key] = value
        elif _owners(key):
            raise LaminaError(
                f"--{key.replace('_', '-')} applies to --task {' / '.join(_owners(key))}, "
                f"not {name}"
            )
        else:
            raise LaminaError(f"unknown training config field {key!r}")
    if not task.reads_text:
        for key in ("data", "tokenizer"):
            if key in flags:
                raise LaminaError(
                    f"--{key} does not apply to --task {name} (its sequences are synthetic); "
                    "drop it"
                )
    return TrainConfig(**shared, options=task.options(**options))


def load_config(data: Any) -> TrainConfig:
    """A recorded config: {"options": {...}, ...} as written now, or the old flat layout (every
    task's fields side by side; another task's fields at their defaults are dropped)."""
    if not isinstance(data, dict):
        raise LaminaError("a training config must be a JSON object")
    unknown = sorted(k for k in data if k not in SHARED and not _owners(k))
    if unknown:
        raise LaminaError(f"unknown training config field(s): {', '.join(unknown)}")
    task = task_entry(data.get("task", "lm"))
    if "options" in data:
        options = data["options"] or {}
        if not isinstance(options, dict):
            raise LaminaError("a training config's options must be a JSON object")
        flat = {**{k: v for k, v in data.items() if k != "options"}, **options}
    else:  # before the registry: the classifier's fields stood beside the shared ones
        mine = {f.name for f in dataclasses.fields(task.options)}
        flat = {k: v for k, v in data.items() if k in SHARED or k in mine or not _at_default(k, v)}
    cfg = make_config({k: v for k, v in flat.items() if k not in ("data", "tokenizer")})
    cfg = cfg.replace(data=flat.get("data"), tokenizer=flat.get("tokenizer", "char"))
    older = {k: v for k, v in BEFORE_RECORDED.items() if getattr(cfg, k) is None}
    return cfg.replace(**older)  # a run recorded before these fields existed


def _at_default(name: str, value: Any) -> bool:
    for task in _owners(name):
        f = next(f for f in dataclasses.fields(TASKS[task].options) if f.name == name)
        if f.default == value:
            return True
    return False


def resolve(
    cfg: TrainConfig,
    device: str | None = None,
    *,
    world_size: int = 1,
    fsdp: bool = False,
    micro_given: bool = False,
    fill: bool = True,
) -> TrainConfig:
    """The config a run uses: the task's options checked (None: their defaults), --init-from
    and --fsdp rules applied, every None filled (fill=False: a recorded config, resumed) for the
    task and `device` (a type name; default: what cfg.device resolves to), the micro-batch
    planned for `world_size` processes."""
    task = task_entry(cfg.task)
    options = task.options() if cfg.options is None else cfg.options
    if not isinstance(options, task.options):
        raise LaminaError(
            f"--task {cfg.task} takes {task.options.__name__}, got {type(options).__name__}"
        )
    if cfg.init_from is not None and not task.fine_tunes:
        raise LaminaError(
            f"--init-from starts a language model from another; --task {cfg.task} starts fresh "
            "(give its shape with --d-model, --n-layers, ...)"
        )
    cfg = cfg.replace(options=options)
    if fsdp and cfg.optimizer == "muon":
        raise LaminaError(MUON_UNDER_FSDP)
    if fsdp and cfg.optimizer is None:
        cfg = cfg.replace(optimizer="adamw")  # Muon (the CPU default) needs whole matrices
    if fill:
        fraction_given = cfg.decay_fraction is not None
        cfg = fill_defaults(cfg, task.situation(device or resolve_device(cfg.device).type))
        if fraction_given and cfg.decay != "wsd":
            raise LaminaError(
                f"--decay-fraction shapes only --decay wsd; this run decays {cfg.decay} "
                "(add --decay wsd)"
            )
    return plan_batch(cfg, world_size, micro_given)


def build(cfg: TrainConfig, run_path: Path | None, model_cfg: dict[str, Any] | None) -> Built:
    """What the task of a resolved config trains: objective, model, tokenizer, fingerprint."""
    return task_entry(cfg.task).build(cfg, run_path, model_cfg)


def finished(cfg: TrainConfig, out: str, result: dict[str, float], objective: Any) -> str:
    """The task's closing lines for `lamina train`."""
    return task_entry(cfg.task).finished(out, result, objective)
