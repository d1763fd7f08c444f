"""`lamina count`: parameter table of a preset or config file, built on the meta device.

The count is a formula (`lamina.models.params.count_params`); the model is also built on the
meta device (no weights allocated) as a check, but only up to META_MAX_LAYERS layers: a deeper
config (e.g. a typo like --n-layers 100000000) is counted by the formula alone, since even an
empty module per layer would take gigabytes.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from lamina.cli.flags import add_config_overrides, config_overrides
from lamina.errors import LaminaError
from lamina.files import loads_json
from lamina.models.config import GPT_PRESETS, GPTConfig

META_MAX_LAYERS = 512  # deeper than any published GPT; building meta modules stays < 1 s


def config_from_args(args: argparse.Namespace) -> GPTConfig:
    if getattr(args, "config", None):
        path = Path(args.config)
        try:
            data = loads_json(path.read_text(encoding="utf-8"), str(path))
        except json.JSONDecodeError as exc:
            raise LaminaError(f"{path} is not valid JSON: {exc}") from exc
        base = GPTConfig.from_dict(data.get("model", data) if isinstance(data, dict) else data)
    else:
        base = GPTConfig.preset(args.preset)
    overrides = config_overrides(args)
    return base.replace(**overrides) if overrides else base


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "count",
        help="count parameters by component (no memory allocated)",
        description="Print a GPT's parameters by component, tied and untied totals, and the "
        "weight memory in fp32 and bf16. The model is built on the meta device and checked "
        "against the formula.",
    )
    p.add_argument(
        "preset",
        nargs="?",
        default="gpt2-small",
        choices=list(GPT_PRESETS),
        help="named shape (default: gpt2-small)",
    )
    p.add_argument("--config", metavar="FILE.json", help="read the config from a JSON file instead")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_config_overrides(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from lamina.models.params import count_module_params, count_params, gpt_param_table, meta_model

    config = config_from_args(args)
    table = gpt_param_table(config, tied=True)
    tied, untied = count_params(config, tied=True), count_params(config, tied=False)
    built = None
    if config.n_layers <= META_MAX_LAYERS:
        built = count_module_params(meta_model(config))
    if built is not None and built != count_params(config):
        raise LaminaError(f"formula {count_params(config):,} != built model {built:,}")
    n = count_params(config)
    if args.json:
        print(
            json.dumps(
                {
                    "config": config.to_dict(),
                    "components": table,
                    "tied": tied,
                    "untied": untied,
                    "meta_device": built,
                },
                indent=2,
            )
        )
        return 0
    print(f"{'component':<22}{'parameters':>16}")
    for name, count in table.items():
        if name == "head":
            count = 0 if config.tie_weights else config.vocab_size * config.d_model
            name = "head" + (" (tied)" if config.tie_weights else "")
        print(f"{name:<22}{count:>16,}")
    print(f"{'total tied':<22}{tied:>16,}")
    print(f"{'total untied':<22}{untied:>16,}")
    head = f"(this config: head {'tied' if config.tie_weights else 'untied'})"
    if built is None:
        print(f"{'meta device':<22}{'not built':>16}  (n_layers > {META_MAX_LAYERS}: formula only)")
    else:
        print(f"{'meta device':<22}{built:>16,}  {head}")
    print(f"weights: {n * 4 / 2**20:,.1f} MiB fp32, {n * 2 / 2**20:,.1f} MiB bf16")
    return 0
