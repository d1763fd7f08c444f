"""The shapes of the JSON files a run directory holds, for `lamina.schema.check`.

    METRIC          one line of metrics.jsonl
    RUN_CONFIG      train_config.json (its "train" fields are TrainConfig's to check)
    TRAINER_STATE   trainer_state.json
    OPTIMIZER_META  optimizer.json

`run_dir` reads every one of them through these; `lamina plot` reads metrics through
`RunDir.read_metrics`. Deliberately only shapes: what the fields mean is their readers'.
"""

from __future__ import annotations

from lamina.schema import Any_, Arr, Int, Map, Maybe, Num, Obj, Str

# one line of metrics.jsonl: a step, and (what readers use) losses that are finite or null
METRIC = Obj(
    {"step": Int(0)},
    optional={
        "loss": Maybe(Num()),
        "val_loss": Maybe(Num()),
        "val_loss_per_char": Maybe(Num()),
        "elapsed": Maybe(Num(0)),
        "lr": Maybe(Num()),
        "tokens": Maybe(Int(0)),
    },
)
RUN_CONFIG = Obj(
    {"train": Map(Any_())},
    optional={
        "model": Maybe(Map(Any_())),
        "data_fingerprint": Maybe(Str()),
        "command": Arr(Str()),
        "lamina": Str(),
        "init_from": Map(Any_()),
    },
)
# trainer_state.json and optimizer.json as far as RunDir reads them (which fields a checkpoint
# must hold is the session's business: it names a missing one)
TRAINER_STATE = Obj(
    {"step": Int(0)},
    optional={
        "tokens_seen": Int(0),
        "torch_rng": Str(),
        "task": Map(Any_()),
        "seconds_used": Num(0),
        "cuda_rng": Maybe(Arr(Str())),
        "data_fingerprint": Maybe(Str()),
        "lamina": Str(),
    },
)
GROUP = Obj(
    {"params": Arr(Int(0)), "lr": Num(0)},
    optional={
        "betas": Arr(Num(0, 1), 2, 2),
        "weight_decay": Num(0),
        "eps": Num(0),
        "momentum": Num(0),
        "ns_steps": Int(0),
        "lr_scale": Num(0),
        "kind": Str(),
    },
)
OPTIMIZER_META = Obj(
    {}, optional={"param_groups": Arr(GROUP), "scalars": Map(Map(Num()), int_keys=True)}
)
